"""ReLU and max-pooling kinks in the SPMD check: a pre-activation within
rounding of 0 (a pooling input within rounding of its window's max) that
the partitioned and the single-device program put on different sides of
the kink moves every gradient upstream of it (layers/kinks.py); the check
then compares again with the kinks' derivatives smoothed, and a
partitioning error still fails."""

import numpy as np
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import kinks
from lingshard.layers import linear
from lingshard.layers import pooling
from lingshard.nested_map import NestedMap
from lingshard.spmd import check

_MESH = np.arange(8)


def _NearZeroDots(rows=256, dim=16, seed=0):
  """a [rows, dim], w [dim]: in float64, a[j] . w = 0 exactly for the
  first half of the rows, so in float32 each of those dots is a rounding
  residue (~1e-7) whose sign depends on the order of the sum (on 8
  devices: partial sums, then their all-reduce); the other rows' dots are
  O(1)."""
  rng = np.random.RandomState(seed)
  a = rng.normal(size=[rows, dim])
  w = rng.normal(size=[dim])
  half = rows // 2
  a[:half, -1] = -(a[:half, :-1] @ w[:-1]) / w[-1]
  return NestedMap(a=a.astype(np.float32), w=w.astype(np.float32),
                   c=rng.normal(size=[rows]).astype(np.float32))


def _ReluOfSplitDot(inp, bug=False):
  """loss = sum_j c_j relu(a_j . w) with the dot's dim split over 8
  devices (partial sums + all-reduce), and its gradient in w: every
  element of it holds each row j whose relu'(z_j) is 1."""
  a = sharding.mesh_split(inp.a, _MESH, [-1, 0])
  with tf.GradientTape() as tape:
    tape.watch(inp.w)
    z = tf.einsum('jd,d->j', a, sharding.mesh_split(inp.w, _MESH, [0]))
    if bug:  # A partitioning error: a local index where a global one is.
      z_l = sharding.auto_to_manual(z, _MESH, [0])
      z_l += tf.cast(tf.range(tf.shape(z_l)[0]), tf.float32)
      z = sharding.manual_to_auto(z_l, _MESH, [0], z.shape)
    loss = tf.reduce_sum(inp.c * linear.Activation('relu')(z))
  return NestedMap(loss=loss, grad_w=tape.gradient(loss, inp.w))


def test_relu_kinks_within_rounding_match_once_smoothed():
  r = check.CheckFunction(_ReluOfSplitDot, _NearZeroDots(), 8, name='kinks')
  # The exact programs differ in the gradient by whole rows a_j (each
  # kink flip adds or removes one; measured: rel 0.95 in 16 of 16
  # elements), far beyond tolerance ...
  grad = {e.name: e for e in r.errors}['grad_w']
  assert not grad.ok and grad.max_rel > 0.1, r.Report()
  # ... and agree with relu's derivative smoothed: no partitioning error.
  assert r.ok and r.matches, r.Report()
  assert r.kink_errors is not None and all(e.ok for e in r.kink_errors)
  text = r.Report()
  assert '  parity vs single device: OK with kinks smoothed' in text
  assert '    kink grad_w float32[16]: ' in text
  assert (_SMOOTHED + 'OK') in text


_SMOOTHED = ("  with the kinks' derivatives smoothed (relu, max pooling; "
             "lingshard/layers/kinks.py): ")


def _MaxPoolOfSplitDot(inp):
  """loss = sum_j c_j max(a_j . w, 0) as 1x2 max pooling of the image
  [1, rows, 2, 1] whose row j is (a_j . w, 0), the dot's dim split over 8
  devices: the window's argmax is the sign of a rounding residue."""
  a = sharding.mesh_split(inp.a, _MESH, [-1, 0])
  pool = pooling.PoolingLayer.Params().Set(
      name='pool', window_shape=(1, 2), window_stride=(1, 2),
      padding='VALID').Instantiate()
  with tf.GradientTape() as tape:
    tape.watch(inp.w)
    z = tf.einsum('jd,d->j', a, sharding.mesh_split(inp.w, _MESH, [0]))
    image = tf.stack([z, tf.zeros_like(z)], 1)[tf.newaxis, :, :, tf.newaxis]
    y = tf.reshape(pool.FProp(None, image), [-1])
    loss = tf.reduce_sum(inp.c * y)
  return NestedMap(loss=loss, grad_w=tape.gradient(loss, inp.w))


