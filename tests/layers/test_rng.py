"""Counter-based RNG (layers/rng.py): a pure function of (seed, stream,
step, token)."""

import numpy as np
import tensorflow as tf

from lingshard.layers import rng as rr


def _U(idx, seed=7, stream=rr.STREAM_SECOND_EXPERT, step=3, num_sub=None):
  return rr.TokenUniform(seed, stream, step, tf.constant(idx, tf.int64),
                         num_sub).numpy()


def test_draw_depends_on_the_token_not_its_position():
  full = _U(np.arange(1000))
  np.testing.assert_array_equal(_U([5, 900, 17]), full[[5, 900, 17]])
  np.testing.assert_array_equal(_U(np.arange(1000).reshape(10, 100)),
                                full.reshape(10, 100))
  sub = _U(np.arange(50), num_sub=6)
  np.testing.assert_array_equal(_U([3, 4], num_sub=6), sub[3:5])


def test_same_bits_eager_graph_and_xla():
  """The hash and uniforms are bit-identical on every path; the inverse-CDF
  normals differ by float rounding of ndtri between TF and XLA kernels."""
  idx = tf.constant(np.arange(4096).reshape(4, 1024), tf.int64)
  step = tf.constant(9, tf.int64)
  for fn, exact in (
      (lambda i, s: rr.TokenHash(11, rr.STREAM_NOISE, s, i, 8), True),
      (lambda i, s: rr.TokenUniform(11, rr.STREAM_NOISE, s, i, 8), True),
      (lambda i, s: rr.TokenNormal(11, rr.STREAM_NOISE, s, i, 8), False)):
    eager = fn(idx, step).numpy()
    np.testing.assert_array_equal(fn(idx, 9).numpy(), eager)  # Python step.
    for jit in (False, True):
      got = tf.function(fn, jit_compile=jit)(idx, step).numpy()
      if exact:
        np.testing.assert_array_equal(got, eager)
      else:
        np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-6)


def test_keys_change_the_draws():
  base = _U(np.arange(10000))
  for other in (_U(np.arange(10000), seed=8), _U(np.arange(10000), step=4),
                _U(np.arange(10000), stream=rr.STREAM_GUMBEL),
                _U(np.arange(10000) + 2**32),
                _U(np.arange(10000) + 1)):
    assert np.mean(other == base) < 0.001
    assert abs(np.corrcoef(other, base)[0, 1]) < 0.05
  np.testing.assert_array_equal(_U([0, 1], step=None), _U([0, 1], step=0))


def test_distributions():
  n = 200000
  u = np.sort(_U(np.arange(n)))
  assert 0.0 < u[0] and u[-1] < 1.0
  # Kolmogorov-Smirnov vs U(0,1): critical value at alpha=0.001 is 1.95/sqrt(n).
  ks = np.max(np.abs(u - (np.arange(1, n + 1) - 0.5) / n))
  assert ks < 1.95 / np.sqrt(n)
  un = _U(np.arange(n))
  assert abs(np.corrcoef(un[:-1], un[1:])[0, 1]) < 0.01
  z = rr.TokenNormal(1, rr.STREAM_NOISE, 0,
                     tf.range(n // 8, dtype=tf.int64), 8).numpy().ravel()
  assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
  assert abs(np.mean(z > 1.0) - 0.158655) < 0.005
  gum = rr.TokenGumbel(1, rr.STREAM_GUMBEL, 0,
                       tf.range(n, dtype=tf.int64)).numpy()
  assert abs(gum.mean() - 0.5772157) < 0.01          # Euler's constant.


def test_global_token_index():
  np.testing.assert_array_equal(
      rr.GlobalTokenIndex([2, 3], token_offset=10).numpy(),
      [[10, 11, 12], [13, 14, 15]])


def test_uniform_is_strictly_inside_zero_one_at_every_hash_extreme():
  """The extreme hashes map inside (0, 1), so the normal and Gumbel draws
  stay finite (a u of exactly 1.0 once gave ndtri(u) = inf)."""
  h = tf.constant([0, 1, 511, 512, 2**31, 2**32 - 513, 2**32 - 512,
                   2**32 - 1], tf.uint32)
  u = rr.HashToUniform(h).numpy()
  assert np.all(u > 0.0) and np.all(u < 1.0), u
  assert u[0] == u[2] == np.float32(0.5 * 2.0**-23)
  assert u[-1] == u[-2] == np.float32(1.0 - 0.5 * 2.0**-23)
  z = tf.math.ndtri(u).numpy()
  assert np.all(np.isfinite(z)) and np.abs(z).max() < 5.3, z
  g = -np.log(-np.log(u.astype(np.float64)))
  assert np.all(np.isfinite(g))


def _PySponge(words):
  """lowbias32 absorbing 32-bit words one at a time, in plain Python."""
  def Mix(x):
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)
  h = Mix(0x9E3779B9 ^ words[0])
  for w in words[1:]:
    h = Mix(h ^ w)
  return h


def test_hash_equals_a_plain_python_sponge_per_token():
  """(seed, stream, step lo, step hi, token lo, token hi[, sub]) absorbed
  word by word, for a tensor or a Python step (folded at trace time)."""
  m = 0xFFFFFFFF
  tokens = [0, 1, 2**32 + 5, 3 * 2**40 + 7, -2]
  for seed, stream, step in ((7, 1, 3), (2**33 + 5, 3, 2**35 + 1),
                             (0, 5, -1)):
    for step_arg in (step, tf.constant(step, tf.int64)):
      got = rr.TokenHash(seed, stream, step_arg,
                         tf.constant(tokens, tf.int64), 3).numpy()
      for i, t in enumerate(tokens):
        key = [seed & m, stream & m, step & m, (step >> 32) & m, t & m,
               (t >> 32) & m]
        assert got[i].tolist() == [_PySponge(key + [s]) for s in range(3)]
