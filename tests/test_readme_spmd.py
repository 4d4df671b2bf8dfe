"""README.md's commands, group 'spmd' (tests/readme_checks.py): the sharding proof of m4.TinyMoE on 8 virtual devices, the Table 1 weight count and the TPU VM launcher's dry runs, run
as written in a fresh directory (after the README's `prepare` when the
group reads the corpus) and checked against CHECKS."""

import pytest

from tests import readme_checks as rc

GROUP = 'spmd'


@pytest.fixture(scope='module')
def ran(tmp_path_factory):
  return rc.RunGroup(tmp_path_factory, GROUP)


@pytest.mark.parametrize('command', rc.GroupCommands(GROUP),
                         ids=rc.Ids(rc.GroupCommands(GROUP)))
def test_readme_command(ran, command):
  rc.AssertCommand(ran, command)
