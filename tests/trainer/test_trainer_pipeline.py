"""The trainer on the pipelined twin of m4.TinyDense (GPipe), on the corpus
prepared by lingshard.data.prepare: it trains, and a micro-batch count that
does not divide the batch is one line naming both numbers."""

import os
import pathlib

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from lingshard import base_input
from lingshard import config_check
from lingshard import trainer
from lingshard.train import eval_loop
from tests.trainer import trainer_testlib

MODEL = 'gpipe.TinyDensePipelined'


def _Overrides(prepared_dir, batch):
  vocab = os.path.join(prepared_dir, 'vocab', 'spm_shared.model')
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  return ';'.join([
      f"input.file_pattern='{prepared_dir}/train.tsv'",
      f"input.src_vocab='{vocab}'", f"input.tgt_vocab='{vocab}'",
      'input.bucket_upper_bounds=[64]', f'input.bucket_batch_limits=[{batch}]',
      f'task.src_vocab_size={size}', f'task.tgt_vocab_size={size}'])


def _Execute(*args):
  lines = []
  out = trainer.Execute(trainer_testlib.ParseFlags(*args),
                        printer=lines.append)
  return out, lines


def test_trains_the_pipelined_tiny_dense(prepared_dir, tmp_path):
  out, lines = _Execute(f'--model={MODEL}', f'--logdir={tmp_path}',
                        '--mode=train', '--max_steps=2',
                        '--params_override=' + _Overrides(prepared_dir, 8))
  assert lines[-1].startswith('step 2/2 loss '), lines[-3:]
  assert np.isfinite(out['loss'][0])


def test_micro_batches_not_dividing_the_batch_is_one_line(prepared_dir,
                                                          tmp_path):
  overrides = (_Overrides(prepared_dir, 8) +
               ';task.pipeline_tpl.num_micro_batches=3')
  # config_check refuses it before anything is built.
  # (micro_batches.NumMicroBatches, the pipeline's own rule).
  message = ('input.bucket_batch_limits[0]=8: model/dec/pipeline: '
             'num_micro_batches 3 does not divide the batch 8; use a divisor '
             'of 8')
  with pytest.raises(config_check.ConfigCheckError) as e:
    _Execute(f'--model={MODEL}', f'--logdir={tmp_path}', '--mode=train',
             '--max_steps=1', f'--params_override={overrides}')
  assert str(e.value) == message
  # The CLI prints it as one line and exits 1.
  run = trainer_testlib.RunTrainer(f'--model={MODEL}',
                                   f'--logdir={tmp_path / "cli"}',
                                   '--mode=train', '--max_steps=1',
                                   f'--params_override={overrides}')
  assert run.returncode == 1, run.stderr[-3000:]
  assert run.stderr.rstrip().splitlines()[-1] == (
      f'lingshard.trainer: error: {message}')


def _Unpipelined(params):
  """`params` with both stacks unpipelined (same layers, same mesh) and
  the einsum dispatch the pipeline bodies use (gather computes the same)."""
  params = params.Copy()
  params.task.pipeline_tpl = None
  params.task.moe_tpl.dispatch_impl = 'einsum'
  return params


def _UnpipelinedTheta(task, theta):
  """The unpipelined model's theta holding pipelined `task`'s weights: each
  stack's per-layer thetas (TransformerStack.Layers) in place of its
  stacked pipeline weights."""
  out = theta.Transform(lambda v: tf.convert_to_tensor(v))
  for name in ('enc', 'dec'):
    stack = out[name]
    stack.layer = [t for _, t in getattr(task, name).Layers(stack)]
    del stack['pipeline']
  return out


# Per-group averages (GShard's group loss, the router z-loss) and the aux
# loss made of them: the pipeline's differ from the unpipelined model's
# (test_pipelined_moe_aux_is_the_unpipelined_one).
_PER_GROUP_AUX = ('_aux_loss', '_group_aux', '_router_z_loss')


def _Base(prepared_dir, logdir):
  """gpipe.TinyMoEPipelined's flags; the second expert `all`: `random`
  draws are keyed by layer path, which differs between a pipeline body and
  a stack layer, so only `all` routes both models alike."""
  return ['--model=gpipe.TinyMoEPipelined', f'--logdir={logdir}',
          '--params_override=' + _Overrides(prepared_dir, 16) +
          ";task.decode.max_decode_len=8"
          ";task.moe_tpl.second_expert_policy='all'",
          '--eval_params_override=' + ';'.join([
              f"input.file_pattern='{prepared_dir}/dev_seen_en.tsv'",
              'input.bucket_upper_bounds=[64]',
              'input.bucket_batch_limits=[16]'])]


def _UnpipelinedFirstStep(base):
  """The unpipelined model's metrics of the trainer's first step: the
  initial weights on the first batch (metric names as the trainer's)."""
  params, _ = trainer.BuildParams(trainer_testlib.ParseFlags(*base))
  model = params.Instantiate()
  batch = base_input.NumericBatch(next(iter(model.GetInput().GetDataset())))
  plain = _Unpipelined(params).task.Instantiate()
  metrics, _, _ = plain.LossAndGradients(
      _UnpipelinedTheta(model.task, model.task.theta), batch,
      step=tf.constant(1, tf.int64))
  return metrics, model, batch


