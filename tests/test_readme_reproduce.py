"""README.md's commands, group 'reproduce' (tests/readme_checks.py): the evidence page's quick capacity experiment,
run as written in a fresh directory (after the README's `prepare` when the
group reads the corpus) and checked against CHECKS."""

from tests import readme_checks as rc

ran, test_readme_command = rc.GroupTests('reproduce')
