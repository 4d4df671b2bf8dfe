"""The demo command trains a language model end to end (`python -m
lingshard.tools.demo --model=lm1b.TinyMoE`, as for lm1b.TinyMoELarge, the
configuration section 8 of docs/RESULTS.md finds better at equal
wall-clock), on an lm_prepare corpus of the standard library and for 2
steps: the trainer trains in TF graph mode, evaluates the whole dev split,
and the demo prints its perplexity next to a unigram model scored on the
same tokens."""

import math
import os
import re
import sysconfig

import numpy as np

from lingshard.data import lm_inputs
from lingshard.data import lm_prepare
from lingshard.tools import demo_lm
from tests.trainer import trainer_testlib


def test_lm_demo_trains_in_graph_mode_and_scores_dev_against_unigram(
    tmp_path):
  data_dir = str(tmp_path / 'lm_en')
  lm_prepare.Write(data_dir, *lm_prepare.Build(
      sysconfig.get_paths()['stdlib'], vocab_size=500, max_modules=300))
  logdir = str(tmp_path / 'log')
  run = trainer_testlib.RunModule(
      'lingshard.tools.demo', '--model=lm1b.TinyMoE', f'--data_dir={data_dir}',
      f'--logdir={logdir}', '--max_steps=2',
      '--params_override=input.bucket_upper_bounds=[64];'
      'input.bucket_batch_limits=[8]')
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  assert re.search(r'^step 2/2 loss \d+\.\d+', run.stdout, re.M), run.stdout
  assert 'strategy default: 1 replica(s), jit off' in run.stdout
  table = run.stdout.split('of the training tokens ==\n', 1)[1]
  head, row = table.splitlines()[:2]
  assert head.split()[-1] == 'pplx<unigram'
  split, tokens, log_pplx, pplx, unigram_pplx, _ = row.split()
  # Every dev sentence (all shorter than the 64-token bound) and its </s>.
  with open(os.path.join(data_dir, 'dev.txt'), encoding='utf-8') as f:
    dev = f.read().splitlines()
  assert (split, tokens) == ('dev', f'{sum(len(s.split()) + 1 for s in dev):,}')
  # The numbers of the evaluation's own metrics file.
  entry = demo_lm.LatestResult(logdir)['languages']['all']
  assert (log_pplx, pplx) == (f'{entry["log_pplx"]:.3f}',
                              f'{math.exp(entry["log_pplx"]):.2f}')
  # Two steps from a uniform start: near uniform over the vocabulary.
  words = lm_inputs.VocabWords(os.path.join(data_dir, 'vocab.txt'))
  assert abs(float(log_pplx) - math.log(len(words))) < 0.5, row
  # The unigram model of the training tokens, by a plain per-token loop.
  counts = demo_lm.UnigramCounts(os.path.join(data_dir, 'train.txt'), words)
  index = {w: i for i, w in enumerate(words)}
  total = sum(counts)
  log_p = [math.log((counts[index.get(w, lm_prepare.UNK_ID)] + 1) /
                    (total + len(words)))
           for s in dev for w in s.split()]
  log_p += [math.log((counts[lm_prepare.EOS_ID] + 1) / (total + len(words)))
            ] * len(dev)
  assert float(unigram_pplx) == round(math.exp(-np.mean(log_p)), 2)
  assert re.search(r'^model lm1b\.TinyMoE; step 2; training \d+\.\d min '
                   r'\(TF graph mode\)', run.stdout, re.M), run.stdout
