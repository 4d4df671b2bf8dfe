"""The trainer's machinery: the pure step, its state, checkpoints, summaries,
strategies, and the eval / decode / export hooks. `lingshard/trainer.py` is
the absl binary that wires them."""