def test_max_pool_kinks_within_rounding_match_once_smoothed():
  r = check.CheckFunction(_MaxPoolOfSplitDot, _NearZeroDots(), 8,
                          name='pool')
  grad = {e.name: e for e in r.errors}['grad_w']
  assert not grad.ok and grad.max_rel > 0.1, r.Report()
  assert r.ok and r.matches, r.Report()
  assert all(e.ok for e in r.kink_errors)
  assert (_SMOOTHED + 'OK') in r.Report()


def _ValueAndGrad(fn, x):
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = fn(x)
  return y.numpy(), tape.gradient(y, x).numpy()


def _PlainAndSmoothedGrads(fn, x):
  """d sum(fn(x)) / dx plain and smoothed; fn's value is checked the same
  bit for bit and its one kink counted."""
  y, g = _ValueAndGrad(fn, x)
  with kinks.Tracking(smooth=True) as state:
    ys, gs = _ValueAndGrad(fn, x)
  assert state['kinks'] == 1
  np.testing.assert_array_equal(ys, y)  # Bit for bit.
  return g, gs


def test_smoothed_max_pool_keeps_its_value_and_softmaxes_its_window():
  rng = np.random.RandomState(0)
  x = tf.constant(rng.normal(size=[2, 4, 6, 3]).astype(np.float32))
  layer = pooling.PoolingLayer.Params().Set(name='pool').Instantiate()
  g, gs = _PlainAndSmoothedGrads(lambda t: layer.FProp(None, t), x)
  # 2x2 windows, stride 2: each input's derivative is its window's
  # softmax(x / BAND) (y's cotangent is 1); unsmoothed, the argmax's 1.
  win = x.numpy().reshape(2, 2, 2, 3, 2, 3).transpose(0, 1, 3, 5, 2, 4)
  win = win.reshape(2, 2, 3, 3, 4)
  soft = np.exp(win / kinks.BAND)
  soft /= soft.sum(-1, keepdims=True)
  hard = (win == win.max(-1, keepdims=True)).astype(np.float32)

  def Image(w):
    return w.reshape(2, 2, 3, 3, 2, 2).transpose(0, 1, 4, 2, 5, 3).reshape(
        2, 4, 6, 3)

  np.testing.assert_allclose(gs, Image(soft), rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(g, Image(hard))


def test_a_partitioning_error_behind_a_relu_still_fails():
  r = check.CheckFunction(lambda inp: _ReluOfSplitDot(inp, bug=True),
                          _NearZeroDots(), 8, name='buggy')
  assert not r.ok and r.matches is False
  assert r.kink_errors is not None
  assert not {e.name: e for e in r.kink_errors}['loss'].ok
  text = r.Report()
  assert '  parity vs single device: MISMATCH' in text
  assert '    MISMATCH loss float32[]: ' in text
  assert (_SMOOTHED + 'MISMATCH') in text


def test_a_mismatch_without_relu_is_not_compared_again():
  def Fn(inp):
    z = tf.einsum('jd,d->j', sharding.mesh_split(inp.a, _MESH, [-1, 0]),
                  sharding.mesh_split(inp.w, _MESH, [0]))
    return NestedMap(y=tf.sign(z))  # A jump traced without kinks.Relu.

  r = check.CheckFunction(Fn, _NearZeroDots(), 8)
  assert r.matches is False and r.kink_errors is None
  assert 'smoothed' not in r.Report()


def test_smoothed_relu_keeps_its_value_and_has_a_continuous_derivative():
  x = tf.constant(np.linspace(-3.0, 3.0, 121, dtype=np.float32))
  g, gs = _PlainAndSmoothedGrads(linear.Activation('relu'), x)
  np.testing.assert_allclose(gs, 1.0 / (1.0 + np.exp(-x.numpy() /
                                                     kinks.BAND)),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(g, (x.numpy() > 0).astype(np.float32))
  with kinks.Tracking() as state:
    _, gt = _ValueAndGrad(linear.Activation('relu'), x)
  assert state['kinks'] == 1
  np.testing.assert_array_equal(gt, g)
