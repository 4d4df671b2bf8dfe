"""Tests of the statistics CLI."""

import collections
import math
import os

from lingshard.data import corpus_io
from lingshard.data import splits
from lingshard.data import stats


def _Table(output):
  lines = output.splitlines()
  header = lines[1].split()
  rows = {}
  for line in lines[2:]:
    if not line.strip():
      break
    fields = line.split()
    rows[fields[0]] = fields[1:]
  return header, rows


def _Expected(train_counts, temperature):
  total = sum(train_counts.values())
  w = {lg: (n / total) ** (1 / temperature) for lg, n in train_counts.items()}
  return {lg: v / sum(w.values()) for lg, v in w.items()}


def test_counts_and_sampling_distribution(prepared_dir, capsys):
  assert stats.main([prepared_dir, '--temperature', '5']) == 0
  header, rows = _Table(capsys.readouterr().out)
  assert header == ['lang'] + list(splits.ALL_SPLITS) + ['p(T=1)', 'p(T=5)']
  train = collections.Counter(r[0] for r in corpus_io.ReadTsv(
      corpus_io.SplitPath(prepared_dir, splits.TRAIN)))
  dev = collections.Counter(r[0] for r in corpus_io.ReadTsv(
      corpus_io.SplitPath(prepared_dir, splits.DEV_UNSEEN)))
  p1, p5 = _Expected(train, 1.0), _Expected(train, 5.0)
  assert set(rows) == set(train) | {'ALL'}
  for lang in train:
    assert int(rows[lang][0]) == train[lang]
    assert int(rows[lang][1]) == dev[lang]
    assert math.isclose(float(rows[lang][-2]), p1[lang], abs_tol=1e-5)
    assert math.isclose(float(rows[lang][-1]), p5[lang], abs_tol=1e-5)
  assert int(rows['ALL'][0]) == sum(train.values())
  # Rows run from the largest training language down.
  order = [lg for lg in rows if lg != 'ALL']
  assert [train[lg] for lg in order] == sorted(train.values(), reverse=True)


def test_infinite_temperature_is_uniform(prepared_dir, capsys):
  assert stats.main([prepared_dir, '--temperature', 'inf']) == 0
  out = capsys.readouterr().out
  header, rows = _Table(out)
  assert header[-1] == 'p(T=inf)'
  langs = [lg for lg in rows if lg != 'ALL']
  for lang in langs:
    assert math.isclose(float(rows[lang][-1]), 1 / len(langs), abs_tol=1e-5)
  assert f'at T=inf: {len(langs)}.0' in out


def test_missing_corpus_is_an_error(tmp_path, capsys):
  assert stats.main([str(tmp_path)]) == 1
  err = capsys.readouterr().err
  assert 'corpus file not found' in err
  assert os.path.join(str(tmp_path), 'train.tsv') in err


def test_bad_temperature_is_an_error(prepared_dir, capsys):
  assert stats.main([prepared_dir, '--temperature', '0']) == 1
  assert 'temperature must be > 0' in capsys.readouterr().err


def _CopyCorpus(prepared_dir, tmp_path):
  for name in splits.ALL_SPLITS:
    src = corpus_io.SplitPath(prepared_dir, name)
    if os.path.exists(src):
      with open(src, 'rb') as f, open(corpus_io.SplitPath(
          str(tmp_path), name), 'wb') as g:
        g.write(f.read())
  return str(tmp_path)


def test_empty_evaluation_split_counts_zero(prepared_dir, tmp_path, capsys):
  # prepare writes an evaluation split with no pairs for a corpus without
  # any (e.g. no string unseen in English): stats reports zeros for it.
  data_dir = _CopyCorpus(prepared_dir, tmp_path)
  open(corpus_io.SplitPath(data_dir, splits.DEV_UNSEEN), 'w').close()
  assert stats.main([data_dir, '--temperature', '5']) == 0
  header, rows = _Table(capsys.readouterr().out)
  column = header.index(splits.DEV_UNSEEN) - 1
  assert int(rows['ALL'][column]) == 0
  assert int(rows['ALL'][0]) > 0


def test_empty_training_split_is_an_error(prepared_dir, tmp_path, capsys):
  data_dir = _CopyCorpus(prepared_dir, tmp_path)
  train = corpus_io.SplitPath(data_dir, splits.TRAIN)
  open(train, 'w').close()
  assert stats.main([data_dir]) == 1
  assert capsys.readouterr().err == f'error: corpus file is empty: {train}\n'
