"""BatchNormLayer: input statistics, exact moment merging, moving averages."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import batch_norm


def _Layer(**kwargs):
  return batch_norm.BatchNormLayer.Params().Set(
      name='bn', input_dim=3, **kwargs).Instantiate()


def _Data():
  rng = np.random.RandomState(0)
  x = rng.normal(2.0, 3.0, size=[6, 4, 3]).astype(np.float32)
  pad = (rng.rand(6, 4) < 0.3).astype(np.float32)
  return x, pad


def test_training_normalises_by_the_non_padded_input_statistics():
  layer = _Layer(epsilon=1e-3)
  x, pad = _Data()
  y, moments = layer.FPropWithMoments(layer.theta, x, pad)
  keep = x[pad == 0]
  want = (x - keep.mean(0)) / np.sqrt(keep.var(0) + 1e-3)
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
  assert float(moments.count) == keep.shape[0]
  np.testing.assert_allclose(moments.mean.numpy(), keep.mean(0), rtol=1e-5)


def test_combined_micro_batch_moments_equal_the_whole_batch_moments():
  layer = _Layer()
  x, pad = _Data()
  parts = [layer.Moments(x[i:i + 2], pad[i:i + 2]) for i in (0, 2, 4)]
  merged = batch_norm.CombineMoments(batch_norm.CombineMoments(
      parts[0], parts[1]), parts[2])
  keep = x[pad == 0]
  np.testing.assert_allclose(merged.mean.numpy(), keep.mean(0), rtol=1e-5)
  np.testing.assert_allclose(batch_norm.Variance(merged).numpy(),
                             keep.var(0), rtol=1e-5)


def test_moving_averages_update_and_are_used_at_inference():
  layer = _Layer()
  x, pad = _Data()
  moments = layer.Moments(x, pad)
  theta = batch_norm.BatchNormLayer.UpdatedMoving(layer.theta, moments, 0.9)
  keep = x[pad == 0]
  # Zero-initialised EMAs of (mean, variance, 1), read debiased.
  np.testing.assert_allclose(theta.moving.numpy(), [
      0.1 * keep.mean(0), 0.1 * keep.var(0), [0.1] * 3], rtol=1e-5)
  np.testing.assert_allclose(batch_norm.MovingMean(theta).numpy(),
                             keep.mean(0), rtol=1e-5)
  infer = _Layer(is_inference=True, epsilon=0.0)
  y = infer.FProp(theta, tf.constant(x), pad)
  np.testing.assert_allclose(y.numpy(), (x - keep.mean(0)) /
                             np.sqrt(keep.var(0)), rtol=1e-4, atol=1e-4)


def test_never_updated_moving_averages_are_mean_zero_variance_one():
  layer = _Layer(is_inference=True, epsilon=0.0)
  x, _ = _Data()
  np.testing.assert_allclose(layer.FProp(layer.theta, x).numpy(), x,
                             rtol=1e-6)


def test_training_carries_shifted_sums_and_the_rule_is_the_batch_ema():
  layer = _Layer(decay=0.8)
  x, pad = _Data()
  theta = layer.theta
  # A previous state: debiased mean 1, variance 4 (rows over total 0.5).
  theta.moving.assign(np.array([[0.5] * 3, [2.0] * 3, [0.5] * 3], np.float32))
  parts = []
  for rows in (slice(0, 2), slice(2, 6)):  # Two micro-batches' slots add.
    with tf.GradientTape() as tape:
      tape.watch(theta.moving)
      y = layer.FProp(theta, x[rows], pad[rows])
      loss = 0.0 * tf.reduce_sum(y)  # The slot ignores the upstream grad.
    parts.append(tape.gradient(loss, theta.moving).numpy())
  slot = parts[0] + parts[1]
  keep = x[pad == 0]
  np.testing.assert_allclose(slot[0], [keep.shape[0]] * 3)
  np.testing.assert_allclose(slot[1], (keep - 1.0).sum(0), rtol=1e-5)
  np.testing.assert_allclose(slot[2], ((keep - 1.0)**2).sum(0), rtol=1e-5)
  new = batch_norm.MovingAverage.Updated(theta.moving, slot, 0.2).numpy()
  want = 0.8 * theta.moving.numpy() + 0.2 * np.stack(
      [keep.mean(0), keep.var(0), np.ones(3)])
  np.testing.assert_allclose(new, want, rtol=1e-5, atol=1e-6)
  # An empty part (a pipeline bubble or padded slot) changes nothing.
  np.testing.assert_array_equal(batch_norm.MovingAverage.Updated(
      theta.moving, np.zeros([3, 3], np.float32), 0.2).numpy(),
                                theta.moving.numpy())
  assert layer.DeclaredWeights().moving.count_update_rate == (
      pytest.approx(0.2))
