"""The README demo: real multilingual data -> MoE Transformer -> BLEU/chrF.

  python -m lingshard.tools.demo [--model=m4.TinyMoE] [--train_seconds=720]
  python -m lingshard.tools.demo --model=lm1b.TinyMoELarge

A translation model (m4.*, gpipe.*):
1. prepares the model's corpus (`lingshard.data.prepare`, `--corpus=large`
   for data/ui_m4_large; skipped if present),
2. trains the model with the trainer binary for a bounded time (--jit),
3. decodes `dev_unseen_en` (English strings never seen in training) and
   `dev_seen_en` with beam search, once each,
4. prints BLEU / chrF for all pairs and for the placeholder-free subset next
   to the copy-the-source baseline.

A language model (lm1b.*): lingshard/tools/demo_lm.py (lm_prepare, training
in TF graph mode unless --jit, dev perplexity next to a unigram model).

An image classifier (gpipe.MnistResNet*): lingshard/tools/demo_image.py
(image_prepare, training for the model's own max_steps unless --max_steps,
test top-1 accuracy next to softmax regression on the pixels).

Every step is the ordinary CLI (`python -m lingshard.trainer ...`) run as a
subprocess; the commands are printed so they can be re-run by hand.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import os
import shlex
import subprocess
import sys
import time

from absl import flags

from lingshard import model_registry
from lingshard.data import corpus_io
from lingshard.data import splits
from lingshard.data import vocab
from lingshard.models import mt_decoder
from lingshard import cli
from lingshard.tools import demo_image
from lingshard.tools import demo_lm

FLAGS = flags.FlagValues()
flags.DEFINE_string('model', 'm4.TinyMoE', 'Registered model key.',
                    flag_values=FLAGS)
flags.DEFINE_string('data_dir', '', 'Prepared corpus directory; default the '
                    "model's own (data/ui_m4 for m4.TinyMoE).",
                    flag_values=FLAGS)
flags.DEFINE_string('logdir', '', 'Trainer logdir; default logs/demo/<model> '
                    '(a rerun resumes from its checkpoint).',
                    flag_values=FLAGS)
flags.DEFINE_integer('train_seconds', 720, 'Training time budget; 0 skips '
                     'training and scores the latest checkpoint.',
                     flag_values=FLAGS)
flags.DEFINE_integer('max_steps', 20000, 'Step cap (the time budget binds).',
                     flag_values=FLAGS)
flags.DEFINE_string('params_override', '', 'Extra trainer overrides.',
                    flag_values=FLAGS)
flags.DEFINE_bool('jit', None, 'XLA-compile the train step; default on for '
                  'translation, off (TF graph mode) for language models.',
                  flag_values=FLAGS)

DEV_SPLITS = (splits.DEV_UNSEEN, splits.DEV_SEEN)


class SubcommandError(Exception):
  """A step's command failed; it has printed its own (one-line) error."""

  def __init__(self, returncode):
    super().__init__(returncode)
    self.returncode = returncode


def _Run(args, printer=print):
  """Runs `python -m ...args`, streaming its output; SubcommandError on
  failure."""
  cmd = [sys.executable, '-m'] + args
  printer('$ ' + ' '.join(shlex.quote(a) for a in cmd), flush=True)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  returncode = subprocess.run(cmd, check=False, env=env).returncode
  if returncode:
    raise SubcommandError(returncode)


def VocabPaths(model, data_dir):
  """{'src_vocab': path, 'tgt_vocab': path}: the model's own vocabulary
  files (by name), taken from `data_dir`."""
  p = model_registry.GetParams(model, 'Train').input
  return {key: os.path.join(data_dir, vocab.VOCAB_DIR,
                            os.path.basename(p.Get(key)))
          for key in ('src_vocab', 'tgt_vocab')}


def _Records(decode_dir):
  """Reads `<lang>.{src,hyp,ref}.txt` back into decode Records."""
  records = []
  for name in sorted(os.listdir(decode_dir)):
    if not name.endswith('.hyp.txt'):
      continue
    lang = name[:-len('.hyp.txt')]
    cols = []
    for ext in ('src', 'hyp', 'ref'):
      with open(os.path.join(decode_dir, f'{lang}.{ext}.txt'),
                encoding='utf-8') as f:
        cols.append(f.read().split('\n')[:-1])
    records += [mt_decoder.Record(lang, s, h, r) for s, h, r in zip(*cols)]
  return records


def _NophRecords(records, data_dir, split):
  """The records whose (language, source) is in the placeholder-free file."""
  keep = {(row[0], row[1]) for row in corpus_io.ReadTsv(
      os.path.join(data_dir, f'{split}.noph.tsv'))}
  return [r for r in records if (r.language, r.source) in keep]


def ScoreTable(rows):
  """rows: [(split, subset, ScoreByLanguage(...))] -> text table.

  BLEU / chrF are averaged over languages; `pool` columns score all pairs
  as one corpus. `chrF>copy` compares the language-averaged chrF.
  """
  head = (f'{"split":<15}{"subset":<9}{"langs":>6}{"pairs":>7}{"BLEU":>7}'
          f'{"chrF":>7}{"copyBLEU":>10}{"copychrF":>10}{"poolchrF":>10}'
          f'{"copy":>7}  chrF>copy')
  lines = [head]
  for split, subset, scores in rows:
    s, p = scores['average'], scores['pooled']
    lines.append(f'{split:<15}{subset:<9}{s["languages"]:>6}{s["n"]:>7}'
                 f'{s["bleu"]:>7.2f}{s["chrf"]:>7.2f}{s["copy_bleu"]:>10.2f}'
                 f'{s["copy_chrf"]:>10.2f}{p["chrf"]:>10.2f}'
                 f'{p["copy_chrf"]:>7.2f}  '
                 f'{"yes" if s["chrf"] > s["copy_chrf"] else "NO"}')
  return '\n'.join(lines)


