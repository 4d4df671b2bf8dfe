"""LayerNorm against numpy."""

import numpy as np

from lingshard.layers import layer_norm


def test_matches_numpy_with_scale_and_bias():
  layer = layer_norm.LayerNorm.Params().Set(name='ln', input_dim=5,
                                            epsilon=1e-6).Instantiate()
  theta = layer.theta.Transform(lambda v: v.numpy())
  theta.scale = np.arange(1, 6, dtype=np.float32)
  theta.bias = -np.arange(5, dtype=np.float32)
  x = np.random.RandomState(0).normal(size=[2, 3, 5]).astype(np.float32) * 4
  want = (x - x.mean(-1, keepdims=True)) / np.sqrt(
      x.var(-1, keepdims=True) + 1e-6) * theta.scale + theta.bias
  np.testing.assert_allclose(layer.FProp(theta, x).numpy(), want, atol=1e-5)


def test_initial_is_standardised():
  layer = layer_norm.LayerNorm.Params().Set(name='ln',
                                            input_dim=16).Instantiate()
  x = np.random.RandomState(1).normal(3.0, 5.0, size=[4, 16]).astype(
      np.float32)
  y = layer.FProp(layer.theta, x).numpy()
  np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(y.std(-1), 1.0, atol=1e-4)
