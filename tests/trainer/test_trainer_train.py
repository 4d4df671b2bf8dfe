"""Training on the toy model: loss falls, the step is pure, clipping,
bfloat16 activations, params.txt, summaries and the progress line."""

import glob
import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard import hyperparams
from lingshard import model_registry
from lingshard import platform
from lingshard import trainer
from lingshard.models import regression_model
from lingshard.nested_map import NestedMap
from lingshard.train import step as step_lib
from lingshard.train import strategies
from lingshard.train import train_loop
from tests.trainer import trainer_testlib


def _Params(**overrides):
  p = model_registry.GetParams('toy.FFRegression')
  p.task.train.Set(log_interval_steps=10, summary_interval_steps=10,
                   save_interval_steps=0)
  for k, v in overrides.items():
    p.Set(**{k: v})
  return p


def _DevLoss(task, theta, n=4):
  """Loss on held-out batches of the training teacher (indices never
  reached by training)."""
  gen = regression_model.RegressionInput(
      regression_model.RegressionInput.Params())
  losses = [float(task.FProp(theta, gen.GetBatch(10**6 + i))[0].loss[0])
            for i in range(n)]
  return float(np.mean(losses))


def test_few_steps_reduce_loss(tmp_path):
  lines = []
  t = train_loop.Trainer(_Params(**{'task.train.max_steps': 60}),
                         str(tmp_path), printer=lines.append)
  before = _DevLoss(t.task, t.ThetaValues())
  t.Train()
  after = _DevLoss(t.task, t.ThetaValues())
  assert after < 0.6 * before, (before, after)
  assert int(t.state.step.numpy()) == 60
  # Progress lines every 10 steps: step, loss, speed, ETA.
  assert len(lines) == 6
  assert re.fullmatch(r'step 60/60 loss \d+\.\d{6} steps/s \d+\.\d\d '
                      r'examples/s \d+(\.\d)?k? ETA 0:00:00', lines[-1]), lines
  # Final checkpoint.
  assert tf.train.latest_checkpoint(str(tmp_path / 'train')).endswith(
      'ckpt-60')


def test_step_is_a_pure_function():
  p = _Params()
  task = p.task.Instantiate()
  step = step_lib.TrainStep(task)
  theta = task.theta.Transform(lambda v: tf.identity(v.read_value()))
  opt_state = step.InitOptState(theta)
  batch = p.input.Instantiate().GetBatch(0)
  before = [v.numpy() for v in task.vars.Flatten()]
  out1 = step(theta, opt_state, batch, tf.constant(3, tf.int64))
  out2 = step(theta, opt_state, batch, tf.constant(3, tf.int64))
  for a, b in zip(tf.nest.flatten(out1), tf.nest.flatten(out2)):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  # Variables untouched; theta' differs from theta.
  for v, b in zip(task.vars.Flatten(), before):
    np.testing.assert_array_equal(v.numpy(), b)
  assert not np.array_equal(out1[0].fc[0].w.numpy(), theta.fc[0].w.numpy())
  metrics = out1[2]
  assert sorted(metrics) == ['grad_norm', 'is_finite', 'learning_rate', 'loss',
                             'mse', 'num_examples', 'num_tokens']
  assert float(metrics.num_examples[0]) == 64
  assert float(metrics.is_finite[0]) == 1.0


