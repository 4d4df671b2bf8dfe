"""The step refuses an update whose new weights or optimizer slots are not
finite even when the loss and the gradients are (a learning rate of 1e39 is
inf in float32): nothing changes, and the trainer stops naming the real last
good checkpoint."""

import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard import trainer
from lingshard.train import step as step_lib
from lingshard.train import train_loop
from tests.trainer import trainer_testlib


def _Step(**train):
  p = model_registry.GetParams('toy.FFRegression')
  p.task.train.Set(**train)
  task = p.task.Instantiate()
  theta = task.theta.Transform(lambda v: v.read_value())
  return step_lib.TrainStep(task), theta, p.input.Instantiate().GetBatch(0)


def _AssertUnchanged(new, old):
  for a, b in zip(tf.nest.flatten(new), tf.nest.flatten(old)):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_inf_learning_rate_update_changes_nothing():
  step, theta, batch = _Step(learning_rate=1e39)
  opt_state = step.InitOptState(theta)
  new_theta, new_state, metrics = step(theta, opt_state, batch,
                                       tf.constant(0, tf.int64))
  assert np.isfinite(float(metrics.loss[0]))
  assert np.isfinite(float(metrics.grad_norm[0]))
  assert float(metrics.learning_rate[0]) == np.inf
  assert float(metrics.is_finite[0]) == 0.0
  _AssertUnchanged((new_theta, new_state), (theta, opt_state))


def test_inf_optimizer_slot_update_changes_nothing():
  # Adam with v = inf: the weight update m / sqrt(v) is 0 (finite weights),
  # but the new v is inf.
  step, theta, batch = _Step()
  opt_state = step.InitOptState(theta)
  opt_state.fc[0].w.v = tf.fill(opt_state.fc[0].w.v.shape, np.inf)
  new_theta, new_state, metrics = step(theta, opt_state, batch,
                                       tf.constant(0, tf.int64))
  assert np.isfinite(float(metrics.loss[0]))
  assert np.isfinite(float(metrics.grad_norm[0]))
  assert float(metrics.is_finite[0]) == 0.0
  _AssertUnchanged((new_theta, new_state), (theta, opt_state))


def _Execute(logdir, *args):
  cfg = trainer_testlib.ParseFlags(
      '--model=toy.FFRegression', f'--logdir={logdir}',
      '--params_override=task.train.save_interval_steps=1' + ''.join(args))
  return trainer.Execute(cfg, printer=lambda _: None)


def test_inf_learning_rate_stops_at_the_last_good_checkpoint(tmp_path):
  train = tmp_path / 'train'
  _Execute(tmp_path, ';task.train.max_steps=3')
  with pytest.raises(train_loop.NonFiniteError) as e:
    _Execute(tmp_path, ';task.train.max_steps=6',
             ';task.train.learning_rate=1e39')
  assert e.value.step == 4
  assert re.fullmatch(
      r'NaN/Inf in the updated weights or optimizer slots at step 4 '
      r'\(loss=\d+\.\d+(e-?\d+)?, grad_norm=\d+\.\d+(e-?\d+)?, '
      r'learning_rate=inf\); the update was not applied and training '
      rf'stopped; the last good checkpoint is {re.escape(str(train))}/ckpt-3',
      str(e.value)), str(e.value)
  # ckpt-3 is the latest, finite, and nothing after it was saved.
  assert tf.train.latest_checkpoint(str(train)) == str(train / 'ckpt-3')
  assert not list(train.glob('ckpt-4*'))
  reader = tf.train.load_checkpoint(str(train / 'ckpt-3'))
  for key in reader.get_variable_to_shape_map():
    if key.startswith(('theta/', 'opt/')):
      assert np.all(np.isfinite(reader.get_tensor(key))), key
