"""BatchNormLayer: input statistics, exact moment merging, moving averages."""

import numpy as np
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
  np.testing.assert_allclose(theta.moving_mean.numpy(), 0.1 * keep.mean(0),
                             rtol=1e-5)
  np.testing.assert_allclose(theta.moving_variance.numpy(),
                             0.9 + 0.1 * keep.var(0), rtol=1e-5)
  infer = _Layer(is_inference=True, epsilon=0.0)
  y = infer.FProp(theta, tf.constant(x), pad)
  np.testing.assert_allclose(
      y.numpy(), (x - theta.moving_mean.numpy()) /
      np.sqrt(theta.moving_variance.numpy()), rtol=1e-4, atol=1e-5)
