"""Tests of LinearLayer: numpy parity of outputs and gradients, and that
the compiled gradient never materialises a per-token [.., M, H] tensor."""

import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import linear


def _Layer(**kw):
  p = linear.LinearLayer.Params().Set(name='fc', input_dim=5, output_dim=7,
                                      **kw)
  return p.Instantiate()


@pytest.mark.parametrize('shape', [(4, 5), (3, 4, 5), (2, 3, 4, 5)])
def test_matches_numpy_for_any_leading_dims(shape):
  layer = _Layer(activation='relu')
  x = np.random.RandomState(0).randn(*shape).astype(np.float32)
  w, b = layer.theta.w.numpy(), layer.theta.b.numpy()
  b += 0.3  # Biases start at zero; make them matter.
  theta = layer.theta.Transform(tf.convert_to_tensor)
  theta.b = tf.constant(b)
  got = layer.FProp(theta, tf.constant(x)).numpy()
  np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5,
                             atol=1e-6)


def test_weight_gradient_is_the_sum_over_tokens():
  layer = _Layer()
  rng = np.random.RandomState(1)
  x = rng.randn(3, 4, 5).astype(np.float32)
  dy = rng.randn(3, 4, 7).astype(np.float32)
  theta = layer.theta.Transform(tf.convert_to_tensor)
  with tf.GradientTape() as tape:
    tape.watch(theta.w)
    y = layer.FProp(theta, tf.constant(x))
    loss = tf.reduce_sum(y * dy)
  dw = tape.gradient(loss, theta.w).numpy()
  want = np.einsum('btm,bth->mh', x, dy)
  np.testing.assert_allclose(dw, want, rtol=1e-5, atol=1e-5)


def test_compiled_gradient_has_no_per_token_outer_product():
  # TF's einsum gradient for '...m,mh->...h' built dw as [B, T, M, H] and
  # summed it: the Tiny M4 step ran 6x slower. Guard against its return.
  p = linear.LinearLayer.Params().Set(name='fc', input_dim=24, output_dim=40)
  layer = p.Instantiate()
  theta = layer.theta.Transform(tf.convert_to_tensor)
  x = tf.random.stateless_normal([6, 10, 24], seed=[1, 2])

  def Grad(theta, x):
    with tf.GradientTape() as tape:
      tape.watch(theta.w)
      loss = tf.reduce_sum(tf.square(layer.FProp(theta, x)))
    return tape.gradient(loss, theta.w)

  fn = tf.function(Grad, jit_compile=True)
  hlo = fn.experimental_get_compiler_ir(theta, x)(stage='optimized_hlo')
  shapes = set(re.findall(r'f32\[([0-9,]+)\]', hlo))
  big = [s for s in shapes if np.prod([int(d) for d in s.split(',')]) >=
         6 * 10 * 24 * 40]
  assert not big, big
  np.testing.assert_allclose(fn(theta, x).numpy(), Grad(theta, x).numpy(),
                             rtol=1e-4)


def test_unknown_activation():
  with pytest.raises(ValueError, match=r"Unknown activation 'swish'; one of "
                     r'gelu, none, relu, sigmoid, silu, tanh'):
    _Layer(activation='swish')
