"""ReLU kinks in the SPMD check: a pre-activation within rounding of 0 that
the partitioned and the single-device program put on different sides of
the kink moves every gradient upstream of it (layers/kinks.py); the check
then compares again with relu's derivative smoothed, and a partitioning
error still fails."""

import numpy as np
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import kinks
from lingshard.layers import linear
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
  assert '  parity vs single device: OK with ReLU kinks smoothed' in text
  assert '    kink grad_w float32[16]: ' in text
  assert ("  with relu's derivative smoothed (lingshard/layers/kinks.py): OK"
          in text)


def test_a_partitioning_error_behind_a_relu_still_fails():
  r = check.CheckFunction(lambda inp: _ReluOfSplitDot(inp, bug=True),
                          _NearZeroDots(), 8, name='buggy')
  assert not r.ok and r.matches is False
  assert r.kink_errors is not None
  assert not {e.name: e for e in r.kink_errors}['loss'].ok
  text = r.Report()
  assert '  parity vs single device: MISMATCH' in text
  assert '    MISMATCH loss float32[]: ' in text
  assert ("  with relu's derivative smoothed (lingshard/layers/kinks.py): "
          "MISMATCH" in text)


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

  def ValueAndGrad():
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = linear.Activation('relu')(x)
    return y.numpy(), tape.gradient(y, x).numpy()

  y, g = ValueAndGrad()
  with kinks.Tracking(smooth=True) as state:
    ys, gs = ValueAndGrad()
  assert state['kinks'] == 1
  np.testing.assert_array_equal(ys, y)  # Bit for bit.
  np.testing.assert_allclose(gs, 1.0 / (1.0 + np.exp(-x.numpy() /
                                                     kinks.BAND)),
                             rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(g, (x.numpy() > 0).astype(np.float32))
  with kinks.Tracking() as state:
    _, gt = ValueAndGrad()
  assert state['kinks'] == 1
  np.testing.assert_array_equal(gt, g)