def test_jit_step_matches_graph_step():
  p = _Params()
  task = p.task.Instantiate()
  theta = task.theta.Transform(lambda v: v.read_value())
  batch = p.input.Instantiate().GetBatch(0)
  outs = []
  for jit in (False, True):
    step = step_lib.TrainStep(task, jit=jit)
    outs.append(step(theta, step.InitOptState(theta), batch,
                     tf.constant(0, tf.int64)))
  for a, b in zip(tf.nest.flatten(outs[0]), tf.nest.flatten(outs[1])):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_global_norm_clipping():
  p = _Params(**{'task.train.optimizer': 'sgd',
                 'task.train.learning_rate': 0.5,
                 'task.train.clip_gradient_norm_to_value': 1e-3})
  task = p.task.Instantiate()
  step = step_lib.TrainStep(task)
  theta = task.theta.Transform(lambda v: v.read_value())
  new_theta, _, metrics = step(theta, step.InitOptState(theta),
                               p.input.Instantiate().GetBatch(0),
                               tf.constant(0, tf.int64))
  assert float(metrics.grad_norm[0]) > 1e-2  # Reported before clipping.
  delta = tf.linalg.global_norm([a - b for a, b in zip(
      new_theta.Flatten(), theta.Flatten())])
  np.testing.assert_allclose(float(delta), 0.5 * 1e-3, rtol=1e-4)


def test_non_finite_step_changes_nothing():
  p = _Params()
  task = p.task.Instantiate()
  step = step_lib.TrainStep(task, inject_nan_at_step=1)
  theta = task.theta.Transform(lambda v: v.read_value())
  state = step.InitOptState(theta)
  new_theta, new_state, metrics = step(
      theta, state, p.input.Instantiate().GetBatch(0),
      tf.constant(0, tf.int64))
  assert float(metrics.is_finite[0]) == 0.0
  assert np.isnan(float(metrics.loss[0]))
  for a, b in zip(tf.nest.flatten((new_theta, new_state)),
                  tf.nest.flatten((theta, state))):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_bfloat16_activations_float32_weights(tmp_path):
  # bfloat16 matmuls are slow on CPU: a small batch.
  p = _Params(**{'task.train.max_steps': 40, 'input.batch_size': 16})
  p.FromText('task.fprop_dtype : tf.bfloat16')
  t = train_loop.Trainer(p, str(tmp_path), printer=lambda _: None)
  assert t.task.fc[0].fprop_dtype == tf.bfloat16
  before = _DevLoss(t.task, t.ThetaValues())
  t.Train()
  after = _DevLoss(t.task, t.ThetaValues())
  assert {v.dtype for v in t.state.theta.Flatten()} == {tf.float32}
  assert after < 0.7 * before, (before, after)


class VectorMetricTask(regression_model.FeedForwardRegression):
  """The toy task plus a vector metric (like an MoE per-expert load)."""

  def ComputeLoss(self, theta, predictions, input_batch):
    metrics, per_example = super().ComputeLoss(theta, predictions,
                                               input_batch)
    load = tf.nn.softmax(tf.stack([tf.reduce_mean(predictions.y), 0.0, 1.0]))
    metrics.expert_load = (load, tf.constant(1.0))
    return metrics, per_example


def test_summaries(tmp_path):
  p = _Params(**{'task.train.max_steps': 20})
  task_p = VectorMetricTask.Params()
  for key, value in p.task:
    if key != 'cls':
      task_p.Set(**{key: value})
  p.task = task_p
  train_loop.Trainer(p, str(tmp_path), printer=lambda _: None).Train()
  events = trainer_testlib.Events(str(tmp_path / 'train'))
  for tag in ('loss', 'mse', 'learning_rate', 'grad_norm', 'is_finite',
              'num_examples', 'steps_per_sec', 'examples_per_sec',
              'tokens_per_sec', 'expert_load/000', 'expert_load/002'):
    assert [s for s, _, _ in events[tag]] == [10, 20], tag
    assert events[tag][0][2] == 'scalars'
  np.testing.assert_allclose(events['learning_rate'][0][1], 1e-2)
  assert events['num_examples'][0][1] == 64
  # The vector metric is also a histogram: [k, 3] buckets of 3 values.
  steps, hist, plugin = zip(*events['expert_load'])
  assert steps == (10, 20) and plugin[0] == 'histograms'
  assert hist[0].shape[1] == 3 and hist[0][:, 2].sum() == 3


