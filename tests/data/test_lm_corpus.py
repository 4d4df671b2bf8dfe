"""lm_prepare (English prose of Python sources) and LmInput batches."""

import os
import numpy as np
import pytest

from lingshard import base_input
from lingshard.data import lm_inputs
from lingshard.data import lm_prepare

_MODULE = '''"""The frobnicator module. It frobnicates widgets quickly.

>>> frob(1)
2
"""

# Compute the answer to everything.
# It is forty two, as everybody knows.
def frob(x):
  """Return the frobnicated value of x. The value is never negative."""
  return x + 1  # not prose: too short
'''


def _Root(tmp_path, n=12):
  root = tmp_path / 'src'
  for i in range(n):
    (root / f'pkg{i % 3}').mkdir(parents=True, exist_ok=True)
    text = _MODULE.replace('widgets', f'widgets number {i}')
    (root / f'pkg{i % 3}' / f'mod{i}.py').write_text(text)
  (root / 'test').mkdir()
  (root / 'test' / 'mod.py').write_text('"""Skipped test module prose here."""')
  return str(root)


def test_sentences_split_dedup_and_byte_identical_rerun(tmp_path):
  root = _Root(tmp_path)
  data, words, stats = lm_prepare.Build(root, vocab_size=50)
  lines = [ln for s in lm_prepare.SPLITS for ln in data[s]]
  assert lines.count('the frobnicator module .') == 1  # Deduplicated.
  assert 'compute the answer to everything .' in lines
  assert 'return the frobnicated value of x .' in lines
  assert not any('>>>' in ln or 'skipped' in ln for ln in lines)
  # Shared sentences appear once (deduplicated across modules).
  assert lines.count('it is forty two , as everybody knows .') == 1
  # By module: a module's own sentence lands in its module's split only.
  for i in range(12):
    own = f'it frobnicates widgets number {i} quickly .'
    split = lm_prepare.SplitOf(os.path.join(f'pkg{i % 3}', f'mod{i}.py'))
    assert [s for s in lm_prepare.SPLITS if own in data[s]] == [split]
  assert stats['vocab_size'] == 4 + len(words)
  a, b = tmp_path / 'a', tmp_path / 'b'
  for out in (a, b):
    lm_prepare.Write(str(out), data, words, stats)
  for name in ('train.txt', 'dev.txt', 'test.txt', 'vocab.txt',
               'manifest.json'):
    assert (a / name).read_bytes() == (b / name).read_bytes()
  vocab = (a / 'vocab.txt').read_text().splitlines()
  assert vocab[:4] == ['<pad>', '<s>', '</s>', '<unk>']
  with pytest.raises(lm_prepare.LmCorpusError, match=(
      r'^--out .*/a exists and is not empty; pass a new or empty '
      r'directory$')):
    lm_prepare.Write(str(a), data, words, stats)


def test_input_batches_equal_a_python_tokenisation(tmp_path):
  root = _Root(tmp_path)
  data, words, stats = lm_prepare.Build(root, vocab_size=20)
  out = tmp_path / 'corpus'
  lm_prepare.Write(str(out), data, words, stats)
  vocab = {w: i for i, w in enumerate(
      (out / 'vocab.txt').read_text().splitlines())}
  p = lm_inputs.LmInput.ParamsForCorpus(str(out), 'train').Set(
      eval_batch_size=4, is_inference=True, bucket_upper_bounds=[8, 12])
  got = []
  for b in p.Instantiate().GetDataset():
    assert b.ids.shape[1] == 12
    got.extend(zip(b.ids.numpy(), b.labels.numpy(), b.paddings.numpy()))
  lines = (out / 'train.txt').read_text().splitlines()
  assert len(got) == len(lines)
  for (ids, labels, pad), line in zip(got, lines):
    w = [vocab.get(x, 3) for x in line.split()][:11]
    n = len(w) + 1
    assert list(ids[:n]) == [1] + w and list(labels[:n]) == w + [2]
    assert not pad[:n].any() and pad[n:].all()
  # Training: static bucket shapes, only sentences that fit.
  train = p.Copy().Set(is_inference=False, bucket_batch_limits=[4, 2])
  for b in train.Instantiate().GetDataset().take(6):
    assert tuple(b.ids.shape) in ((4, 8), (2, 12))
    assert np.all(b.paddings.numpy()[:, 0] == 0)


def test_missing_corpus_and_vocabulary_are_one_line(tmp_path):
  p = lm_inputs.LmInput.ParamsForCorpus(str(tmp_path / 'none'), 'train')
  with pytest.raises(base_input.InputError, match=(
      r'^no corpus file matches .*none/train.txt; prepare the corpus with: '
      r'python -m lingshard.data.lm_prepare --out .*none$')):
    p.Instantiate().GetDataset()
  (tmp_path / 'none').mkdir()
  (tmp_path / 'none' / 'train.txt').write_text('a b c\n')
  with pytest.raises(base_input.InputError, match=(
      r'^vocabulary not found: .*none/vocab.txt; prepare the corpus with: '
      r'python -m lingshard.data.lm_prepare --out .*none$')):
    p.Instantiate().GetDataset()
  with pytest.raises(lm_prepare.LmCorpusError, match=(
      r'^--source_root .*: no English prose found in its .py files; pass a '
      r'directory of Python sources$')):
    lm_prepare.Build(str(tmp_path), vocab_size=10)
