"""The exported `translate` signature at its edges: an empty batch, empty
sources, bytes that are not UTF-8, and source / language lists of
different lengths (one clear error)."""

import pytest
import sentencepiece as spm
import tensorflow as tf

from lingshard.models import mt_export
from tests.trainer import fake_translation


@pytest.fixture(name='setup', scope='module')
def SetupFixture(tmp_path_factory):
  """(loaded SavedModel, spm processor): the fake copy model, except that
  it answers EOS (so an empty source) with '▁cat'."""
  spm_path = fake_translation.WriteCorpus(
      str(tmp_path_factory.mktemp('corpus')))[1]
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  task = fake_translation.NewTask()
  task.vars.table.scatter_nd_update([[sp.eos_id()]],
                                    [float(sp.piece_to_id('▁cat'))])
  out = str(tmp_path_factory.mktemp('export') / 'model')
  mt_export.Export(task, task.vars, spm_path, spm_path, out, batch_size=2,
                max_source_length=6)
  return tf.saved_model.load(out), sp


def _Translate(model, sources, languages=None):
  if languages is None:
    languages = ['de'] * len(sources)
  out = model.signatures['translate'](
      source=tf.constant(sources, tf.string),
      language=tf.constant(languages, tf.string))['translation']
  return [t.decode('utf-8') for t in out.numpy()]


def test_empty_batch(setup):
  model, _ = setup
  assert _Translate(model, []) == []


def test_empty_and_blank_sources_translate_to_empty(setup):
  model, _ = setup
  # A non-empty source keeps the model's answer to its EOS ('cat').
  assert _Translate(model, ['', 'a dog ran', ' ', '']) == [
      '', 'a dog ran cat', '', '']


def test_invalid_utf8_bytes_read_as_replacement_character(setup):
  model, sp = setup
  sources = [b'caf\xe9 dog', b'\xff\xfe', 'café dog'.encode()]
  got = _Translate(model, sources)
  assert got == _Translate(model, ['caf\ufffd dog', '\ufffd', 'café dog'])
  assert got[0] == sp.decode([sp.unk_id(), sp.piece_to_id('▁dog'),
                              sp.piece_to_id('▁cat')])


def test_source_and_language_lengths_must_match(setup):
  model, _ = setup
  with pytest.raises(tf.errors.InvalidArgumentError) as e:
    _Translate(model, ['a dog ran', 'read the book'], ['de'])
  line = ('assertion failed: [translate: source has 2 strings and language 1; '
          'pass one language per source]')
  assert line in e.value.message.splitlines(), e.value.message
