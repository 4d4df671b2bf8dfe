"""Hierarchical MoE (Shazeer et al. 2017, App. B): eqs. (12)-(14) in numpy."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import hierarchical
from lingshard.layers import rng as routing_rng

_Phi = np.vectorize(lambda z: 0.5 * math.erfc(-z / math.sqrt(2.0)))
B, T, M, H, A, BB = 2, 24, 6, 8, 3, 4   # a = 3 groups of b = 4 experts.


def _Softplus(x):
  return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def _TopKGates(v, k):
  """(dense softmax-over-top-k gates, top indices) of one vector."""
  top = np.argsort(-v, kind='stable')[:k]
  g = np.zeros_like(v)
  g[top] = np.exp(v[top] - v[top].max()) / np.exp(v[top] - v[top].max()).sum()
  return g, top


def _Top2Gates(logits):
  """GShard top-2: softmax, top-2, normalised by g1 + g2 (dense)."""
  p = np.exp(logits - logits.max())
  p /= p.sum()
  top = np.argsort(-p, kind='stable')[:2]
  g = np.zeros_like(p)
  g[top] = p[top] / p[top].sum()
  return g, p, top


def _LoadProb(clean, hx, std, k):
  out = np.zeros_like(clean)
  for i in range(len(clean)):
    kth = np.sort(np.delete(hx, i))[::-1][k - 1]
    out[i] = _Phi((clean[i] - kth) / std[i])
  return out


def _CV2(v):
  return v.var() / v.mean()**2


def _Layer(kind, **kw):
  p = hierarchical.HierarchicalMoELayer.Params().Set(
      name='hmoe', input_dim=M, hidden_dim=H, num_experts=A * BB,
      num_expert_groups=A, num_groups=2, gating_kind=kind)
  p.Set(**kw)
  layer = p.Instantiate()
  rng = np.random.RandomState(3)
  for name, v in layer.theta.items():
    if name.startswith('w_noise'):
      v.assign(0.5 * rng.normal(size=v.shape).astype(np.float32))
    elif name.startswith('wg'):
      v.assign(rng.normal(size=v.shape).astype(np.float32))
  return layer


def _Batch(seed=0):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = (rng.uniform(size=[B, T]) < 0.2).astype(np.float32)
  return x, pad


def _Reference(layer, x, pad, step):
  """Per-token numpy: gates of both levels, eq. 12 output, eqs. 13-14."""
  th = layer.theta
  p = layer.params
  xs = x.reshape(-1, M).astype(np.float64)
  n_tok = len(xs)
  noisy = p.gating_kind == 'noisy_top_k'
  k1, k2 = (p.k_primary, p.k_secondary) if noisy else (2, 2)
  if noisy:
    tok = tf.range(n_tok, dtype=tf.int64)
    z_p = routing_rng.TokenNormal(layer.layer_seed, routing_rng.STREAM_NOISE,
                                  step, tok, A).numpy()
    z_s = routing_rng.TokenNormal(
        layer.layer_seed, routing_rng.STREAM_NOISE_SECONDARY, step, tok,
        A * BB).numpy().reshape(n_tok, A, BB)
  gp = np.zeros([n_tok, A])
  gs = np.zeros([n_tok, A, BB])
  prob_p = np.zeros([n_tok, A])
  prob_s = np.zeros([n_tok, A, BB])
  for n in range(n_tok):
    clean = xs[n] @ th.wg_primary.numpy()
    if noisy:
      std = _Softplus(xs[n] @ th.w_noise_primary.numpy())
      hx = clean + z_p[n] * std
      gp[n], _ = _TopKGates(hx, k1)
      prob_p[n] = _LoadProb(clean, hx, std, k1)
    else:
      gp[n], _, _ = _Top2Gates(clean)
      prob_p[n] = gp[n] > 0
    for i in range(A):
      clean = xs[n] @ th.wg_secondary.numpy()[i]
      if noisy:
        std = _Softplus(xs[n] @ th.w_noise_secondary.numpy()[i])
        hx = clean + z_s[n, i] * std
        gs[n, i], _ = _TopKGates(hx, k2)
        prob_s[n, i] = _LoadProb(clean, hx, std, k2)
      else:
        gs[n, i], _, _ = _Top2Gates(clean)
        prob_s[n, i] = gs[n, i] > 0
  real = pad.reshape(-1) == 0
  importance = np.einsum('na,nab->ab', gp[real], gs[real])          # eq. 13
  in_x_i = (gp > 0)[real]                                           # X^(i)
  load_p = prob_p[real].sum(0)
  load_s = np.einsum('na,nab->ab', in_x_i, prob_s[real])
  load = load_p[:, None] * load_s / in_x_i.sum(0)[:, None]          # eq. 14
  # Eq. 12: y = sum_i sum_j Gp_i G_i_j E_ij(x).
  wi, wo = th.wi.numpy(), th.wo.numpy()
  y = np.zeros_like(xs)
  for n in np.nonzero(real)[0]:
    for i in range(A):
      for j in range(BB):
        w = gp[n, i] * gs[n, i, j]
        if w:
          e = i * BB + j
          y[n] += w * np.maximum(xs[n] @ wi[e], 0) @ wo[e]
  return importance, load, y.reshape(x.shape)


@pytest.mark.parametrize('kind,k1,k2', [('noisy_top_k', 2, 2),
                                        ('noisy_top_k', 1, 3),
                                        ('top2', 2, 2)])
def test_importance_load_output_match_eqs_12_to_14(kind, k1, k2):
  layer = _Layer(kind, k_primary=k1, k_secondary=k2, **{
      'aux_loss_weights.importance': 0.2, 'aux_loss_weights.load': 0.3})
  x, pad = _Batch()
  importance, load, y = _Reference(layer, x, pad, step=7)
  out, aux = layer.FProp(layer.theta, tf.constant(x), tf.constant(pad),
                         step=7)
  m = aux.metrics
  np.testing.assert_allclose(m.importance.numpy(), importance.reshape(-1),
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(m.load.numpy(), load.reshape(-1), rtol=1e-4,
                             atol=1e-6)
  np.testing.assert_allclose(out.numpy(), y, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(m.importance_loss.numpy(),
                             0.2 * _CV2(importance), rtol=1e-4)
  np.testing.assert_allclose(m.load_loss.numpy(), 0.3 * _CV2(load), rtol=1e-4)
  if kind == 'noisy_top_k':
    np.testing.assert_allclose(aux.aux_loss.numpy(),
                               0.2 * _CV2(importance) + 0.3 * _CV2(load),
                               rtol=1e-4)
  assert m.tokens_with_n_experts.numpy()[k1 * k2] == pytest.approx(1.0)


def test_top2_kind_aux_is_primary_plus_mean_secondary_gshard_aux():
  layer = _Layer('top2', **{'aux_loss_weights.group_aux': 1.0})
  x, pad = _Batch(seed=1)
  _, aux = layer.FProp(layer.theta, tf.constant(x), tf.constant(pad))
  th = layer.theta
  xg = x.reshape(2, -1, M).astype(np.float64)
  padg = pad.reshape(2, -1)
  auxes_p, auxes_s = [], []
  for g in range(2):
    real = np.nonzero(padg[g] == 0)[0]
    probs = []
    firsts = []
    for s in real:
      _, p, top = _Top2Gates(xg[g, s] @ th.wg_primary.numpy())
      probs.append(p)
      firsts.append(top[0])
    probs = np.array(probs)
    f = np.bincount(firsts, minlength=A) / len(real)
    auxes_p.append(A * A * np.mean(f * probs.mean(0)))
    for i in range(A):
      members = [s for s in real
                 if i in _Top2Gates(xg[g, s] @ th.wg_primary.numpy())[2]]
      if not members:
        continue
      ps, fs = [], []
      for s in members:
        _, p, top = _Top2Gates(xg[g, s] @ th.wg_secondary.numpy()[i])
        ps.append(p)
        fs.append(top[0])
      f = np.bincount(fs, minlength=BB) / len(members)
      auxes_s.append(BB * BB * np.mean(f * np.mean(ps, 0)))
  np.testing.assert_allclose(aux.aux_loss.numpy(),
                             np.mean(auxes_p) + np.mean(auxes_s), rtol=1e-5)


def test_impls_agree_and_gradients_reach_both_gates():
  x, pad = _Batch(seed=2)
  res = {}
  for impl in ('einsum', 'gather'):
    layer = _Layer('noisy_top_k', dispatch_impl=impl, capacity_factor=1.0)
    th = layer.theta
    with tf.GradientTape() as tape:
      out, aux = layer.FProp(th, tf.constant(x), tf.constant(pad), step=3)
      loss = tf.reduce_sum(out**2) + aux.aux_loss
    names = ['wg_primary', 'wg_secondary', 'w_noise_primary',
             'w_noise_secondary', 'wi']
    grads = tape.gradient(loss, [th[n] for n in names])
    res[impl] = [out.numpy()] + [g.numpy() for g in grads]
    for n, g in zip(names, grads):
      assert np.abs(g.numpy()).max() > 0, n
  for a, b in zip(res['einsum'], res['gather']):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_validation_messages():
  with pytest.raises(ValueError, match='hmoe: num_experts = 12 must be a '
                     'multiple of num_expert_groups = 5'):
    _Layer('top2', num_expert_groups=5)
  with pytest.raises(ValueError, match="hmoe: gating_kind must be one of "
                     r"\('noisy_top_k', 'top2'\), got 'flat'"):
    _Layer('flat')
