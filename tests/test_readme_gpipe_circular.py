"""README.md's commands, group 'gpipe_circular' (tests/readme_checks.py):
the SPMD proofs of the circular-schedule TinyDense and TinyMoE pipelines,
run as written in a fresh directory (after the README's `prepare`) and
checked against CHECKS."""

from tests import readme_checks as rc

ran, test_readme_command = rc.GroupTests('gpipe_circular')
