"""Fixtures of the SPMD checker's tests."""

import os

import pytest

from tests.data.conftest import fixture_wheel  # noqa: F401
from tests.data.conftest import prepared_dir  # noqa: F401


@pytest.fixture
def in_corpus_dir(prepared_dir, tmp_path, monkeypatch):  # noqa: F811
  """A working directory whose data/ui_m4 is the prepared test corpus."""
  (tmp_path / 'data').mkdir()
  os.symlink(prepared_dir, tmp_path / 'data' / 'ui_m4')
  monkeypatch.chdir(tmp_path)
  return tmp_path
