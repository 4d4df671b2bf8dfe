"""Strictly balanced gating (Shazeer et al. 2017, App. F, eqs. 15-20)."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import balanced
from lingshard.layers.moe import dispatch as moe_dispatch

B, T, M, H, E, K = 4, 20, 6, 8, 5, 2


def _Layer(**kw):
  p = balanced.BalancedMoELayer.Params().Set(
      name='bmoe', input_dim=M, hidden_dim=H, num_experts=E, num_groups=2,
      num_experts_per_token=K)
  p.Set(**kw)
  return p.Instantiate()


def _Batch(seed=0, pad_frac=0.2):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = (rng.uniform(size=[B, T]) < pad_frac).astype(np.float32)
  return x, pad


def _Softmax(v):
  e = np.exp(v - v.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _NumpyBatchwiseMask(x_se, real_s, m):
  """Eq. 18: top m values per expert among real tokens (ties: lower s)."""
  mask = np.zeros(x_se.shape, bool)
  idx = np.nonzero(real_s)[0]
  for e in range(x_se.shape[1]):
    order = sorted(idx, key=lambda s: (-x_se[s, e], s))
    mask[order[:m], e] = True
  return mask


def test_every_expert_gets_exactly_m_tokens_in_training():
  layer = _Layer()
  x, pad = _Batch()
  routing, _, _ = layer.ComputeRouting(layer.theta, tf.constant(x),
                                       tf.constant(pad))
  xg = x.reshape(2, -1, M)
  gates = _Softmax(xg @ layer.theta.wg.numpy())
  real = pad.reshape(2, -1) == 0
  dispatched = routing.dispatched_gsk.numpy()
  for g in range(2):
    m = K * real[g].sum() // E
    assert m > 0
    np.testing.assert_array_equal(dispatched[g].sum(0), np.full(E, m))
    np.testing.assert_array_equal(dispatched[g],
                                  _NumpyBatchwiseMask(gates[g], real[g], m))
    assert not dispatched[g][~real[g]].any()
  # Eq. 16: combine weight = G_sigma * mask renormalised per token.
  mask = dispatched.astype(np.float64)
  expect = gates * mask / np.maximum((gates * mask).sum(-1, keepdims=True),
                                     1e-30)
  combine = moe_dispatch.CombineWeightsGSEC(routing, E,
                                            layer.Capacity(T * B // 2))
  np.testing.assert_allclose(combine.numpy().sum(-1), expect, rtol=1e-5,
                             atol=1e-7)


def test_batchwise_loss_matches_eq_20():
  rng = np.random.RandomState(1)
  xv = rng.uniform(size=[2, 10, E]).astype(np.float32)
  nonpad = (rng.uniform(size=[2, 10]) > 0.2).astype(np.float32)
  t = rng.uniform(0.2, 0.8, size=[E]).astype(np.float32)
  mask = np.stack([_NumpyBatchwiseMask(xv[g], nonpad[g] > 0, 3)
                   for g in range(2)])
  got = balanced.BatchwiseLoss(tf.constant(xv), tf.constant(t),
                                      tf.constant(mask), tf.constant(nonpad))
  ref = 0.0
  for g in range(2):
    for j in range(10):
      if nonpad[g, j]:
        for i in range(E):
          ref += (float(xv[g, j, i] > t[i]) - mask[g, j, i]) * (
              xv[g, j, i] - t[i])
  np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5)
  tf_mask = balanced.BatchwiseMask(tf.constant(xv), tf.constant(nonpad),
                                          tf.constant([3, 3]))
  np.testing.assert_array_equal(tf_mask.numpy(), mask)


def test_trained_thresholds_agree_with_batchwise_mask():
  """SGD on the layer's aux loss (eq. 20) learns T on a toy batch."""
  layer = _Layer(num_groups=1)
  theta = layer.theta
  rng = np.random.RandomState(2)
  theta.wg.assign(rng.normal(size=[M, E]).astype(np.float32))
  x = tf.constant(rng.normal(size=[8, 64, M]).astype(np.float32))
  pad = tf.zeros([8, 64])
  opt_t = tf.Variable(tf.zeros([E]))  # Start far off: every x_i > T_i.

  @tf.function
  def Step():
    th = theta.copy()
    th.thresholds = opt_t
    with tf.GradientTape() as tape:
      _, aux, extra = layer.ComputeRouting(th, x, pad)
    grad = tape.gradient(aux, opt_t)
    opt_t.assign_sub(2e-3 * grad)
    return extra.metrics.threshold_agreement

  start = Step().numpy()
  for _ in range(300):
    agree = Step().numpy()
  assert start < 0.5 and agree >= 0.9, (start, agree)
  # Inference uses the threshold mask: x > T.
  evl = _Layer(num_groups=1, is_inference=True)
  th = theta.copy()
  th.thresholds = opt_t
  routing, aux, _ = evl.ComputeRouting(th, x, pad)
  gates = _Softmax(tf.reshape(x, [1, -1, M]).numpy() @ theta.wg.numpy())
  np.testing.assert_array_equal(routing.wanted_gsk.numpy(),
                                gates > opt_t.numpy())
  batch = balanced.BatchwiseMask(
      tf.constant(gates, tf.float32), tf.ones([1, 512]),
      tf.constant([K * 512 // E])).numpy()
  assert np.mean(batch == routing.wanted_gsk.numpy()) >= 0.9


def test_impls_agree_train_and_eval():
  x, pad = _Batch(seed=3)
  for inference in (False, True):
    res = {}
    for impl in ('einsum', 'gather'):
      layer = _Layer(dispatch_impl=impl, is_inference=inference)
      th = layer.theta
      with tf.GradientTape() as tape:
        out, aux = layer.FProp(th, tf.constant(x), tf.constant(pad))
        loss = tf.reduce_sum(out**2) + aux.aux_loss
      grads = tape.gradient(loss, [th.wg, th.wi, th.wo])
      res[impl] = [out.numpy()] + [g.numpy() for g in grads]
    for a, b in zip(res['einsum'], res['gather']):
      np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    assert np.abs(res['gather'][1]).max() > 0  # Gradients reach Wg.


def test_validation_message():
  with pytest.raises(ValueError, match=r'bmoe: num_experts_per_token must be '
                     r'in \[1, 5\], got 6'):
    _Layer(num_experts_per_token=6)
