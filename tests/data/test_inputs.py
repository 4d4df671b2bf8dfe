"""Tests of the tf.data input generator on the fixture corpus."""

import collections
import logging
import math
import os

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from lingshard.data import corpus_io
from lingshard.data import inputs
from lingshard.data import vocab


def _Params(prepared_dir, split='train', **kwargs):
  p = inputs.MtInput.ParamsForCorpus(prepared_dir, split,
                                     kwargs.pop('direction', 'xx2en'))
  settings = dict(bucket_upper_bounds=[8, 16, 32],
                  bucket_batch_limits=[8, 4, 2])
  settings.update(kwargs)
  p.Set(**settings)
  return p


def _Sp(prepared_dir, name):
  return spm.SentencePieceProcessor(
      model_file=os.path.join(prepared_dir, vocab.VOCAB_DIR, name))


def _Unpadded(batch):
  """Yields per-example dicts of unpadded numpy values."""
  b = {k: v.numpy() for k, v in batch.FlattenItems()}
  for i in range(b['src.ids'].shape[0]):
    src_len = int((b['src.paddings'][i] == 0).sum())
    tgt_len = int((b['tgt.paddings'][i] == 0).sum())
    ex = {'lang': b['lang'][i].decode(),
          'src': b['src.ids'][i][:src_len].tolist(),
          'tgt_ids': b['tgt.ids'][i][:tgt_len].tolist(),
          'tgt_labels': b['tgt.labels'][i][:tgt_len].tolist()}
    if 'src.strs' in b:
      ex['src_str'] = b['src.strs'][i].decode()
      ex['tgt_str'] = b['tgt.strs'][i].decode()
    yield ex


def _CheckPaddingLayout(batch):
  for side in ('src', 'tgt'):
    ids, pad = batch[side].ids.numpy(), batch[side].paddings.numpy()
    np.testing.assert_array_equal(pad, (ids == vocab.PAD_ID).astype(
        np.float32))
    # Padding is a suffix: 0...0 1...1 in every row.
    assert (np.diff(pad, axis=1) >= 0).all()
  np.testing.assert_array_equal(batch.tgt.weights.numpy(),
                                1.0 - batch.tgt.paddings.numpy())
  labels = batch.tgt.labels.numpy()
  np.testing.assert_array_equal(labels == 0, batch.tgt.paddings.numpy() == 1)


def test_in_graph_tokenization_equals_python_sentence_piece(prepared_dir, tmp_path):
  rows = corpus_io.ReadTsv(os.path.join(prepared_dir, 'train.tsv'))
  # Characters the models never saw exercise byte fallback / <unk>.
  rows = rows + [('ja', 'Ω€ 😀 ŝ 你好', 'Unseen ŝ characters ☃')]
  path = str(tmp_path / 'eval.tsv')
  corpus_io.WriteTsv(path, rows)
  p = _Params(prepared_dir, 'dev_seen_en', file_pattern=path,
              bucket_upper_bounds=[8, 16, 64], eval_batch_size=7)
  multi = _Sp(prepared_dir, vocab.MULTI_MODEL)
  en = _Sp(prepared_dir, vocab.EN_MODEL)
  got = []
  for batch in p.Instantiate().GetDataset():
    _CheckPaddingLayout(batch)
    assert batch.src.ids.shape[1] in (8, 16, 64)
    got.extend(_Unpadded(batch))
  assert len(got) == len(rows)
  for ex, (lang, source, target) in zip(got, rows):
    assert (ex['lang'], ex['src_str'], ex['tgt_str']) == (lang, source,
                                                          target)
    tokens = en.encode(target)
    assert ex['src'] == multi.encode(source) + [vocab.EOS_ID]
    assert ex['tgt_ids'] == [vocab.BOS_ID] + tokens
    assert ex['tgt_labels'] == tokens + [vocab.EOS_ID]


def test_en2xx_puts_the_target_language_tag_first(prepared_dir):
  p = _Params(prepared_dir, 'dev_unseen_en', direction='en2xx')
  multi = _Sp(prepared_dir, vocab.MULTI_MODEL)
  en = _Sp(prepared_dir, vocab.EN_MODEL)
  rows = corpus_io.ReadTsv(p.file_pattern)
  got = [ex for b in p.Instantiate().GetDataset() for ex in _Unpadded(b)]
  assert len(got) == len(rows)
  for ex, (lang, source, target) in zip(got, rows):
    assert ex['src'] == ([en.piece_to_id(vocab.LangTag(lang))] +
                         en.encode(target) + [vocab.EOS_ID])
    assert ex['tgt_labels'] == multi.encode(source) + [vocab.EOS_ID]


