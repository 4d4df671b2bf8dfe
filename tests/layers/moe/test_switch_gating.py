"""Top-k gating for any k with a learnable router (noisy_top_k
gate_softmax='all', Switch Transformer §2.1): a chosen expert's gate is its
probability under a softmax over all E logits. With k = 1 the router's
gradient is the numpy closed form, while Shazeer's softmax over the kept
logits gives gate 1 and no router gradient."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import noisy_top_k

B, T, M, H, E = 2, 5, 4, 6, 4


def _Layer(k, gate_softmax):
  p = noisy_top_k.NoisyTopKMoELayer.Params().Set(
      name='switch', input_dim=M, hidden_dim=H, num_experts=E, num_groups=1,
      num_experts_per_token=k, gate_softmax=gate_softmax, noisy_gating=False)
  layer = p.Instantiate()
  rng = np.random.RandomState(0)
  for v in layer.theta.Flatten():
    v.assign(rng.normal(size=v.shape).astype(np.float32))
  return layer


def _Data():
  rng = np.random.RandomState(1)
  return (rng.normal(size=[B, T, M]).astype(np.float32),
          rng.normal(size=[B, T, M]).astype(np.float32))


def _RouterGrad(layer, x, r):
  with tf.GradientTape() as tape:
    y, _ = layer.FProp(layer.theta, tf.constant(x), tf.zeros([B, T]))
    loss = tf.reduce_sum(y * r)
  return y.numpy(), tape.gradient(loss, layer.theta.wg)


def _Softmax(v):
  e = np.exp(v - v.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_switch_top1_output_and_router_gradient_equal_numpy():
  layer = _Layer(1, 'all')
  x, r = _Data()
  y, grad = _RouterGrad(layer, x, r)
  th = {k: v.numpy() for k, v in layer.theta.items()}
  xs, rs = x.reshape(-1, M), r.reshape(-1, M)
  p = _Softmax(xs @ th['wg'])
  want_y = np.zeros_like(xs)
  want_grad = np.zeros_like(th['wg'])
  for t, (xt, pt) in enumerate(zip(xs, p)):
    i = int(np.argmax(pt))
    ffn = np.maximum(xt @ th['wi'][i], 0.0) @ th['wo'][i]
    want_y[t] = pt[i] * ffn
    # d(r . p_i ffn) / d logits_j = (r . ffn) p_i (delta_ij - p_j).
    dlogits = (rs[t] @ ffn) * pt[i] * (np.eye(E)[i] - pt)
    want_grad += np.outer(xt, dlogits)
  np.testing.assert_allclose(y.reshape(-1, M), want_y, rtol=1e-5, atol=1e-6)
  assert np.abs(want_grad).max() > 1e-3
  np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-4, atol=1e-6)


def test_softmax_over_the_kept_one_gives_the_router_no_gradient():
  layer = _Layer(1, 'kept')
  x, r = _Data()
  _, grad = _RouterGrad(layer, x, r)
  if grad is None:
    return
  # d gate / d logit = p (1 - p) = 0 for p = 1. A vectorised softmax kernel
  # may round the one kept probability to 1 - ulp (seen on some CPUs), so
  # each token leaves at most |x_t| |dL/dgate_t| 4 eps: rounding, against
  # 'all''s gradient of order 1e-3 and more.
  th = {k: v.numpy() for k, v in layer.theta.items()}
  xs, rs = x.reshape(-1, M), r.reshape(-1, M)
  expert = np.argmax(xs @ th['wg'], -1)
  dgate = np.array([rt @ (np.maximum(xt @ th['wi'][i], 0.0) @ th['wo'][i])
                    for xt, rt, i in zip(xs, rs, expert)])
  bound = 4 * np.finfo(np.float32).eps * np.abs(xs).T @ np.abs(dgate)
  assert np.all(np.abs(grad.numpy()) <= bound[:, None])


def test_any_k_gates_are_full_softmax_probabilities():
  logits = np.random.RandomState(2).normal(size=[3, 7]).astype(np.float32)
  for k in (1, 2, 7):
    out = noisy_top_k.NoisyTopK(tf.constant(logits), k, gate_softmax='all')
    p = _Softmax(logits)
    top = np.argsort(-logits, -1)[:, :k]
    np.testing.assert_allclose(out.gate_xk, np.take_along_axis(p, top, -1),
                               rtol=1e-5)
  with pytest.raises(ValueError) as e:
    _Layer(1, 'both')
  assert str(e.value) == ("switch: gate_softmax must be one of ('kept', "
                          "'all'), got 'both'")
