"""README.md's commands, group 'lm' (tests/readme_checks.py): the sparsely-gated MoE language model: lm_prepare,
train, eval, its SPMD proof and its weight count,
run as written in a fresh directory (after the README's `prepare` when the
group reads the corpus) and checked against CHECKS."""

from tests import readme_checks as rc

ran, test_readme_command = rc.GroupTests('lm')