def test_en2xx_unknown_language_tag_is_an_error(prepared_dir, tmp_path):
  path = str(tmp_path / 'x.tsv')
  corpus_io.WriteTsv(path, [('tlh', 'Qapla', 'Success')])
  p = _Params(prepared_dir, 'dev_unseen_en', direction='en2xx',
              file_pattern=path)
  with pytest.raises(ValueError, match='<2tlh> is not a symbol'):
    p.Instantiate().GetDataset()


def test_training_batches_have_only_the_configured_static_shapes(prepared_dir):
  p = _Params(prepared_dir, bucket_upper_bounds=[6, 12, 24],
              bucket_batch_limits=[8, 4, 2])
  allowed = {(8, 6), (4, 12), (2, 24)}
  seen = set()
  for batch in p.Instantiate().GetDataset().take(60):
    shape = tuple(batch.src.ids.shape)
    assert shape in allowed
    for t in (batch.src.paddings, batch.tgt.ids, batch.tgt.labels,
              batch.tgt.paddings, batch.tgt.weights):
      assert tuple(t.shape) == shape
    assert tuple(batch.lang.shape) == shape[:1]
    _CheckPaddingLayout(batch)
    for ex in _Unpadded(batch):
      # Long examples are dropped, never truncated: EOS always survives.
      assert ex['src'][-1] == vocab.EOS_ID
      assert ex['tgt_labels'][-1] == vocab.EOS_ID
      assert ex['tgt_ids'][1:] == ex['tgt_labels'][:-1]
      # The smallest bucket that fits was used.
      length = max(len(ex['src']), len(ex['tgt_ids']))
      assert length <= shape[1]
      assert all(b < length for b in (6, 12, 24) if b < shape[1])
    seen.add(shape)
  assert len(seen) >= 2


