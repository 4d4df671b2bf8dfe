"""The trainer on lm1b.TinyMoE (Shazeer et al. 2017 App. C, CPU-sized) on
the real lm_prepare corpus (the standard library's English prose): dev
perplexity falls during a short training, and TensorBoard gets perplexity
and each expert's load."""

import glob
import json
import math
import os
import sysconfig

import pytest

from lingshard import trainer
from lingshard.data import lm_inputs
from lingshard.data import lm_prepare
from tests.trainer import trainer_testlib

MODEL = 'lm1b.TinyMoE'
NUM_EXPERTS = 16


@pytest.fixture(scope='module')
def lm_corpus(tmp_path_factory):
  """The default `lm_prepare` corpus (vocabulary cut to 2,000 words)."""
  out = str(tmp_path_factory.mktemp('lm') / 'lm_en')
  data, words, stats = lm_prepare.Build(sysconfig.get_paths()['stdlib'],
                                        vocab_size=2000)
  lm_prepare.Write(out, data, words, stats)
  return out, len(lm_inputs.VocabWords(os.path.join(out, 'vocab.txt')))


def _Overrides(corpus, vocab_size):
  return ';'.join([
      f"input.file_pattern='{corpus}/train.txt'",
      f"input.vocab='{corpus}/vocab.txt'",
      f'task.vocab_size={vocab_size}',
      # One training shape: one trace of the step.
      'input.bucket_upper_bounds=[32]', 'input.bucket_batch_limits=[32]',
      'task.train.warmup_steps=10', 'task.train.eval_interval_steps=20',
      'task.train.eval_num_batches=6', 'task.train.summary_interval_steps=5'])


def test_dev_perplexity_falls_and_summaries_show_perplexity_and_load(
    lm_corpus, tmp_path):
  corpus, vocab_size = lm_corpus
  lines = []
  trainer.Execute(trainer_testlib.ParseFlags(
      f'--model={MODEL}', f'--logdir={tmp_path}', '--mode=train_and_eval',
      '--max_steps=60', f'--eval_params_override='
      f"input.file_pattern='{corpus}/dev.txt';input.vocab='{corpus}/vocab.txt'",
      '--params_override=' + _Overrides(corpus, vocab_size)),
                  printer=lines.append)
  evals = []
  for path in sorted(glob.glob(str(tmp_path / 'eval_dev' / 'metrics-*.json'))):
    with open(path, encoding='utf-8') as f:
      evals.append(json.load(f))
  assert [e['step'] for e in evals] == [20, 40, 60], lines[-5:]
  log_pplx = [e['metrics']['log_pplx'] for e in evals]
  # Falls at every evaluation, from near the uniform log V.
  assert log_pplx[0] < math.log(vocab_size)
  assert log_pplx[0] > log_pplx[1] > log_pplx[2], log_pplx
  assert log_pplx[2] < log_pplx[0] - 0.1, log_pplx
  # The corpus perplexity per language ('all'), exp(per-word NLL).
  entry = evals[-1]['languages']['all']
  assert math.isclose(entry['pplx'], math.exp(entry['log_pplx']),
                      rel_tol=1e-9)
  train = trainer_testlib.Events(str(tmp_path / 'train'))
  for tag in ['log_pplx', 'pplx', 'aux_loss', 'moe_cv_importance',
              'moe_cv_load', 'moe_max_over_mean_load'] + [
                  f'moe_load/{e:03d}' for e in range(NUM_EXPERTS)]:
    assert tag in train, (tag, sorted(train))
  loads = [float(train[f'moe_load/{e:03d}'][-1][1])
           for e in range(NUM_EXPERTS)]
  assert all(x > 0 for x in loads), loads
  dev = trainer_testlib.Events(str(tmp_path / 'eval_dev'))
  assert 'lang/all/pplx' in dev and 'log_pplx' in dev, sorted(dev)