def test_params_txt_and_override_diff(tmp_path):
  lines = []
  cfg = trainer_testlib.ParseFlags(
      '--model=toy.FFRegression', f'--logdir={tmp_path}', '--max_steps=3',
      '--params_override=task.train.learning_rate=0.05;input.batch_size=16')
  trainer.Execute(cfg, printer=lines.append)
  assert lines[1] == 'strategy default: 1 replica(s), jit off'
  assert lines[0] == (
      'Params changed from the registry defaults:\n'
      '-input.batch_size : 64\n'
      '+input.batch_size : 16\n'
      '-task.train.learning_rate : 0.01\n'
      '+task.train.learning_rate : 0.05\n'
      '-task.train.max_steps : 200\n'
      '+task.train.max_steps : 3')
  text = (tmp_path / 'params.txt').read_text()
  want = model_registry.GetParams('toy.FFRegression')
  want.Set(**{'input.batch_size': 16, 'task.train.learning_rate': 0.05,
              'task.train.max_steps': 3})
  assert text == want.ToText()
  assert hyperparams.TextDiff(
      model_registry.GetParams('toy.FFRegression').FromText(text), want) == ''


def test_resume_continues_from_checkpoint(tmp_path):
  p = _Params(**{'task.train.max_steps': 10})
  train_loop.Trainer(p, str(tmp_path), printer=lambda _: None).Train()
  lines = []
  t = train_loop.Trainer(_Params(**{'task.train.max_steps': 15}),
                         str(tmp_path), printer=lines.append)
  t.Train()
  assert int(t.state.step.numpy()) == 15
  assert lines == [lines[0]] and lines[0].startswith('step 15/15 ')


def test_metric_name_clash_is_an_error():
  class Clash(regression_model.FeedForwardRegression):

    def ComputeLoss(self, theta, predictions, input_batch):
      metrics, per_example = super().ComputeLoss(theta, predictions,
                                                 input_batch)
      metrics.grad_norm = metrics.loss
      return metrics, per_example

  p = _Params()
  task = Clash.Params().Set(name='model', input_dim=8).Instantiate()
  step = step_lib.TrainStep(task)
  theta = task.theta.Transform(lambda v: v.read_value())
  try:
    step.Pure(theta, step.InitOptState(theta),
              p.input.Instantiate().GetBatch(0), tf.constant(0, tf.int64))
  except ValueError as e:
    assert str(e) == ("task metric 'grad_norm' clashes with a trainer metric "
                      '(learning_rate, grad_norm, is_finite, num_examples, '
                      'num_tokens)')
  else:
    raise AssertionError('no error')


def test_batch_token_count():
  batch = NestedMap(tgt=NestedMap(paddings=tf.constant([[0., 0., 1.],
                                                        [0., 1., 1.]])),
                    src=NestedMap(ids=tf.zeros([2, 4], tf.int32)))
  examples, tokens = step_lib.CountBatch(batch)
  assert float(examples) == 2 and float(tokens) == 3
  # A language model's batch: its words are the targets.
  lm = NestedMap(ids=tf.zeros([2, 3], tf.int32),
                 paddings=tf.constant([[0., 0., 0.], [0., 1., 1.]]))
  examples, tokens = step_lib.CountBatch(lm)
  assert float(examples) == 2 and float(tokens) == 4


def _FinalTheta(t):
  return [v.numpy() for v in t.state.theta.Flatten() +
          t.state.opt_state.Flatten()]


