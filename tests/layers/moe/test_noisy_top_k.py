"""Noisy top-k gating (Shazeer et al. 2017 §2.1, §4, App. A) and its layer."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import dispatch as moe_dispatch
from lingshard.layers.moe import noisy_top_k
from lingshard.layers import rng as routing_rng

_Phi = np.vectorize(lambda z: 0.5 * math.erfc(-z / math.sqrt(2.0)))


def _Softplus(x):
  return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def _KthExcluding(v, k, i):
  """k-th highest component of v excluding component i (App. A)."""
  return np.sort(np.delete(v, i))[::-1][k - 1]


def test_load_probability_matches_monte_carlo():
  """P(x, i) (eq. 9) vs re-drawing the noise of element i 20,000 times.

  Binomial standard error <= 0.5/sqrt(20000) = 0.0035; tolerance 0.015.
  """
  rng = np.random.RandomState(0)
  num_tokens, e, draws = 4, 6, 20000
  clean = rng.normal(size=[num_tokens, e]).astype(np.float32)
  std = _Softplus(rng.normal(size=[num_tokens, e])).astype(np.float32)
  noise = rng.normal(size=[num_tokens, e]).astype(np.float32)
  for k in (1, 2, 3):
    noisy = clean + noise * std
    prob = noisy_top_k.LoadProbability(
        tf.constant(clean), tf.constant(noisy), tf.constant(std), k).numpy()
    for x in range(num_tokens):
      for i in range(e):
        thresh = _KthExcluding(noisy[x], k, i)
        h_i = clean[x, i] + rng.normal(size=draws) * std[x, i]
        mc = np.mean(h_i > thresh)
        assert abs(prob[x, i] - mc) < 0.015, (k, x, i, prob[x, i], mc)
        np.testing.assert_allclose(
            prob[x, i], _Phi((clean[x, i] - thresh) / std[x, i]), atol=1e-5)


def test_noisy_top_k_gates_are_softmax_over_kept():
  rng = np.random.RandomState(1)
  h = rng.normal(size=[5, 7]).astype(np.float32)
  out = noisy_top_k.NoisyTopK(tf.constant(h), 3)
  gates = out.gates_xe.numpy()
  for x in range(5):
    top = np.argsort(-h[x])[:3]
    ref = np.zeros(7)
    ref[top] = np.exp(h[x, top]) / np.exp(h[x, top]).sum()
    np.testing.assert_allclose(gates[x], ref, rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match='top-k needs 1 <= k <= E, got k=8'):
    noisy_top_k.NoisyTopK(tf.constant(h), 8)


B, T, M, H = 4, 16, 6, 8


def _CV2(v):
  return v.var() / v.mean()**2


def _Layer(**kw):
  p = noisy_top_k.NoisyTopKMoELayer.Params().Set(
      name='moe', input_dim=M, hidden_dim=H, num_experts=6, num_groups=2,
      num_experts_per_token=2)
  p.Set(**kw)
  return p.Instantiate()


def _Batch(seed=0, pad_frac=0.2, b=B, t=T):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=[b, t, M]).astype(np.float32)
  pad = (rng.uniform(size=[b, t]) < pad_frac).astype(np.float32)
  return x, pad


def _RandomGating(layer, seed=2):
  theta = layer.theta
  rng = np.random.RandomState(seed)
  theta.wg.assign(rng.normal(size=theta.wg.shape).astype(np.float32))
  theta.w_noise.assign(
      0.5 * rng.normal(size=theta.w_noise.shape).astype(np.float32))
  return theta


@pytest.mark.parametrize('k', [1, 2, 3])
def test_importance_and_load_losses_match_numpy(k):
  layer = _Layer(num_experts_per_token=k, **{
      'aux_loss_weights.importance': 0.3, 'aux_loss_weights.load': 0.7})
  theta = _RandomGating(layer)
  x, pad = _Batch()
  _, aux = layer.FProp(theta, tf.constant(x), tf.constant(pad), step=4)
  # Numpy from the paper, with the layer's noise draws (routing_rng).
  xs = x.reshape(-1, M).astype(np.float64)
  real = pad.reshape(-1) == 0
  clean = xs @ theta.wg.numpy()
  std = _Softplus(xs @ theta.w_noise.numpy())
  normal = routing_rng.TokenNormal(
      layer.layer_seed, routing_rng.STREAM_NOISE, 4,
      tf.range(B * T, dtype=tf.int64), 6).numpy()
  hx = clean + normal * std                                        # eq. 4
  gates = np.zeros_like(hx)
  prob = np.zeros_like(hx)
  for n in range(len(xs)):
    top = np.argsort(-hx[n], kind='stable')[:k]
    gates[n, top] = np.exp(hx[n, top]) / np.exp(hx[n, top]).sum()  # eq. 3
    for i in range(6):
      prob[n, i] = _Phi((clean[n, i] - _KthExcluding(hx[n], k, i)) /
                        std[n, i])                                 # eq. 9
  importance = gates[real].sum(0)                                  # eq. 6
  load = prob[real].sum(0)                                         # eq. 10
  m = aux.metrics
  np.testing.assert_allclose(m.importance.numpy(), importance, rtol=1e-4)
  np.testing.assert_allclose(m.load.numpy(), load, rtol=1e-4)
  np.testing.assert_allclose(m.importance_loss.numpy(),
                             0.3 * _CV2(importance), rtol=1e-4)      # eq. 7
  np.testing.assert_allclose(m.load_loss.numpy(), 0.7 * _CV2(load),
                             rtol=1e-4)                            # eq. 11
  np.testing.assert_allclose(aux.aux_loss.numpy(),
                             0.3 * _CV2(importance) + 0.7 * _CV2(load),
                             rtol=1e-4)
  np.testing.assert_allclose(m.cv_load.numpy(), np.sqrt(_CV2(load)),
                             rtol=1e-4)


def test_zero_init_gives_near_uniform_load_at_step_zero():
  layer = _Layer(num_experts=8, num_groups=1)
  x, pad = _Batch(seed=3, pad_frac=0.0, b=16, t=128)
  assert not np.any(layer.theta.wg.numpy())
  assert not np.any(layer.theta.w_noise.numpy())
  _, aux = layer.FProp(layer.theta, tf.constant(x), tf.constant(pad), step=0)
  m = aux.metrics
  # 2048 tokens, k=2 of 8: expected 512 per expert, binomial sd ~ 20.
  assert m.cv_load.numpy() < 0.1
  assert m.cv_importance.numpy() < 0.1
  assert m.max_over_mean_load.numpy() < 1.15
  counts = m.tokens_per_expert_all.numpy() * 2048
  assert np.all(np.abs(counts - 512) < 100)


def test_dropless_outputs_match_numpy_and_impls_agree():
  x, pad = _Batch(seed=5)
  outs = {}
  for impl in ('einsum', 'gather'):
    layer = _Layer(num_experts_per_token=3, dispatch_impl=impl)
    theta = _RandomGating(layer)
    r = tf.random.stateless_normal([B, T, M], [1, 1])
    with tf.GradientTape() as tape:
      out, aux = layer.FProp(theta, tf.constant(x), tf.constant(pad), step=1)
      loss = tf.reduce_sum(out * r) + aux.aux_loss
    grads = tape.gradient(loss, [theta.wg, theta.w_noise, theta.wi])
    outs[impl] = [out.numpy()] + [g.numpy() for g in grads]
  for a, b in zip(outs['einsum'], outs['gather']):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
  assert np.abs(outs['gather'][2]).max() > 0   # Load loss reaches Wnoise.
  # Dropless: every real token gets all k = 3 experts with weights G(x).
  assert aux.metrics.frac_dispatched_0.numpy() == 0
  np.testing.assert_allclose(aux.metrics.tokens_with_n_experts.numpy()[3], 1)
  routing, _, _ = layer.ComputeRouting(theta, tf.constant(x),
                                       tf.constant(pad), step=1)
  combine = moe_dispatch.CombineWeightsGSEC(routing, 6, T * B // 2).numpy()
  gates = layer.Gate(theta, tf.constant(x.reshape(2, -1, M)), tf.reshape(
      tf.range(B * T, dtype=tf.int64), [2, -1]), 1).gates_xe.numpy()
  real = pad.reshape(2, -1) == 0
  np.testing.assert_allclose(combine.sum(-1)[real], gates[real], rtol=1e-6)
  xg = x.reshape(2, -1, M)
  y_egsn = np.einsum('egsh,ehn->egsn', np.maximum(np.einsum(
      'gsm,emh->egsh', xg, theta.wi.numpy()), 0), theta.wo.numpy())
  expect = np.einsum('gsec,egsn->gsn', combine, y_egsn)
  np.testing.assert_allclose(outs['einsum'][0].reshape(expect.shape), expect,
                             rtol=1e-4, atol=1e-5)


def _OverCapacityByRank(layer, theta, x, pad, step, k, capacity, g=2):
  """Dropped / wanted choices per rank from a per-token numpy routing.

  Per group and expert one queue: every real token's first choice in token
  order, then every second choice (GShard Algorithm 1); a choice is dropped
  when `capacity` choices are queued before it.
  """
  e = theta.wg.shape[1]
  xs = x.reshape(g, -1, M).astype(np.float64)
  real = pad.reshape(g, -1) == 0
  normal = routing_rng.TokenNormal(
      layer.layer_seed, routing_rng.STREAM_NOISE, step,
      tf.range(x.shape[0] * x.shape[1], dtype=tf.int64), e).numpy()
  hx = (xs @ theta.wg.numpy() + normal.reshape(g, -1, e) *
        _Softplus(xs @ theta.w_noise.numpy()))
  wanted, dropped = np.zeros(k), np.zeros(k)
  for gi in range(g):
    queued = np.zeros(e, np.int64)
    for rank in range(k):
      for s in range(xs.shape[1]):
        if real[gi, s]:
          expert = np.argsort(-hx[gi, s], kind='stable')[rank]
          wanted[rank] += 1
          dropped[rank] += queued[expert] >= capacity
          queued[expert] += 1
  return dropped / wanted


def test_capacity_factor_bounds_buffers_and_inference_has_no_noise():
  layer = _Layer(capacity_factor=0.5)
  assert layer.Capacity(32) == int(np.ceil(0.5 * 2 * 32 / 6))
  x, pad = _Batch(seed=6)
  theta = _RandomGating(layer)
  _, aux = layer.FProp(theta, tf.constant(x), tf.constant(pad), step=5)
  want = _OverCapacityByRank(layer, theta, x, pad, 5, 2, layer.Capacity(32))
  assert want[0] > 0 and want[1] > want[0]  # Both ranks drop here.
  np.testing.assert_allclose(
      [aux.metrics.over_capacity_first.numpy(),
       aux.metrics.over_capacity_second.numpy()], want, rtol=1e-6)
  evl = _Layer(is_inference=True)
  r1, _, _ = evl.ComputeRouting(theta, tf.constant(x), tf.constant(pad), 1)
  r2, _, _ = evl.ComputeRouting(theta, tf.constant(x), tf.constant(pad), 2)
  np.testing.assert_array_equal(r1.expert_gsk.numpy(), r2.expert_gsk.numpy())
  clean = x.reshape(2, -1, M) @ theta.wg.numpy()
  np.testing.assert_array_equal(r1.expert_gsk.numpy()[..., 0],
                                np.argmax(clean, -1))


def test_lm_configuration_sigmoid_output_app_c():
  """App. C: MoE between LSTM layers, k = 4, output through a sigmoid."""
  x, pad = _Batch(seed=8)
  plain = _Layer(num_experts=8, num_experts_per_token=4)
  lm = _Layer(num_experts=8, num_experts_per_token=4,
              output_activation='sigmoid')
  theta = _RandomGating(plain)
  y, _ = plain.FProp(theta, tf.constant(x), tf.constant(pad), step=2)
  y_lm, aux = lm.FProp(theta, tf.constant(x), tf.constant(pad), step=2)
  real = pad == 0
  np.testing.assert_allclose(y_lm.numpy()[real],
                             1 / (1 + np.exp(-y.numpy()[real])), rtol=1e-5)
  np.testing.assert_array_equal(y_lm.numpy()[~real], 0.0)
  np.testing.assert_allclose(aux.metrics.tokens_with_n_experts.numpy()[4], 1)


def test_num_experts_per_token_out_of_range_is_a_clear_error():
  p = noisy_top_k.NoisyTopKMoELayer.Params().Set(
      name='nmoe', input_dim=4, hidden_dim=8, num_experts=4, num_groups=1,
      num_experts_per_token=5)
  with pytest.raises(ValueError) as e:
    p.Instantiate()
  assert str(e.value) == ('nmoe: num_experts_per_token must be in [1, 4], '
                          'got 5')
