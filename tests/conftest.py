"""Process-wide test set-up.

XLA reads XLA_FLAGS once per process; the SPMD tests need 8 virtual host
devices, so the whole test process gets them (and LLVM level 0, below)
before anything imports TF/jax.
"""

import gc
import os

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from lingshard import startup
from lingshard.experiments import runs

# No automatic garbage collection in the test processes: the full
# collections that TF's traced graphs trigger cost a worker 30-75 s of a
# session, one pause alone 62 s (gc callbacks, 2 cores); without them a
# worker peaks at 6.4 GB (24 GB machine). Subprocesses (README commands,
# trainer runs) collect as usual.
gc.disable()


@settings(database=None, max_examples=1)
@given(st.none())
def _FirstHypothesisRun(_):
  pass


@pytest.hookimpl(trylast=True)  # After Hypothesis' plugin ends its set-up.
def pytest_sessionstart(session):
  """Hypothesis' first run in a process does one full gc.collect() (for its
  global Random: hypothesis/internal/entropy.py register_random). Reached
  late in a worker, with automatic collection off, that collection scans
  everything the tests before left: it made one @given test take 53.6 s in
  a full run (tests/data/test_splits.py; 0.25 s alone). So the first run
  happens here, while the heap is small. It runs no test."""
  del session
  _FirstHypothesisRun()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
  """The process is about to exit: its garbage needs no collection.
  Frozen, what the session left (automatic collection is off) is skipped
  by the full collection of pytest's unraisable-exception cleanup, which
  would then scan it all: 4.1 and 35.3 s in the two workers at the end of
  a full run."""
  del session, exitstatus
  gc.freeze()


os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# A test process is a lingshard program (lingshard/startup.py): TensorFlow,
# imported by the test modules, loads without jax, matplotlib and Keras.
startup.Install()
# `make test` runs one xdist worker per core. TensorFlow gives each process
# (a worker, and the commands it starts) intra-op and inter-op pools as
# wide as the machine: 2 workers x 2 pools x 2 threads on 2 cores, with
# Eigen's pools spinning while they wait. One thread each, as
# lingshard.experiments gives its two parallel trainer runs:
# the whole suite took 487 s instead of 507 s (one run each, same host).
if int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1')) > 1:
  for _name, _value in runs.ONE_THREAD_ENV.items():
    os.environ.setdefault(_name, _value)
# LLVM level 0 for the XLA CPU code the tests compile (TF's jit_compile,
# and the trainer subprocesses, which inherit it), as the SPMD checker
# compiles its own (lingshard/spmd/xla_runtime.py): the HLO passes, hence
# the partitioned programs, buffers and results, are XLA's either way
# (tests/spmd/test_partition_patterns.py); compiling is ~12% cheaper in
# CPU (tests/decoding/test_mt_decode.py + test_bf16_step.py: 58 -> 51 s
# user). README commands run without it (readme_testlib.Env drops
# XLA_FLAGS), as a user runs them.
for _FLAG in ('--xla_force_host_platform_device_count=8',
              '--xla_backend_optimization_level=0'):
  if _FLAG.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' +
                               _FLAG).strip()

# The files that take longest (one module fixture or trainer subprocesses
# each), heaviest first. `make test` hands whole files to the xdist workers
# in collection order (`--dist loadfile --no-loadscope-reorder`): starting
# the long files first lets the many short ones fill the other worker
# instead of leaving one long file running alone at the end. Order only:
# every test still runs.
_LONG_FILES = (
    'tests/test_readme_reproduce.py',
    'tests/test_readme_lm.py',
    'tests/trainer/test_replica_routing.py',
    'tests/trainer/test_trainer_pipeline.py',
    'tests/trainer/test_trainer_image_pipelined.py',
    'tests/test_readme_commands.py',
    'tests/test_readme_gpipe.py',
    'tests/test_readme_gpipe_circular.py',
    'tests/test_readme_gpipe_image.py',
    'tests/scripts/test_bench_gpipe_image.py',
    'tests/models/test_mt_pipeline.py',
    'tests/layers/test_remat.py',
    'tests/tools/test_demo_run.py',
    'tests/tools/test_demo_image.py',
    'tests/trainer/test_trainer_export_e2e.py',
    'tests/layers/test_pipeline.py',
    'tests/layers/test_pipeline_moe.py',
    'tests/models/test_causality.py',
    'tests/layers/test_pipeline_circular_moe.py',
    'tests/layers/test_pipeline_circular.py',
    'tests/test_readme_spmd.py',
    'tests/trainer/test_multi_host.py',
    'tests/spmd/test_check_model_input.py',
    'tests/trainer/test_sharded_inference.py',
    'tests/layers/test_pipeline_cells.py',
    'tests/models/test_amoebanet_pipelined.py',
)


def pytest_collection_modifyitems(config, items):
  del config
  rank = {path: i for i, path in enumerate(_LONG_FILES)}

  def Key(indexed):
    index, item = indexed
    path = item.nodeid.split('::', 1)[0]
    return (rank.get(path, len(rank)), index)

  items[:] = [item for _, item in sorted(enumerate(items), key=Key)]
