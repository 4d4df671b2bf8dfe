"""LSTMLayer against a plain numpy per-step loop; padding keeps the state."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import lstm

_B, _T, _D, _C = 3, 5, 4, 6


def _Sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _NumpyLstm(theta, x, pad, forget_bias, cell_clip):
  """One step at a time, one example at a time."""
  w, u, b = theta.w, theta.u, theta.b
  proj = theta.get('proj')
  out = np.zeros([_B, _T, u.shape[0]], np.float64)
  for n in range(_B):
    c = np.zeros([_C])
    h = np.zeros([u.shape[0]])
    for t in range(_T):
      if pad[n, t]:
        continue
      z = np.einsum('d,dgc->gc', x[n, t], w) + np.einsum('p,pgc->gc', h, u) + b
      i, f, o, j = z
      c = _Sigmoid(f + forget_bias) * c + _Sigmoid(i) * np.tanh(j)
      if cell_clip:
        c = np.clip(c, -cell_clip, cell_clip)
      h = _Sigmoid(o) * np.tanh(c)
      if proj is not None:
        h = h @ proj
      out[n, t] = h
  return out


@pytest.mark.parametrize('proj,cell_clip', [(0, 0.0), (3, 0.5)])
def test_lstm_equals_a_per_step_loop(proj, cell_clip):
  layer = lstm.LSTMLayer.Params().Set(
      name='lstm', input_dim=_D, num_cells=_C, num_output_nodes=proj,
      cell_clip=cell_clip).Instantiate()
  rng = np.random.RandomState(0)
  x = rng.normal(size=[_B, _T, _D]).astype(np.float32)
  # Example 1 ends early; example 2 has a padded step in the middle.
  pad = np.zeros([_B, _T], np.float32)
  pad[1, 3:] = 1.0
  pad[2, 2] = 1.0
  theta = layer.theta.Transform(lambda v: v.numpy())
  theta.b = rng.normal(size=theta.b.shape).astype(np.float32)  # Not zeros.
  got = tf.function(layer.FProp, jit_compile=True)(
      theta.Transform(tf.constant), x, pad).numpy()
  want = _NumpyLstm(theta, x, pad, 1.0, cell_clip)
  assert got.shape == (_B, _T, proj or _C)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # Padding at the end changes nothing before it.
  short = tf.function(layer.FProp)(theta.Transform(tf.constant), x[:, :3],
                                   pad[:, :3]).numpy()
  np.testing.assert_allclose(short, got[:, :3], rtol=1e-5, atol=1e-6)


def test_every_weight_gets_a_gradient():
  layer = lstm.LSTMLayer.Params().Set(
      name='lstm', input_dim=_D, num_cells=_C, num_output_nodes=2
  ).Instantiate()
  x = np.random.RandomState(1).normal(size=[_B, _T, _D]).astype(np.float32)
  pad = np.zeros([_B, _T], np.float32)
  theta = layer.theta
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(layer.FProp(theta, x, pad)))
  grads = tape.gradient(loss, theta)
  assert sorted(grads) == ['b', 'proj', 'u', 'w']
  for key, g in grads.FlattenItems():
    assert np.all(np.isfinite(g.numpy())) and np.any(g.numpy()), key


def test_bad_dims_are_one_line():
  with pytest.raises(ValueError, match=r'num_output_nodes must be >= 0, '
                     r'got -1$'):
    lstm.LSTMLayer.Params().Set(name='lstm', input_dim=2, num_cells=2,
                                num_output_nodes=-1).Instantiate()
