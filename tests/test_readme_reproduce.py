"""README.md's commands, group 'reproduce' (tests/readme_checks.py): the evidence page's quick capacity experiment, run
as written in a fresh directory (after the README's `prepare` when the
group reads the corpus) and checked against CHECKS."""

import pytest

from tests import readme_checks as rc

GROUP = 'reproduce'


@pytest.fixture(scope='module')
def ran(tmp_path_factory):
  return rc.RunGroup(tmp_path_factory, GROUP)


@pytest.mark.parametrize('command', rc.GroupCommands(GROUP),
                         ids=rc.Ids(rc.GroupCommands(GROUP)))
def test_readme_command(ran, command):
  rc.AssertCommand(ran, command)
