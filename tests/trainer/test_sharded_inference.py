"""`--mode=eval` and `--mode=decode` run under the training job's strategy
and mesh (strategies.Replicated): on this host's default strategy they are
the one-device programs they were (metrics JSON and hypothesis files equal
bit for bit to the task's FProp / Decode run as before), under
MirroredStrategy over 2 virtual CPU devices they give one device's metrics
and hypotheses, and a strategy this host cannot build is training's one
line.

The model is m4.TinyMoE shrunk (1 + 1 MoE layers of 8 experts over the
mesh 8 (x)), its checkpoint the initial weights moved by seeded noise (no
training step: a fresh model could not draw them). Eval covers every
dev_unseen_en example in batches of 4, so the last batch (1 row) does not
split over 2 replicas; decode is beam search (k = 4) with its cache.
"""

import collections
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from lingshard import base_input
from lingshard import config_check
from lingshard import sharding
from lingshard import trainer
from lingshard.models import mt_decoder
from lingshard.train import strategies
from lingshard.train import train_loop
from tests.trainer import trainer_testlib

MODEL = 'm4.TinyMoE'
SPLIT = 'dev_unseen_en'
HELPER = 'tests.trainer.sharded_inference_helper'


def _Args(prepared_dir, logdir):
  overrides = ';'.join(trainer_testlib.CorpusOverrides(prepared_dir, 16, 8) + [
      'task.num_encoder_layers=1', 'task.num_decoder_layers=1',
      'task.encoder_moe_layers=[0]', 'task.decoder_moe_layers=[0]',
      'task.model_dim=32', 'task.hidden_dim=32', 'task.num_heads=2',
      'task.dim_per_head=16', 'task.decode.max_decode_len=12', 'task.decode.jit=False',
      'task.train.eval_num_batches=0'])
  dev = ';'.join([f"input.file_pattern='{prepared_dir}/{SPLIT}.tsv'",
                  'input.bucket_upper_bounds=[16]', 'input.eval_batch_size=4'])
  return [f'--model={MODEL}', f'--logdir={logdir}',
          f'--params_override={overrides}', f'--eval_params_override={dev}']


