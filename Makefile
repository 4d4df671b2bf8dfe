# The two set-up commands of the README: `make demo` and `make test`.
# Both create a project-local virtual environment (.venv) and install
# lingshard with what they need into it.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo smoke test lint install clean
export TF_CPP_MIN_LOG_LEVEL ?= 2

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -e '.[test,spmd]'
	touch $(STAMP)

install: $(STAMP)

# Prepares the real multilingual corpus, trains the CPU-sized M4 MoE model
# for a bounded time, decodes and scores it against copying the source.
demo: $(STAMP)
	$(BIN)/python -m lingshard.tools.demo

# A few training steps of the toy model (seconds).
smoke: $(STAMP)
	$(BIN)/python -m lingshard.tools.smoke --model=toy.FFRegression --steps=50 --log_every=10

# One test file per worker, as many workers as cores (pytest-xdist); the
# 30 slowest set-ups and calls are listed, to keep the suite in its budget.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder \
	    --durations=30 tests

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
