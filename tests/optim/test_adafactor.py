"""Adafactor against a plain numpy reading of Shazeer & Stern 2018,
Algorithms 4 (factored, with row/column *sums*) and 5 (vectors), with
update clipping (§6), relative step size (§8) and beta2_t = 1 - t^-0.8."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.nested_map import NestedMap
from lingshard.optim import adafactor

EPS1, EPS2, D, C = 1e-30, 1e-3, 1.0, 0.8


def _Rms(x):
  return np.sqrt(np.mean(np.square(x)))


def RefFactored(x, grads, rhos, beta1=0.0):
  """Algorithm 4 on a matrix x [n, m] (loops over steps t = 1, 2, ...)."""
  n, m = x.shape
  r, c, mom = np.zeros(n), np.zeros(m), np.zeros_like(x)
  for t, (g, rho) in enumerate(zip(grads, rhos), 1):
    beta2 = 1.0 - t ** (-C)
    g2 = g * g + EPS1
    r = beta2 * r + (1 - beta2) * g2 @ np.ones(m)       # row sums
    c = beta2 * c + (1 - beta2) * np.ones(n) @ g2       # column sums
    v = np.outer(r, c) / (np.ones(n) @ r)
    u = g / np.sqrt(v)
    u = u / max(1.0, _Rms(u) / D)
    if beta1:
      mom = beta1 * mom + (1 - beta1) * u
      u = mom
    x = x - max(EPS2, _Rms(x)) * rho * u
  return x, r, c


def RefVector(x, grads, rhos):
  """Algorithm 5 (no factoring)."""
  v = np.zeros_like(x)
  for t, (g, rho) in enumerate(zip(grads, rhos), 1):
    beta2 = 1.0 - t ** (-C)
    v = beta2 * v + (1 - beta2) * (g * g + EPS1)
    u = g / np.sqrt(v)
    u = u / max(1.0, _Rms(u) / D)
    x = x - max(EPS2, _Rms(x)) * rho * u
  return x, v


def _Run(opt, x, grads, rhos):
  theta = NestedMap(w=tf.constant(x, tf.float32))
  state = opt.InitState(theta)
  for step, (g, rho) in enumerate(zip(grads, rhos)):
    theta, state = opt.Apply(theta, NestedMap(w=tf.constant(g, tf.float32)),
                             state, rho, tf.constant(step, tf.int64))
  return theta.w.numpy(), state.w


def _Problem(shape, steps=6, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=shape)
  grads = [rng.normal(size=shape) * (10.0 if i == 2 else 1.0)
           for i in range(steps)]  # One large step exercises the clipping.
  rhos = [min(1e-2, 1.0 / np.sqrt(t)) * 10 for t in range(1, steps + 1)]
  return x, grads, rhos


def _Opt(**kw):
  return adafactor.Adafactor.Params().Set(min_dim_size_to_factor=2,
                                          **kw).Instantiate()


def test_factored_matches_algorithm_4():
  x, grads, rhos = _Problem([5, 7])
  want, r, c = RefFactored(x, grads, rhos)
  got, slots = _Run(_Opt(), x, grads, rhos)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Slots keep means where the paper keeps sums.
  np.testing.assert_allclose(slots.vr.numpy() * 7, r, rtol=1e-5)
  np.testing.assert_allclose(slots.vc.numpy() * 5, c, rtol=1e-5)
  assert sorted(slots) == ['vc', 'vr']


def test_factored_with_momentum():
  x, grads, rhos = _Problem([4, 3], seed=1)
  want, _, _ = RefFactored(x, grads, rhos, beta1=0.9)
  got, slots = _Run(_Opt(beta1=0.9), x, grads, rhos)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert sorted(slots) == ['m', 'vc', 'vr']


def test_vector_matches_algorithm_5():
  x, grads, rhos = _Problem([9], seed=2)
  want, v = RefVector(x, grads, rhos)
  got, slots = _Run(_Opt(), x, grads, rhos)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(slots.v.numpy(), v, rtol=1e-5)


def test_small_matrices_are_not_factored_by_default():
  x, grads, rhos = _Problem([4, 3], seed=3)
  opt = adafactor.Adafactor.Params().Instantiate()  # min dim 128.
  got, slots = _Run(opt, x, grads, rhos)
  assert sorted(slots) == ['v']
  # Unfactored on a matrix is Algorithm 5 elementwise.
  want, _ = RefVector(x, grads, rhos)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_expert_weights_factor_each_expert():
  """[E, M, H]: each expert's matrix has its own row/column factors; the
  update-clipping RMS and the parameter scale cover the whole tensor."""
  x, grads, rhos = _Problem([3, 4, 5], seed=4)
  got, slots = _Run(_Opt(), x, grads, rhos)
  assert slots.vr.shape == [3, 4] and slots.vc.shape == [3, 5]
  # Reference: the per-expert factored V, clipping over the whole tensor.
  r, c = np.zeros([3, 4]), np.zeros([3, 5])
  want = x.copy()
  for t, (g, rho) in enumerate(zip(grads, rhos), 1):
    beta2 = 1.0 - t ** (-C)
    g2 = g * g + EPS1
    u = np.zeros_like(g)
    for e in range(3):
      r[e] = beta2 * r[e] + (1 - beta2) * g2[e].sum(axis=1)
      c[e] = beta2 * c[e] + (1 - beta2) * g2[e].sum(axis=0)
      u[e] = g[e] / np.sqrt(np.outer(r[e], c[e]) / r[e].sum())
    u = u / max(1.0, _Rms(u) / D)
    want = want - max(EPS2, _Rms(want)) * rho * u
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_absolute_step_without_parameter_scale():
  x, grads, rhos = _Problem([6], seed=5)
  opt = _Opt(multiply_by_parameter_scale=False, clipping_threshold=0.0)
  got, _ = _Run(opt, x, grads[:1], rhos[:1])
  # t = 1: beta2 = 0, V = G^2, U = sign(G); no clipping, step size rho.
  np.testing.assert_allclose(got, x - rhos[0] * np.sign(grads[0]),
                             rtol=1e-5)


@pytest.mark.parametrize('dtype', [tf.float32, tf.bfloat16])
def test_weight_dtype_is_kept(dtype):
  opt = _Opt()
  theta = NestedMap(w=tf.ones([4, 4], dtype))
  state = opt.InitState(theta)
  new, _ = opt.Apply(theta, NestedMap(w=tf.ones([4, 4], dtype)), state, 0.1,
                     tf.constant(0, tf.int64))
  assert new.w.dtype == dtype
