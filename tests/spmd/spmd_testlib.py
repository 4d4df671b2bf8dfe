"""Helpers shared by the SPMD checker's tests."""

from absl.testing import flagsaver
import pytest

from lingshard.tools import spmd_check


def RunCli(*args):
  """Runs `spmd_check` in this process with flags `args`; its exit code."""
  with flagsaver.flagsaver():
    spmd_check.FLAGS.unparse_flags()  # The tool's private flags: reset.
    spmd_check.FLAGS(['spmd_check', *args])
    with pytest.raises(SystemExit) as e:
      spmd_check.main(['spmd_check'])
  return e.value.code
