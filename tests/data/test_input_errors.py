"""Input pipelines that cannot produce data say so in one line, when data
is read: missing corpus or vocabulary files, examples that all exceed the
largest bucket."""

import logging
import os
import re
import shutil

import pytest
import sentencepiece as spm

from lingshard import base_input
from lingshard.data import corpus_io
from lingshard.data import inputs
from lingshard.data import vocab
from lingshard.models import mt_decoder

PREPARE = 'prepare the corpus with: python -m lingshard.data.prepare --out'


def _CorpusWithoutVocab(prepared_dir, tmp_path):
  data_dir = tmp_path / 'ui_m4'
  data_dir.mkdir()
  shutil.copy(os.path.join(prepared_dir, 'train.tsv'), data_dir)
  return str(data_dir)


def test_missing_vocabulary_names_file_and_prepare_command_when_read(
    prepared_dir, tmp_path):
  data_dir = _CorpusWithoutVocab(prepared_dir, tmp_path)
  p = inputs.MtInput.ParamsForCorpus(data_dir, shared_vocab=True)
  generator = p.Instantiate()  # Building needs no data.
  model = os.path.join(data_dir, 'vocab', 'spm_shared.model')
  with pytest.raises(base_input.InputError) as e:
    generator.GetDataset()
  assert isinstance(e.value, corpus_io.CorpusError)
  assert str(e.value) == (f'src_vocab not found: {model}; {PREPARE} '
                          f'{data_dir}')
  with pytest.raises(corpus_io.CorpusError) as e:
    mt_decoder.Detokenizer(model)
  assert str(e.value) == (f'vocabulary not found: {model}; {PREPARE} '
                          f'{data_dir}')


def test_missing_corpus_names_pattern_and_prepare_command(tmp_path):
  data_dir = str(tmp_path / 'nowhere')
  train = os.path.join(data_dir, 'train.tsv')
  generator = inputs.MtInput.ParamsForCorpus(data_dir).Instantiate()
  with pytest.raises(base_input.InputError) as e:
    generator.GetDataset()
  assert str(e.value) == (f'no corpus file matches {train}; {PREPARE} '
                          f'{data_dir}')
  with pytest.raises(corpus_io.CorpusError) as e:
    corpus_io.ReadTsv(train)
  assert str(e.value) == (f'corpus file not found: {train}; {PREPARE} '
                          f'{data_dir}')
  with pytest.raises(corpus_io.CorpusError) as e:
    corpus_io.ReadTsv('train.tsv')
  assert str(e.value) == f'corpus file not found: train.tsv; {PREPARE} .'


def _LongCorpus(path, rows):
  corpus_io.WriteTsv(str(path), rows)
  return str(path)


LONG = [('de', 'Ihre Sitzung ist abgelaufen. Bitte melden Sie sich erneut '
         'an.', 'Your session has expired. Please log in again.'),
        ('fr', 'Votre mot de passe a été modifié avec succès.',
         'Your password was changed successfully.')]


def test_training_where_every_example_is_too_long_raises_instead_of_hanging(
    prepared_dir, tmp_path):
  path = _LongCorpus(tmp_path / 'long.tsv', LONG * 3)
  p = inputs.MtInput.ParamsForCorpus(prepared_dir)
  p.Set(file_pattern=path, bucket_upper_bounds=[4, 8],
        bucket_batch_limits=[4, 2])
  with pytest.raises(base_input.InputError) as e:
    p.Instantiate().GetDataset()
  assert str(e.value) == (
      f'all 6 examples of {path} are longer than the largest bucket bound 8 '
      f'(source or target tokens incl. EOS); raise '
      f'input.bucket_upper_bounds')
  # Host 1 of 2 reads row 1 of each language's 3 rows.
  p.Set(num_hosts=2, host_index=1)
  with pytest.raises(base_input.InputError,
                     match=re.escape(f'all 2 examples of {path} (host 1 of '
                                     f'2) are longer')):
    p.Instantiate().GetDataset()


def test_too_long_examples_are_counted_and_logged(prepared_dir, tmp_path,
                                                  caplog):
  short = [('de', 'Ja', 'Yes'), ('fr', 'Non', 'No'), ('de', 'Nein', 'No')]
  path = _LongCorpus(tmp_path / 'mixed.tsv', short + LONG)
  p = inputs.MtInput.ParamsForCorpus(prepared_dir)
  p.Set(file_pattern=path, bucket_upper_bounds=[4, 8],
        bucket_batch_limits=[4, 2], temperature=None)
  # Independent lengths: pieces + EOS (source) / BOS + pieces (target).
  multi = spm.SentencePieceProcessor(
      model_file=os.path.join(prepared_dir, vocab.VOCAB_DIR,
                              vocab.MULTI_MODEL))
  en = spm.SentencePieceProcessor(
      model_file=os.path.join(prepared_dir, vocab.VOCAB_DIR, vocab.EN_MODEL))
  long_rows = {r for r in short + LONG
               if max(len(multi.encode(r[1])), len(en.encode(r[2]))) + 1 > 8}
  assert long_rows == set(LONG)
  generator = p.Instantiate()
  # The absl logger's own level too: another test in this process may have
  # set absl's verbosity (absl.app), which would drop INFO before the root.
  with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO,
                                                      logger='absl'):
    dataset = generator.GetDataset()
  assert generator.CountTooLong() == (2, 5)
  assert (f'{path}: 2 of 5 examples are longer than the largest bucket '
          'bound 8 and are dropped') in caplog.messages
  for batch in dataset.take(3):
    assert tuple(batch.src.ids.shape) in ((4, 4), (2, 8))


@pytest.mark.parametrize('side', ['src_vocab', 'tgt_vocab'])
@pytest.mark.parametrize('content', [b'not a model\n', b''])
def test_vocabulary_that_is_not_sentencepiece_names_file(
    prepared_dir, tmp_path, side, content):
  """SentencePiece raises a RuntimeError naming its own C++ line (or takes
  empty bytes as no model); the input says which file is wrong."""
  bad = tmp_path / 'notes.model'
  bad.write_bytes(content)
  p = inputs.MtInput.ParamsForCorpus(prepared_dir)
  p.Set(**{side: str(bad)})
  with pytest.raises(base_input.InputError) as e:
    p.Instantiate().GetDataset()
  assert str(e.value) == (
      f'{side} {bad} is not a SentencePiece model; set it to a '
      'vocab/spm_*.model file written by prepare')
  with pytest.raises(corpus_io.CorpusError) as e:
    mt_decoder.Detokenizer(str(bad))
  assert str(e.value) == (
      f'vocabulary {bad} is not a SentencePiece model; set it to a '
      'vocab/spm_*.model file written by prepare')


def test_invalid_utf8_names_its_line(tmp_path):
  """Line 101 of 150 (past the 8 KiB a text-mode reader decodes ahead)."""
  rows = [f'de\tZeile {i} {"x" * 100}\tline {i}\n'.encode() for i in
          range(1, 151)]
  rows[100] = b'de\tZeile \xff kaputt\tline 101\n'
  path = tmp_path / 'train.tsv'
  path.write_bytes(b''.join(rows))
  with pytest.raises(corpus_io.CorpusError) as e:
    corpus_io.ReadTsv(str(path))
  assert str(e.value) == (
      f"{path}:101: not UTF-8: 'utf-8' codec can't decode byte 0xff in "
      'position 9: invalid start byte')