@pytest.fixture(scope='module')
def first_step(prepared_dir, tmp_path_factory):
  """(flags, the trainer's step-1 metrics, the unpipelined model's first
  step metrics) of gpipe.TinyMoEPipelined trained op by op for one step in
  a module log directory: shared by the two tests below (each computed
  it)."""
  base = _Base(prepared_dir, tmp_path_factory.mktemp('moe_pipelined'))
  out, lines = _Execute(*base, '--mode=train', '--max_steps=1')
  metrics, _, _ = _UnpipelinedFirstStep(base)
  return base, out, lines, metrics


@pytest.mark.xfail(strict=True, reason=(
    'found by this test: with M = 4 micro-batches and padded rows the '
    'pipeline\'s per-group aux differs from the unpipelined model\'s (and '
    'the pipeline\'s with M = 1), e.g. enc_layer_001_aux_loss 0.020945 vs '
    '0.020843 on the trainer\'s first step; the token loss agrees to 1e-7, '
    'and without padding all agree: per-group means combined over '
    'micro-batches by real-token weight'))
def test_pipelined_moe_aux_is_the_unpipelined_one(first_step):
  # The trainer's first step: the pipelined model's LossAndGradients on
  # the initial weights and the first batch.
  _, got, _, metrics = first_step
  np.testing.assert_allclose(got['loss'][0], metrics.loss[0], rtol=1e-5)
  for name, (value, _) in metrics.items():
    if name.endswith(_PER_GROUP_AUX):
      np.testing.assert_allclose(got[name][0], value, rtol=1e-5,
                                 err_msg=name)


def test_pipelined_moe_trains_evaluates_decodes_and_exports(first_step):
  """gpipe.TinyMoEPipelined (GShard inside GPipe) through the trainer:
  train op by op, then one XLA-compiled (--jit) step, eval, decode (the
  same weights unpipelined) and export; every MoE layer reports its own
  routing metrics. The first step's loss and routing metrics, and the
  eval's, are the unpipelined model's on the same weights and batches."""
  base, out, lines, metrics = first_step
  tmp_path = pathlib.Path(base[1].split('=', 1)[1])
  assert lines[-1].startswith('step 1/1 loss '), lines[-3:]
  layers = sorted({k.split('_frac_dispatched_2')[0] for k in out
                   if k.endswith('_frac_dispatched_2')})
  assert layers == ['dec_layer_001', 'dec_layer_003', 'enc_layer_001',
                    'enc_layer_003']
  # Step 1 = the initial weights on the first batch, unpipelined.
  compared = 0
  for name, (value, _) in metrics.items():
    if np.size(value) == 1 and not name.endswith(_PER_GROUP_AUX):
      np.testing.assert_allclose(out[name][0], float(value), rtol=1e-5,
                                 atol=1e-6, err_msg=name)
      compared += 1
  assert compared > 20, sorted(out)  # loss and every layer's routing.
  out, lines = _Execute(*base, '--mode=train', '--max_steps=2', '--jit')
  assert lines[-1].startswith('step 2/2 loss '), lines[-3:]
  assert np.isfinite(out['loss'][0]) and np.isfinite(out['grad_norm'][0])
  result, lines = _Execute(*base, '--mode=eval')
  assert any('log_pplx' in line for line in lines), lines[-5:]
  # The eval of the step-2 checkpoint, unpipelined on the same dev batches.
  cfg = trainer_testlib.ParseFlags(*base, '--mode=eval')
  eval_params, _ = trainer.BuildParams(cfg, cfg.eval_dataset, for_eval=True)
  theta, step = trainer.RestoredTheta(eval_params, str(tmp_path))
  want = eval_loop.Evaluator(
      trainer.InferenceTask(_Unpipelined(eval_params)),
      eval_params.input.Instantiate()).Evaluate(
          _UnpipelinedTheta(trainer.InferenceTask(eval_params), theta), step)
  assert step == result['step'] == 2
  assert sorted(result['metrics']) == sorted(want['metrics'])
  for name, value in want['metrics'].items():
    np.testing.assert_allclose(result['metrics'][name], value, rtol=1e-5,
                               err_msg=name)
  assert sorted(result['languages']) == sorted(want['languages'])
  for lang, entry in want['languages'].items():
    np.testing.assert_allclose(result['languages'][lang]['log_pplx'],
                               entry['log_pplx'], rtol=1e-5, err_msg=lang)
  _Execute(*base, '--mode=decode')
  assert os.listdir(tmp_path / 'decode_dev_seen_en')
  _Execute(*base, '--mode=export')
  assert os.path.exists(tmp_path / 'export' / '00000002' /
                        'saved_model.pb')