def DataDir(model):
  """The directory of the registered model's training corpus."""
  p = model_registry.GetParams(model, 'Train').input
  return os.path.dirname(p.file_pattern) or '.'


def TrainArgs(jit):
  """The trainer's training flags of this demo ([] if no training)."""
  if FLAGS.train_seconds <= 0:
    return []
  return ['--jit' if jit else '--nojit', f'--max_steps={FLAGS.max_steps}',
          f'--max_train_seconds={FLAGS.train_seconds}']


def MainLm(data_dir, logdir, start):
  """The language-model demo (demo_lm)."""
  train_args = TrainArgs(bool(FLAGS.jit))
  table, step, train_seconds = demo_lm.RunDemo(
      FLAGS.model, data_dir, logdir, train_args, FLAGS.params_override, _Run)
  print('\n== lingshard demo: dev perplexity per token (words and </s>) vs '
        'a unigram model of the training tokens ==')
  print(table)
  mode = ('no training' if not train_args else
          'XLA-compiled' if FLAGS.jit else 'TF graph mode')
  print(f'\nmodel {FLAGS.model}; step {step}; training '
        f'{train_seconds / 60:.1f} min ({mode}); total '
        f'{(time.time() - start) / 60:.1f} min')
  print(f'TensorBoard: tensorboard --logdir {logdir}')


def MainImage(data_dir, logdir, start):
  """The image-classification demo (demo_image)."""
  train_args = TrainArgs(FLAGS.jit is not False)
  if train_args and not FLAGS['max_steps'].present:
    train_args = [a for a in train_args if not a.startswith('--max_steps=')]
  table, step, train_seconds = demo_image.Run(
      FLAGS.model, data_dir, logdir, train_args, FLAGS.params_override, _Run)
  print('\n== lingshard demo: test top-1 accuracy on 1,000 held-out MNIST '
        'digits vs softmax regression on the pixels ==')
  print(table)
  print(f'\nmodel {FLAGS.model}; step {step}; training '
        f'{train_seconds / 60:.1f} min; total '
        f'{(time.time() - start) / 60:.1f} min')
  print(f'TensorBoard: tensorboard --logdir {logdir}')


def main(argv):
  """Runs the demo; a failed step's own error line is all that is printed
  (no traceback of ours after it), with its exit status (1 if killed)."""
  try:
    _Main(argv)
  except SubcommandError as e:
    sys.exit(e.returncode if e.returncode > 0 else 1)


def _Main(argv):
  del argv
  start = time.time()
  try:
    image = demo_image.IsImage(FLAGS.model)
    data_dir = FLAGS.data_dir or (demo_image.DataDir(FLAGS.model) if image
                                  else DataDir(FLAGS.model))
  except LookupError as e:  # An unregistered --model.
    sys.exit(f'demo: error: {e}')
  logdir = FLAGS.logdir or os.path.join('logs', 'demo', FLAGS.model)
  if image:
    MainImage(data_dir, logdir, start)
    return
  if demo_lm.IsLm(FLAGS.model):
    MainLm(data_dir, logdir, start)
    return
  vocab_paths = VocabPaths(FLAGS.model, data_dir)
  if not os.path.exists(os.path.join(data_dir, 'train.tsv')):
    _Run(corpus_io.PrepareArgs(data_dir))
  elif not all(os.path.exists(v) for v in vocab_paths.values()):
    # A corpus prepared before this model's vocabulary existed.
    _Run(['lingshard.data.vocab', data_dir])
  base = ['lingshard.trainer', f'--model={FLAGS.model}', f'--logdir={logdir}']
  overrides = ';'.join(o for o in (
      [f"input.file_pattern='{data_dir}/train.tsv'"] +
      [f"input.{k}='{v}'" for k, v in sorted(vocab_paths.items())] +
      [FLAGS.params_override]) if o)
  train_start = time.time()
  train_args = TrainArgs(FLAGS.jit is not False)
  if train_args:
    _Run(base + ['--mode=train'] + train_args +
         [f'--params_override={overrides}'])
  train_seconds = time.time() - train_start
  rows = []
  for split in DEV_SPLITS:
    _Run(base + ['--mode=decode', f'--params_override={overrides}',
                 f"--eval_params_override=input.file_pattern="
                 f"'{data_dir}/{split}.tsv'"])
    records = _Records(os.path.join(logdir, f'decode_{split}'))
    for subset, recs in (('all', records),
                         ('noph', _NophRecords(records, data_dir, split))):
      rows.append((split, subset, mt_decoder.ScoreByLanguage(recs)))
  print('\n== lingshard demo: BLEU / chrF (averaged over languages) vs '
        'copying the source ==')
  print(ScoreTable(rows))
  print(f'\nmodel {FLAGS.model}; training {train_seconds / 60:.1f} min; '
        f'total {(time.time() - start) / 60:.1f} min')
  print(f'hypotheses: {logdir}/decode_<split>/; TensorBoard: '
        f'tensorboard --logdir {logdir}')


if __name__ == '__main__':
  cli.RunMain(main, FLAGS)
