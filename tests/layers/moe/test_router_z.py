"""Router z-loss (ST-MoE, Zoph et al. 2022, eq. 5) on every gate:
mean over real tokens of logsumexp(logits)^2 (per group, then over groups
with real tokens), reported as `router_z_loss`, added to aux_loss with
`aux_loss_weights.router_z`; its gradient is the closed form's."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import balanced
from lingshard.layers.moe import hierarchical
from lingshard.layers.moe import noisy_top_k
from lingshard.layers.moe import routing
from lingshard.layers.moe import top2

B, T, M, H = 4, 6, 5, 8
G = 3  # Groups of 8 tokens: 24 = 4 x 6.


def _Lse(v):
  top = v.max(-1, keepdims=True)
  return (top + np.log(np.exp(v - top).sum(-1, keepdims=True)))[..., 0]


def _Reference(logits_list, nonpad_gs):
  """Per token: sum over its routers of lse^2; per group mean over real
  tokens; mean over groups with real tokens."""
  z_gs = sum(np.square(_Lse(v)).reshape(nonpad_gs.shape + (-1,)).sum(-1)
             for v in logits_list)
  per_group = []
  for g in range(G):
    n = nonpad_gs[g].sum()
    if n > 0:
      per_group.append((z_gs[g] * nonpad_gs[g]).sum() / n)
  return np.mean(per_group)


def _Batch():
  rng = np.random.RandomState(0)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = np.zeros([B, T], np.float32)
  pad[1, 3:] = 1.0
  pad[2, 4:] = 1.0
  pad[3, :] = 1.0  # The last group (tokens 16-23) is all padding.
  return x, pad


def _Randomise(layer):
  rng = np.random.RandomState(1)
  for name, v in layer.theta.items():
    if name.startswith('w'):
      v.assign(rng.normal(size=v.shape).astype(np.float32))


def _Top2(**kw):
  return top2.MoELayer.Params().Set(num_experts=4, **kw)


def _Noisy(**kw):
  return noisy_top_k.NoisyTopKMoELayer.Params().Set(num_experts=4, **kw)


def _Balanced(**kw):
  return balanced.BalancedMoELayer.Params().Set(num_experts=4, **kw)


def _Hierarchical(**kw):
  return hierarchical.HierarchicalMoELayer.Params().Set(
      num_experts=6, num_expert_groups=2, gating_kind='top2', **kw)


def _Logits(kind, theta, x_gsm):
  """The reference router logits (numpy) of each gate: x Wg."""
  if kind == 'hierarchical':
    return [x_gsm @ theta.wg_primary.numpy(),
            np.einsum('gsm,amb->gsab', x_gsm, theta.wg_secondary.numpy())]
  return [x_gsm @ theta.wg.numpy()]


_GATES = {'top2': _Top2, 'noisy': _Noisy, 'balanced': _Balanced,
          'hierarchical': _Hierarchical}


@pytest.mark.parametrize('kind', sorted(_GATES))
def test_every_gate_reports_and_weights_the_closed_form(kind):
  x, pad = _Batch()
  x_gsm = x.reshape(G, -1, M)
  nonpad_gs = 1.0 - pad.reshape(G, -1)
  aux = {}
  for weight in (0.0, 0.01):
    p = _GATES[kind](name='moe', input_dim=M, hidden_dim=H, num_groups=G,
                     **{'aux_loss_weights.router_z': weight})
    if kind == 'noisy':
      p.noisy_gating = False  # Its logits are then x Wg exactly.
    layer = p.Instantiate()
    _Randomise(layer)
    _, aux[weight] = layer.FProp(layer.theta, tf.constant(x),
                                 tf.constant(pad))
    want = _Reference(_Logits(kind, layer.theta, x_gsm), nonpad_gs)
    np.testing.assert_allclose(aux[weight].metrics.router_z_loss, want,
                               rtol=1e-5)
  assert want > 1.0  # Random logits: not a trivial value.
  np.testing.assert_allclose(
      aux[0.01].aux_loss - aux[0.0].aux_loss, 0.01 * want, rtol=1e-4)


def test_gradient_is_the_closed_form():
  """d z / d Wg = mean over groups of the mean over real tokens of
  2 lse(x Wg) x softmax(x Wg)^T."""
  x, pad = _Batch()
  x_gsm = x.reshape(G, -1, M)
  nonpad_gs = 1.0 - pad.reshape(G, -1)
  wg = np.random.RandomState(2).normal(size=[M, 4]).astype(np.float32)
  w = tf.Variable(wg)
  with tf.GradientTape() as tape:
    z = routing.RouterZLoss(routing.GatingLogits(tf.constant(x_gsm), w),
                            tf.constant(nonpad_gs))
  got = tape.gradient(z, w).numpy()
  logits = x_gsm @ wg
  soft = np.exp(logits - _Lse(logits)[..., None])
  per_token = 2 * _Lse(logits)[..., None, None] * (
      x_gsm[..., :, None] * soft[..., None, :])  # [G, S, M, E]
  groups = [(per_token[g] * nonpad_gs[g][:, None, None]).sum(0) /
            nonpad_gs[g].sum() for g in range(G) if nonpad_gs[g].sum()]
  np.testing.assert_allclose(got, np.mean(groups, 0), rtol=1e-5, atol=1e-6)
  # Padding and the all-padding group do not count.
  assert len(groups) == 2


def test_off_by_default_so_the_seed_configs_are_unchanged():
  for make in _GATES.values():
    assert make().aux_loss_weights.router_z == 0.0