def test_resume_without_iterator_state_skips_batches(tmp_path):
  """checkpoint_data_iterator=False: the resumed run skips `step` batches
  of a fresh iterator, which reproduces the order of this input."""
  over = {'task.train.checkpoint_data_iterator': False}
  whole = train_loop.Trainer(_Params(**over, **{'task.train.max_steps': 15}),
                             str(tmp_path / 'whole'), printer=lambda _: None)
  whole.Train()
  first = train_loop.Trainer(_Params(**over, **{'task.train.max_steps': 10}),
                             str(tmp_path / 'split'), printer=lambda _: None)
  first.Train()
  path = tf.train.latest_checkpoint(str(tmp_path / 'split' / 'train'))
  assert not any(k.startswith('data/') for k, _ in
                 tf.train.list_variables(path))
  second = train_loop.Trainer(_Params(**over, **{'task.train.max_steps': 15}),
                              str(tmp_path / 'split'), printer=lambda _: None)
  second.Train()
  for a, b in zip(_FinalTheta(whole), _FinalTheta(second)):
    np.testing.assert_array_equal(a, b)


def test_init_from_checkpoint_warm_starts_theta(tmp_path):
  src = train_loop.Trainer(_Params(**{'task.train.max_steps': 5}),
                           str(tmp_path / 'src'), printer=lambda _: None)
  src.Train()
  path = tf.train.latest_checkpoint(str(tmp_path / 'src' / 'train'))
  dst = train_loop.Trainer(_Params(), str(tmp_path / 'dst'),
                           printer=lambda _: None, init_from_checkpoint=path)
  assert dst.Restore() == 0
  for a, b in zip(src.state.theta.Flatten(), dst.state.theta.Flatten()):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  for slot in dst.state.opt_state.Flatten():  # Fresh optimizer state.
    assert not np.any(slot.numpy())


@tf.custom_gradient
def _NanGradient(x):
  return tf.identity(x), lambda dy: dy * float('nan')


class NanGradTask(regression_model.FeedForwardRegression):
  """Finite loss, NaN gradient of the first layer's bias."""

  def ComputeLoss(self, theta, predictions, input_batch):
    metrics, per_example = super().ComputeLoss(theta, predictions,
                                               input_batch)
    loss, weight = metrics.loss
    bias = tf.reduce_sum(_NanGradient(theta.fc[0].b))
    metrics.loss = (loss + bias, weight)
    return metrics, per_example


def test_non_finite_gradient_with_finite_loss_changes_nothing():
  p = _Params()
  task = NanGradTask.Params().Set(name='model', input_dim=8).Instantiate()
  step = step_lib.TrainStep(task)
  theta = task.theta.Transform(lambda v: v.read_value())
  new_theta, _, metrics = step(theta, step.InitOptState(theta),
                               p.input.Instantiate().GetBatch(0),
                               tf.constant(0, tf.int64))
  assert np.isfinite(float(metrics.loss[0]))
  assert np.isnan(float(metrics.grad_norm[0]))
  assert float(metrics.is_finite[0]) == 0.0
  for a, b in zip(new_theta.Flatten(), theta.Flatten()):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_negative_max_steps_is_an_error(tmp_path):
  t = train_loop.Trainer(_Params(), str(tmp_path), printer=lambda _: None)
  with pytest.raises(ValueError) as e:
    t.Train(max_steps=-3)
  assert str(e.value) == ('max_steps is -3; it must be >= 0 (set '
                          'task.train.max_steps or --max_steps)')
  assert not glob.glob(str(tmp_path / 'train' / 'ckpt-*'))


@pytest.mark.parametrize('jit', [False, True])
def test_train_loop_step_is_one_tf_function(tmp_path, jit):
  """The loop's step is one traced function: no nested function calls in
  its graph and no function library, with and without XLA."""
  p = model_registry.GetParams('toy.FFRegression')
  loop = train_loop.Trainer(p, str(tmp_path), info=strategies.StrategyInfo(
      kind='default', program=platform.ForStrategy('default', jit)))
  graph = loop.run_step.get_concrete_function(
      loop.model.GetInput().GetBatch(0)).graph
  calls = sorted({op.type for op in graph.get_operations()
                  if op.type.endswith('PartitionedCall')})
  assert calls == []
  assert not graph.as_graph_def().library.function
