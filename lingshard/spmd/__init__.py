"""The SPMD checker: prove sharding annotations on N virtual CPU devices.

check.py (entry points and CheckResult), layer_task.py (any layer as a
task), report.py (collectives from partitioned HLO), expect.py (--expect
rules), manual_constants.py (an HLO rewrite before partitioning) and
xla_runtime.py (the only module touching jaxlib and TF's private XLA
protos). CLI: `python -m lingshard.tools.spmd_check`.
"""
