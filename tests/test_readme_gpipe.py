"""README.md's commands, group 'gpipe' (tests/readme_checks.py): GPipe: the pipelined TinyDense's SPMD proof on a data x stage
mesh and GPipe's Table 1 count,
run as written in a fresh directory (after the README's `prepare` when the
group reads the corpus) and checked against CHECKS."""

from tests import readme_checks as rc

ran, test_readme_command = rc.GroupTests('gpipe')
