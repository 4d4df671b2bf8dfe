"""README.md's commands, group 'spmd' (tests/readme_checks.py): the sharding proofs of m4.TinyMoE's train step and decoding program on 8 virtual devices, the Table 1
weight count and the TPU VM launcher's dry runs,
run as written in a fresh directory (after the README's `prepare` when the
group reads the corpus) and checked against CHECKS."""

from tests import readme_checks as rc

ran, test_readme_command = rc.GroupTests('spmd')
