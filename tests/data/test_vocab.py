"""Tests of the SentencePiece vocabularies trained on the fixture corpus."""

import json
import os
import random
import unicodedata

import pytest
import sentencepiece as spm

from lingshard.data import corpus_io
from lingshard.data import vocab


def _Load(prepared_dir, name):
  return spm.SentencePieceProcessor(
      model_file=os.path.join(prepared_dir, vocab.VOCAB_DIR, name))


def test_special_ids_and_language_tags(prepared_dir):
  train = corpus_io.ReadTsv(os.path.join(prepared_dir, 'train.tsv'))
  langs = sorted({r[0] for r in train})
  for name in (vocab.MULTI_MODEL, vocab.EN_MODEL, vocab.SHARED_MODEL):
    sp = _Load(prepared_dir, name)
    assert (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id()) == (
        vocab.PAD_ID, vocab.BOS_ID, vocab.EOS_ID, vocab.UNK_ID)
  for name in (vocab.EN_MODEL, vocab.SHARED_MODEL):
    sp = _Load(prepared_dir, name)
    for lang in langs:
      tag = vocab.LangTag(lang)
      assert sp.piece_to_id(tag) != sp.unk_id()
      # A tag in running text stays one piece.
      pieces = sp.encode(f'{tag} Save', out_type=str)
      assert tag in pieces


def _Nfkc(text):
  return unicodedata.normalize('NFKC', text)


def test_models_round_trip_their_training_text(prepared_dir):
  train = corpus_io.ReadTsv(os.path.join(prepared_dir, 'train.tsv'))
  multi = _Load(prepared_dir, vocab.MULTI_MODEL)
  en = _Load(prepared_dir, vocab.EN_MODEL)
  shared = _Load(prepared_dir, vocab.SHARED_MODEL)
  for _, source, target in train:
    # Lossless up to the models' NFKC normalization (e.g. '…' -> '...').
    assert multi.decode(multi.encode(source)) == _Nfkc(source)
    assert en.decode(en.encode(target)) == _Nfkc(target)
    for text in (source, target):
      assert shared.decode(shared.encode(text)) == _Nfkc(text)
  # Byte fallback: characters never seen in training still round-trip.
  unseen = 'Ω€ 😀 ŝ'
  for sp in (multi, shared):
    ids = sp.encode(unseen)
    assert sp.unk_id() not in ids
    assert sp.decode(ids) == unseen


def test_params_file_records_the_training(prepared_dir):
  path = os.path.join(prepared_dir, vocab.VOCAB_DIR, vocab.PARAMS_FILE)
  with open(path, encoding='utf-8') as f:
    saved = json.load(f)
  assert sorted(saved) == ['en', 'multi', 'shared']
  shared = _Load(prepared_dir, vocab.SHARED_MODEL)
  assert saved['shared']['actual_vocab_size'] == shared.get_piece_size()
  assert saved['shared']['trainer_options']['vocab_size'] == 600
  # Trained on both sides of every pair.
  assert saved['shared']['num_sentences'] == 2 * saved['en']['num_sentences']
  multi = _Load(prepared_dir, vocab.MULTI_MODEL)
  assert saved['multi']['actual_vocab_size'] == multi.get_piece_size()
  assert saved['multi']['trainer_options']['vocab_size'] == 500
  assert saved['multi']['trainer_options']['character_coverage'] == 0.9995
  assert saved['en']['trainer_options']['num_threads'] == 1


def test_training_is_deterministic_and_validated():
  rnd = random.Random(0)
  words = [''.join(rnd.choice('abcdefghijklmnop') for _ in range(5))
           for _ in range(200)]
  sentences = [' '.join(rnd.choice(words) for _ in range(8))
               for _ in range(300)]
  options = vocab.TrainerOptions(100, 1.0, byte_fallback=False)
  first = vocab.TrainModel(sentences, options, seed=7)
  assert vocab.TrainModel(sentences, options, seed=7) == first
  sp = spm.SentencePieceProcessor(model_proto=first)
  assert sp.get_piece_size() == 100
  with pytest.raises(ValueError, match='no sentences'):
    vocab.TrainModel([], options)
  with pytest.raises(ValueError, match='SentencePiece training failed'):
    vocab.TrainModel(sentences, vocab.TrainerOptions(5, 1.0, False))


def test_cli_on_missing_corpus(tmp_path, capsys):
  assert vocab.main([str(tmp_path)]) == 1
  assert 'corpus file not found' in capsys.readouterr().err
