"""SentencePiece vocabularies for a prepared corpus.

Two models are trained on the training split only (held-out text never
shapes the vocabulary):

* `spm_multi.model`: all non-English training sentences (the xx side);
  character coverage below 1 so that rare CJK characters do not crowd out
  subwords, with byte fallback so that nothing becomes <unk>.
* `spm_en.model`: the English side, plus one `<2xx>` symbol per training
  language, the target-language tag of the en -> xx direction.
* `spm_shared.model`: one vocabulary for both sides (every source and
  every target sentence, the `<2xx>` tags, byte fallback), for models
  that embed source and target with one table (`share_src_tgt_embedding`):
  a piece the source has in common with English (names, code, numbers,
  placeholders) is then the same id on both sides. The CPU-sized demo
  models use it.

All share the special ids below. Training is made reproducible (one
thread, fixed seed, no sentence sampling) and the model is written from
memory, so the file never records a path: the same corpus and settings
give byte-identical models. The settings are saved beside the models in
`vocab_params.json`.

  python -m lingshard.data.vocab DIR [--multi_vocab_size 8000]
      [--en_vocab_size 2000] [--shared_vocab_size 4000]
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import argparse
import io
import json
import os
import sys

import sentencepiece as spm

from lingshard.data import corpus_io
from lingshard.data import splits

VOCAB_DIR = corpus_io.VOCAB_DIR
MULTI_MODEL = 'spm_multi.model'
EN_MODEL = 'spm_en.model'
SHARED_MODEL = 'spm_shared.model'
PARAMS_FILE = 'vocab_params.json'

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

DEFAULT_MULTI_VOCAB_SIZE = 8000
DEFAULT_EN_VOCAB_SIZE = 2000
DEFAULT_SHARED_VOCAB_SIZE = 4000
DEFAULT_SEED = 1234


def LangTag(lang):
  """The en -> xx target-language tag token, e.g. '<2de>'."""
  return f'<2{lang}>'


def TrainerOptions(vocab_size, character_coverage, byte_fallback,
                   user_defined_symbols=(), model_type='unigram'):
  """SentencePiece trainer options (JSON-friendly) used for our models."""
  return {
      'model_type': model_type,
      'vocab_size': int(vocab_size),
      'character_coverage': float(character_coverage),
      'byte_fallback': bool(byte_fallback),
      'user_defined_symbols': list(user_defined_symbols),
      'pad_id': PAD_ID, 'pad_piece': '<pad>',
      'bos_id': BOS_ID, 'bos_piece': '<s>',
      'eos_id': EOS_ID, 'eos_piece': '</s>',
      'unk_id': UNK_ID, 'unk_piece': '<unk>',
      'split_digits': True,
      # A soft limit: tiny corpora (tests) may not support the full size.
      'hard_vocab_limit': False,
      # Determinism: use every sentence in order, on one thread.
      'input_sentence_size': 0,
      'shuffle_input_sentence': False,
      'num_threads': 1,
      'max_sentence_length': 8192,
  }


def TrainModel(sentences, options, seed=DEFAULT_SEED):
  """Trains one SentencePiece model in memory.

  Args:
    sentences: list of str.
    options: TrainerOptions() dict.
    seed: SentencePiece's random generator seed.

  Returns:
    the serialized model (bytes).

  Raises:
    ValueError: if there are no sentences or SentencePiece rejects the
      settings (e.g. vocab_size below the number of required characters).
  """
  if not sentences:
    raise ValueError('cannot train a vocabulary on no sentences')
  spm.set_random_generator_seed(seed)
  writer = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=writer,
        minloglevel=2, **options)
  except RuntimeError as e:  # SentencePiece reports bad settings this way.
    raise ValueError(f'SentencePiece training failed: {e}') from e
  return writer.getvalue()


def LoadModel(model_bytes, what, path):
  """A SentencePieceProcessor of `model_bytes` read from `path`.

  Raises:
    corpus_io.CorpusError: (one line naming `what` and `path`) the bytes
      are not a SentencePiece model (SentencePiece raises a RuntimeError
      naming its own source line, or accepts empty bytes as no model).
  """
  try:
    proc = spm.SentencePieceProcessor(model_proto=model_bytes)
  except RuntimeError:
    proc = None
  if proc is None or not model_bytes:
    raise corpus_io.CorpusError(
        f'{what} {path} is not a SentencePiece model; set it to a '
        f'{VOCAB_DIR}/spm_*.model file written by prepare')
  return proc


def _WriteModel(model_bytes, path):
  with open(path, 'wb') as f:
    f.write(model_bytes)
  # A human-readable piece list next to the model, for inspection only.
  proc = spm.SentencePieceProcessor(model_proto=model_bytes)
  with open(path[:-len('.model')] + '.vocab', 'w', encoding='utf-8',
            newline='\n') as f:
    for i in range(proc.get_piece_size()):
      f.write(f'{proc.id_to_piece(i)}\t{proc.get_score(i):.6g}\n')
  return proc.get_piece_size()


def TrainVocabularies(data_dir, multi_vocab_size=DEFAULT_MULTI_VOCAB_SIZE,
                      en_vocab_size=DEFAULT_EN_VOCAB_SIZE,
                      multi_character_coverage=0.9995,
                      en_character_coverage=1.0, seed=DEFAULT_SEED,
                      shared_vocab_size=DEFAULT_SHARED_VOCAB_SIZE):
  """Trains the three vocabularies on `data_dir/train.tsv`.

  Writes `data_dir/vocab/{spm_multi,spm_en,spm_shared}.{model,vocab}` and
  `data_dir/vocab/vocab_params.json`. The shared model uses the
  multilingual character coverage (its text is mostly non-English).

  Returns:
    dict with the saved parameters (also in vocab_params.json).
  """
  rows = corpus_io.ReadTsv(corpus_io.SplitPath(data_dir, splits.TRAIN))
  langs = sorted({lang for lang, _, _ in rows})
  out_dir = os.path.join(data_dir, VOCAB_DIR)
  os.makedirs(out_dir, exist_ok=True)
  tags = [LangTag(lg) for lg in langs]
  specs = {
      'multi': (MULTI_MODEL, [src for _, src, _ in rows],
                TrainerOptions(multi_vocab_size, multi_character_coverage,
                               byte_fallback=True)),
      'en': (EN_MODEL, [tgt for _, _, tgt in rows],
             TrainerOptions(en_vocab_size, en_character_coverage,
                            byte_fallback=False, user_defined_symbols=tags)),
      'shared': (SHARED_MODEL, ([src for _, src, _ in rows] +
                                [tgt for _, _, tgt in rows]),
                 TrainerOptions(shared_vocab_size, multi_character_coverage,
                                byte_fallback=True, user_defined_symbols=tags)),
  }
  saved = {}
  for key in sorted(specs):
    filename, sentences, options = specs[key]
    model = TrainModel(sentences, options, seed)
    size = _WriteModel(model, os.path.join(out_dir, filename))
    saved[key] = {'model': filename, 'seed': seed,
                  'trained_on': f'{splits.TRAIN}.tsv',
                  'num_sentences': len(sentences),
                  'actual_vocab_size': size, 'trainer_options': options}
  with open(os.path.join(out_dir, PARAMS_FILE), 'w', encoding='utf-8',
            newline='\n') as f:
    json.dump(saved, f, indent=1, sort_keys=True, ensure_ascii=False)
    f.write('\n')
  return saved


def AddFlags(parser):
  """Adds the vocabulary flags to an argparse parser."""
  parser.add_argument('--multi_vocab_size', type=int,
                      default=DEFAULT_MULTI_VOCAB_SIZE,
                      help='Pieces in the multilingual (xx) model.')
  parser.add_argument('--en_vocab_size', type=int,
                      default=DEFAULT_EN_VOCAB_SIZE,
                      help='Pieces in the English model.')
  parser.add_argument('--shared_vocab_size', type=int,
                      default=DEFAULT_SHARED_VOCAB_SIZE,
                      help='Pieces in the shared (source + target) model.')
  parser.add_argument('--multi_character_coverage', type=float,
                      default=0.9995,
                      help='Character coverage of the xx model (CJK-safe).')
  parser.add_argument('--vocab_seed', type=int, default=DEFAULT_SEED,
                      help='SentencePiece random seed.')


def main(argv=None):
  """CLI: (re)trains the vocabularies of a prepared corpus directory."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('data_dir', help='Directory made by lingshard.data.'
                      'prepare (holding train.tsv).')
  AddFlags(parser)
  args = parser.parse_args(argv)
  try:
    saved = TrainVocabularies(
        args.data_dir, args.multi_vocab_size, args.en_vocab_size,
        args.multi_character_coverage, seed=args.vocab_seed,
        shared_vocab_size=args.shared_vocab_size)
  except corpus_io.CorpusError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  for key in sorted(saved):
    print(f'{saved[key]["model"]}: {saved[key]["actual_vocab_size"]} pieces '
          f'from {saved[key]["num_sentences"]} sentences')
  return 0


if __name__ == '__main__':
  sys.exit(main())