@pytest.fixture(name='runs', scope='module')
def RunsFixture(prepared_dir, tmp_path_factory):
  """(args, lines) of the default strategy's eval + decode in this process
  and the mirrored run's subprocess (started first, on a copy of the
  checkpoint)."""
  logdir = str(tmp_path_factory.mktemp('sharded') / 'log')
  args = _Args(prepared_dir, logdir)
  params, _ = trainer.BuildParams(trainer_testlib.ParseFlags(*args))
  one = train_loop.Trainer(params, logdir, printer=lambda _: None)
  state = one.state
  rng = np.random.default_rng(0)
  for var in state.ThetaByPath().values():
    var.assign(var + rng.normal(scale=0.2, size=var.shape).astype(
        var.dtype.as_numpy_dtype))
  state.step.assign(3)
  one.checkpointer.Save(3)
  mirrored_dir = logdir + '_mirrored'
  shutil.copytree(logdir, mirrored_dir)
  proc = subprocess.Popen(
      [sys.executable, '-m', HELPER] + _Args(prepared_dir, mirrored_dir),
      env=trainer_testlib.TrainerEnv(), cwd=trainer_testlib.REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  lines = []
  for mode in ('eval', 'decode'):
    trainer.Execute(trainer_testlib.ParseFlags(*args, f'--mode={mode}'),
                    printer=lines.append)
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  return args, lines, mirrored_dir, out.splitlines()


def _Outputs(logdir):
  """(eval metrics JSON, {lang: hypotheses}, decode scores JSON)."""
  with open(os.path.join(logdir, 'eval_dev', 'metrics-00000003.json')) as f:
    metrics = json.load(f)
  decode_dir = os.path.join(logdir, f'decode_{SPLIT}')
  hyps = {}
  for name in sorted(os.listdir(decode_dir)):
    if name.endswith('.hyp.txt'):
      with open(os.path.join(decode_dir, name), encoding='utf-8') as f:
        hyps[name[:-len('.hyp.txt')]] = f.read().split('\n')[:-1]
  with open(os.path.join(decode_dir, 'scores.json')) as f:
    scores = json.load(f)
  return metrics, hyps, scores


def _OneDeviceEval(params, logdir):
  """The eval JSON of the task's FProp as eval ran it before strategies:
  one op-by-op tf.function per batch on the read theta, sums in order."""
  theta, step = trainer.RestoredTheta(params, logdir)
  theta = theta.Transform(lambda v: v.read_value())
  task = trainer.InferenceTask(params)
  fprop = sharding.Function(lambda th, b, s: task.FProp(th, b, step=s),
                            xla_compiled=False)
  sums, weights = collections.defaultdict(float), collections.defaultdict(
      float)
  langs = collections.defaultdict(lambda: [0.0, 0.0, 0])
  for batch in params.input.Instantiate().GetDataset():
    metrics, per_example = fprop(theta, base_input.NumericBatch(batch),
                                 tf.constant(step, tf.int64))
    for name, (v, w) in metrics.items():
      if np.size(v) == 1:
        sums[name] += float(v) * float(w)
        weights[name] += float(w)
    for lang, x, w in zip(batch.lang.numpy(), per_example.nll.numpy(),
                          per_example.num_tokens.numpy()):
      acc = langs[lang.decode('utf-8')]
      acc[0] += float(x)
      acc[1] += float(w)
      acc[2] += 1
  entries = {lang: {'loss': t / w, 'log_pplx': t / w,
                    'pplx': math.exp(t / w), 'weight': w, 'examples': n}
             for lang, (t, w, n) in langs.items()}
  return {'step': int(step), 'languages': entries,
          'metrics': {k: sums[k] / weights[k] for k in sums}}


def _OneDeviceHypotheses(params, logdir):
  """{lang: hypotheses} of task.Decode as decode ran it before strategies:
  one op-by-op tf.function (decode.jit off) per batch of 4, the last row
  repeated."""
  theta, _ = trainer.RestoredTheta(params, logdir)
  theta = theta.Transform(lambda v: v.read_value())
  task = trainer.InferenceTask(params)
  assert not task.params.decode.jit and task.params.decode.beam_size == 4
  search = sharding.Function(lambda th, i, p: task.Decode(th, i, p),
                             xla_compiled=False)
  detok = mt_decoder.Detokenizer(params.input.tgt_vocab)
  hyps = collections.defaultdict(list)
  for batch in params.input.Instantiate().GetDataset():
    rows = int(batch.src.ids.shape[0])
    ids, pads = (np.concatenate([t, np.repeat(t[-1:], 4 - rows, 0)])
                 for t in (batch.src.ids.numpy(), batch.src.paddings.numpy()))
    out, lengths = mt_decoder.BestHypotheses(search(theta, ids, pads))
    for lang, row, n in zip(batch.lang.numpy(), out, lengths):
      hyps[lang.decode('utf-8')].append(detok(row[:n]))
  return dict(hyps)


def test_default_strategy_keeps_the_one_device_results(runs):
  args, lines, _, _ = runs
  logdir = args[1].split('=', 1)[1]
  assert lines.count('eval under strategy default: 1 replica(s) on mesh 8 '
                     '(x)') == 1
  assert 'decode under strategy default: 1 replica(s) on mesh 8 (x)' in lines
  metrics, hyps, _ = _Outputs(logdir)
  cfg = trainer_testlib.ParseFlags(*args)
  params, _ = trainer.BuildParams(cfg, 'Dev', for_eval=True)
  want = _OneDeviceEval(params, logdir)
  assert sum(e['examples'] for e in want['languages'].values()) == 17
  assert metrics == want  # Bit for bit: every float equal.
  want = _OneDeviceHypotheses(params, logdir)
  assert sum(map(len, want.values())) == 17
  assert len(set(sum(want.values(), []))) > 5  # Not one answer to all.
  assert hyps == want


# Statistics of the tokens one program sees together (CVs and max / mean of
# the experts' load, the aux losses of the gates, and the loss, which adds
# them): across replicas, the replicas' means, as in training
# (step.CrossReplicaSum); every other metric is per token.
BATCH_STATISTICS = ('cv_importance', 'cv_load', 'max_over_mean_load',
                    'aux_loss')


def test_mirrored_two_devices_match_one_device(runs):
  args, _, mirrored_dir, lines = runs
  phrase = ('strategy mirrored: 2 replica(s) of one device, mesh 8 (x) not '
            'partitioned')
  assert f'eval under {phrase}' in lines and f'decode under {phrase}' in lines
  one_metrics, one_hyps, one_scores = _Outputs(args[1].split('=', 1)[1])
  metrics, hyps, scores = _Outputs(mirrored_dir)
  assert hyps == one_hyps
  assert scores == one_scores
  assert sorted(metrics['metrics']) == sorted(one_metrics['metrics'])
  per_token = [k for k in one_metrics['metrics'] if k != 'loss' and
               not k.endswith(BATCH_STATISTICS)]
  assert len(per_token) >= 20 and 'log_pplx' in per_token  # Routing too.
  for name in per_token:
    np.testing.assert_allclose(metrics['metrics'][name],
                               one_metrics['metrics'][name], rtol=1e-5,
                               atol=1e-7, err_msg=name)
  assert metrics['languages'].keys() == one_metrics['languages'].keys()
  for lang, entry in one_metrics['languages'].items():
    got = metrics['languages'][lang]
    assert (got['examples'], got['weight']) == (entry['examples'],
                                                entry['weight'])
    np.testing.assert_allclose(got['log_pplx'], entry['log_pplx'], rtol=1e-5)


def _Errors(base, modes, error):
  """The messages of `error` that Execute raises in each mode."""
  out = []
  for mode in modes:
    with pytest.raises(error) as e:
      trainer.Execute(trainer_testlib.ParseFlags(*base, f'--mode={mode}'),
                      printer=lambda _: None)
    out.append(str(e.value))
  return out


def test_a_strategy_this_host_cannot_build_is_trainings_error(tmp_path):
  """--strategy=tpu without --tpu for GShard's 600B-weight model: eval and
  decode build the strategy as training does and refuse it in training's
  words (they refused the host's memory before, though TPU weights live on
  the slice), before restoring or writing anything."""
  base = ['--model=m4.MoE2048E36L', f'--logdir={tmp_path}', '--strategy=tpu']
  errors = _Errors(base, ('train', 'eval', 'decode'),
                   strategies.StrategyError)
  assert errors == 3 * [
      '--strategy=tpu needs --tpu (a TPU name, or "local" on a TPU VM)']
  assert not os.listdir(tmp_path)


def test_a_mesh_this_host_cannot_hold_is_trainings_error(tmp_path,
                                                         monkeypatch):
  """The same model on this host's default strategy: eval and decode refuse
  its weights as training does (host memory pinned at 16 GB); a config
  that does not fit its mesh is one line in every mode, print_params too."""
  monkeypatch.setattr(config_check, 'HostMemoryBytes', lambda: 16 << 30)
  base = ['--model=m4.MoE2048E36L', f'--logdir={tmp_path}']
  errors = _Errors(base, ('train', 'eval', 'decode'),
                   config_check.ConfigCheckError)
  assert errors == 3 * [
      "the model's weights take 2.3 TB (619,399,472,384 values) but this host "
      'has 16.0 GB of memory available; choose smaller sizes (e.g. '
      'task.model_dim) or a TPU slice (--strategy=tpu)']
  base = [f'--model={MODEL}', f'--logdir={tmp_path}',
          '--params_override=task.moe_tpl.num_experts=12']
  errors = _Errors(base, ('train', 'print_params', 'eval', 'decode'),
                   config_check.ConfigCheckError)
  assert errors == 4 * [
      'model/dec/layer_001/moe: num_experts=12 must be divisible by mesh '
      "axis 'x' of size 8 (experts are split over it)"]
  assert not os.listdir(tmp_path)