def _EmpiricalLangFrequencies(p, draws):
  ds = p.Instantiate().SampledExamples().batch(2000)
  counts = collections.Counter()
  for lang, _, _, _ in ds.take(draws // 2000):
    counts.update(x.decode() for x in lang.numpy())
  return counts


@pytest.mark.parametrize('temperature', [1.0, 5.0, None])
def test_temperature_sampling_frequencies(prepared_dir, temperature):
  p = _Params(prepared_dir, temperature=temperature)
  rows = corpus_io.ReadTsv(p.file_pattern)
  n = collections.Counter(r[0] for r in rows)
  total = sum(n.values())
  # Independent statement of the rule p_l ~ (n_l / N) ** (1 / T).
  exponent = 0.0 if temperature is None else 1.0 / temperature
  weights = {lg: (c / total) ** exponent for lg, c in n.items()}
  expected = {lg: w / sum(weights.values()) for lg, w in weights.items()}
  draws = 20000
  counts = _EmpiricalLangFrequencies(p, draws)
  assert sum(counts.values()) == draws
  for lang, prob in expected.items():
    tolerance = 5 * math.sqrt(prob * (1 - prob) / draws)
    assert abs(counts[lang] / draws - prob) <= tolerance, (lang, temperature)
  # The fixture is imbalanced enough for the temperatures to be told apart.
  assert max(expected.values()) - min(expected.values()) > 0.05 or (
      temperature is None)


def test_shuffling_and_sampling_are_deterministic_from_the_seed(prepared_dir):
  def First(seed):
    p = _Params(prepared_dir, seed=seed)
    return [b.src.ids.numpy().tolist()
            for b in p.Instantiate().GetDataset().take(6)]

  assert First(11) == First(11)
  assert First(11) != First(12)


def test_host_sharding_partitions_the_rows(prepared_dir):
  p = _Params(prepared_dir, 'train', is_inference=True)
  rows = corpus_io.ReadTsv(p.file_pattern)
  per_host = []
  for host in range(3):
    q = p.Copy()
    q.Set(num_hosts=3, host_index=host)
    per_host.append([(ex['lang'], ex['src_str'], ex['tgt_str'])
                     for b in q.Instantiate().GetDataset()
                     for ex in _Unpadded(b)])
  assert per_host[0] == rows[0::3]
  assert sorted(sum(per_host, [])) == sorted(rows)
  # Training hosts sample only from their own per-language shard; a
  # language with fewer rows than hosts lends one row to every host.
  q = _Params(prepared_dir, num_hosts=3, host_index=1, temperature=None)
  groups = corpus_io.GroupByLanguage(rows)
  mine = {(lang, src) for lang, pairs in groups.items()
          for src, _ in (pairs[1::3] or pairs[1 % len(pairs):][:1])}
  sampled = collections.Counter()
  for lang, src, _, _ in q.Instantiate().SampledExamples().take(600):
    sampled[(lang.numpy().decode(), src.numpy().decode())] += 1
  assert set(sampled) <= mine
  assert {lang for lang, _ in sampled} == set(groups)


def test_eval_truncates_but_keeps_every_example(prepared_dir):
  p = _Params(prepared_dir, 'train', is_inference=True,
              bucket_upper_bounds=[4, 8], bucket_batch_limits=[16, 8])
  rows = corpus_io.ReadTsv(p.file_pattern)
  got = []
  for batch in p.Instantiate().GetDataset():
    assert batch.src.ids.shape[1] in (4, 8)
    assert batch.src.ids.shape[0] <= 8
    got.extend(_Unpadded(batch))
  assert [ex['tgt_str'] for ex in got] == [r[2] for r in rows]
  multi = _Sp(prepared_dir, vocab.MULTI_MODEL)
  truncated = 0
  for ex, (_, source, _) in zip(got, rows):
    full = multi.encode(source) + [vocab.EOS_ID]
    assert ex['src'][-1] == vocab.EOS_ID
    if len(full) > 8:
      truncated += 1
      assert ex['src'] == full[:7] + [vocab.EOS_ID]
  assert truncated > 0


def test_one_input_reads_its_dataset_again(prepared_dir):
  # train_and_eval evaluates with the same input generator every interval:
  # each GetDataset must give the same batches (all tokenize with the
  # tokenizers the first one made).
  p = _Params(prepared_dir, 'dev_unseen_en', is_inference=True)
  gen = p.Instantiate()
  passes = [[ex['tgt_str'] for b in gen.GetDataset() for ex in _Unpadded(b)]
            for _ in range(3)]
  assert passes[0] and passes[0] == passes[1] == passes[2]


def test_eval_input_builds_without_autograph_warnings(prepared_dir):
  # The vocabularies load before tf.data traces the map function: loading
  # inside it made autograph warn that it could not convert os.path.isfile
  # (printed by every trainer eval and decode).
  messages = []
  handler = logging.Handler()
  handler.emit = lambda record: messages.append(record.getMessage())
  tf.get_logger().addHandler(handler)
  try:
    gen = _Params(prepared_dir, 'dev_seen_en',
                  is_inference=True).Instantiate()
    assert next(iter(gen.GetDataset())).src.ids.shape[0] > 0
  finally:
    tf.get_logger().removeHandler(handler)
  assert not [m for m in messages if 'AutoGraph' in m], messages


def test_malformed_lines_name_file_and_line(prepared_dir, tmp_path):
  path = tmp_path / 'bad.tsv'
  path.write_text('de\tJa\tYes\nfr\tOui\tYes\nfr\tNon only two fields\n',
                  encoding='utf-8')
  p = _Params(prepared_dir, file_pattern=str(path))
  with pytest.raises(corpus_io.CorpusError) as e:
    p.Instantiate().GetDataset()
  assert str(e.value).startswith(f'{path}:3:')
  assert 'expected 3 tab-separated fields' in str(e.value)
  path.write_text('de\tJa\tYes\nfr\t\tYes\n', encoding='utf-8')
  with pytest.raises(corpus_io.CorpusError, match=f'{path}:2: empty field'):
    p.Instantiate().GetDataset()


def test_empty_or_missing_corpus_is_a_clear_error(prepared_dir, tmp_path):
  empty = tmp_path / 'empty.tsv'
  empty.write_text('', encoding='utf-8')
  p = _Params(prepared_dir, file_pattern=str(empty))
  with pytest.raises(corpus_io.CorpusError,
                     match=f'corpus file is empty: {empty}'):
    p.Instantiate().GetDataset()
  p.file_pattern = str(tmp_path / 'missing.tsv')
  with pytest.raises(corpus_io.CorpusError, match='no corpus file matches'):
    p.Instantiate().GetDataset()
  p = _Params(prepared_dir, languages=['tlh'])
  with pytest.raises(corpus_io.CorpusError, match='no rows of languages'):
    p.Instantiate().GetDataset()


def test_params_validation_and_text_round_trip(prepared_dir):
  p = _Params(prepared_dir)
  q = inputs.MtInput.Params()
  q.FromText(p.ToText())
  assert q.ToText() == p.ToText()
  with pytest.raises(ValueError, match='direction'):
    _Params(prepared_dir, direction='de2fr').Instantiate()
  with pytest.raises(ValueError, match='equal length'):
    _Params(prepared_dir, bucket_batch_limits=[8]).Instantiate()
  with pytest.raises(ValueError, match='host_index'):
    _Params(prepared_dir, num_hosts=2, host_index=2).Instantiate()
