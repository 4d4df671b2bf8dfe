"""The demo's language-model path (`python -m lingshard.tools.demo
--model=lm1b.<Name>`): real English prose -> MoE LSTM LM -> dev perplexity.

1. prepares the model's corpus if it is missing (`lingshard.data.
   lm_prepare`; `--sources=large` for data/lm_en_large),
2. trains the model with the trainer binary for a bounded time, in TF graph
   mode unless --jit (graph mode is where docs/RESULTS.md section 8 finds
   `lm1b.TinyMoELarge` better than its FLOP-matched `lm1b.TinyLSTMLarge`
   at equal wall-clock),
3. evaluates the latest checkpoint on the whole dev split (`--mode=eval`),
4. prints dev perplexity per word (</s> included) next to a unigram model
   of the training words, scored on the very tokens the evaluation read.
"""

import collections
import json
import math
import os
import time

import numpy as np

from lingshard import model_registry
from lingshard.data import lm_inputs
from lingshard.data import lm_prepare

SPLIT = 'dev'


def IsLm(model):
  """True if the registered `model` reads an lm_prepare corpus."""
  return issubclass(model_registry.GetParams(model, 'Train').input.cls,
                    lm_inputs.LmInput)


def UnigramCounts(train_path, words):
  """[V] counts of the training tokens (every word, OOV as <unk>, and one
  </s> per non-empty sentence), the tokens the LM learns to predict."""
  index = {w: i for i, w in enumerate(words)}
  counts = collections.Counter()
  with open(train_path, encoding='utf-8') as f:
    for line in f:
      line = line.strip()
      if line:
        counts.update(index.get(w, lm_prepare.UNK_ID) for w in line.split(' '))
        counts[lm_prepare.EOS_ID] += 1
  v = np.zeros([len(words)], np.int64)
  for i, c in counts.items():
    v[i] = c
  return v


def EvalLabels(model, data_dir):
  """The labels the dev evaluation scores (real tokens only), read through
  the model's own Dev input (LmInput: truncation, <unk>, </s>)."""
  p = model_registry.GetParams(model, 'Dev').input.Copy().Set(
      file_pattern=os.path.join(data_dir, f'{SPLIT}.txt'),
      vocab=os.path.join(data_dir, 'vocab.txt'))
  labels = []
  for batch in p.Instantiate().GetDataset():
    real = batch.paddings.numpy() == 0.0
    labels.append(batch.labels.numpy()[real])
  return np.concatenate(labels)


def UnigramLogPplx(counts_v, labels):
  """Mean -log p(label) under the add-one smoothed unigram model
  p(w) = (c(w) + 1) / (N + V)."""
  log_p_v = np.log(counts_v + 1.0) - math.log(counts_v.sum() + len(counts_v))
  return float(-log_p_v[labels].mean())


def Overrides(data_dir, vocab_size, extra=''):
  """--params_override reading `data_dir`: its train split, its vocabulary
  and its `vocab_size`."""
  return ';'.join(o for o in (
      f"input.file_pattern='{data_dir}/train.txt'",
      f"input.vocab='{data_dir}/vocab.txt'", f'task.vocab_size={vocab_size}',
      extra) if o)


def LatestResult(logdir):
  """The latest `eval_dev/metrics-<step>.json` of `logdir`."""
  out_dir = os.path.join(logdir, f'eval_{SPLIT}')
  names = sorted(n for n in os.listdir(out_dir) if n.startswith('metrics-'))
  with open(os.path.join(out_dir, names[-1]), encoding='utf-8') as f:
    return json.load(f)


def ScoreTable(result, unigram_log_pplx, num_labels):
  """The demo's table: dev words, log-pplx and pplx of the model and of
  the unigram model."""
  entry = result['languages']['all']
  if round(entry['weight']) != num_labels:
    raise RuntimeError(f'the evaluation scored {entry["weight"]:.0f} tokens, '
                       f'the unigram model {num_labels}')
  log_pplx = entry['log_pplx']
  head = (f'{"split":<7}{"tokens":>9}{"log_pplx":>10}{"pplx":>9}'
          f'{"unigram_pplx":>14}  pplx<unigram')
  row = (f'{SPLIT:<7}{num_labels:>9,d}{log_pplx:>10.3f}'
         f'{math.exp(log_pplx):>9.2f}{math.exp(unigram_log_pplx):>14.2f}  '
         f'{"yes" if log_pplx < unigram_log_pplx else "NO"}')
  return head + '\n' + row


def RunDemo(model, data_dir, logdir, train_args, extra_overrides, run):
  """The LM demo's steps (module docstring); `run(args)` runs `python -m
  args`. Returns (table text, evaluated step, training seconds)."""
  if not os.path.exists(os.path.join(data_dir, 'train.txt')):
    run(lm_prepare.PrepareArgs(data_dir))
  words = lm_inputs.VocabWords(os.path.join(data_dir, 'vocab.txt'))
  overrides = Overrides(data_dir, len(words), extra_overrides)
  base = ['lingshard.trainer', f'--model={model}', f'--logdir={logdir}',
          f'--params_override={overrides}']
  train_start = time.time()
  if train_args:
    run(base + ['--mode=train'] + train_args)
  train_seconds = time.time() - train_start
  run(base + ['--mode=eval', '--eval_params_override='
              f"input.file_pattern='{data_dir}/{SPLIT}.txt'"])
  result = LatestResult(logdir)
  labels = EvalLabels(model, data_dir)
  unigram = UnigramLogPplx(
      UnigramCounts(os.path.join(data_dir, 'train.txt'), words), labels)
  table = ScoreTable(result, unigram, len(labels))
  return table, result['step'], train_seconds
