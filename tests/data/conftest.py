"""Fixtures of the data tests: a tiny wheel of handcrafted catalogs and the
corpus prepared from it (offline; no pip download)."""

import os
import zipfile

import pytest

from lingshard.data import prepare

TESTDATA = os.path.join(os.path.dirname(__file__), 'testdata')
FIXTURE_TREE = os.path.join(TESTDATA, 'polyui')
WHEEL_NAME = 'polyui-1.0-py3-none-any.whl'

# Large held-out fractions so that the ~47 English strings of the fixture
# still give non-empty held-out splits.
PREPARE_KWARGS = dict(max_chars=150, unseen_fracs=(0.15, 0.15),
                      seen_fracs=(0.15, 0.15))
# Byte fallback needs 256 byte pieces plus every required character, so the
# multilingual model cannot be much smaller than this on the fixture.
VOCAB_KWARGS = dict(multi_vocab_size=500, en_vocab_size=150,
                    shared_vocab_size=600)


def BuildWheel(out_path, tree=FIXTURE_TREE):
  """Zips `tree` like a wheel, with fixed timestamps and member order."""
  members = []
  for root, _, files in os.walk(tree):
    for name in files:
      path = os.path.join(root, name)
      members.append((os.path.relpath(path, tree).replace(os.sep, '/'), path))
  with zipfile.ZipFile(out_path, 'w', zipfile.ZIP_DEFLATED) as zf:
    for arcname, path in sorted(members):
      info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      with open(path, 'rb') as f:
        zf.writestr(info, f.read())
  return out_path


@pytest.fixture(scope='session')
def fixture_wheel(tmp_path_factory):
  return BuildWheel(str(tmp_path_factory.mktemp('wheels') / WHEEL_NAME))


@pytest.fixture(scope='session')
def prepared_dir(fixture_wheel, tmp_path_factory):
  """A corpus directory prepared (with vocabularies) from the fixture."""
  out = str(tmp_path_factory.mktemp('corpus'))
  prepare.Prepare([fixture_wheel], out, vocab_kwargs=VOCAB_KWARGS,
                  **PREPARE_KWARGS)
  return out
