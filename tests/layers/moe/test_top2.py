"""GShard top-2 gating vs a plain per-token reading of Algorithm 1."""

import numpy as np
import pytest
import tensorflow as tf
from lingshard.layers.moe import dispatch as moe_dispatch
from lingshard.layers import rng as routing_rng
from lingshard.layers.moe import routing
from lingshard.layers.moe import top2


def _Softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _Top2(g):
  """Top-2 (value, index) with ties to the lower index, like tf.top_k."""
  order = sorted(range(len(g)), key=lambda e: (-g[e], e))
  return g[order[0]], order[0], g[order[1]], order[1]


def Algorithm1(logits_se, nonpad_s, capacity, policy='all', rnd_s=None,
               gumbel_se=None, takes_slot=True, renormalize=False):
  """GShard Algorithm 1 for one group, token by token (sequential counters).

  Paddings are skipped (never dispatched, not in S, c_e or m_e). Returns
  (combine [S, E, C], aux scaled by E^2).
  """
  s_len, e_len = logits_se.shape
  gates = _Softmax(logits_se)
  real = [s for s in range(s_len) if nonpad_s[s]]
  combine = np.zeros([s_len, e_len, capacity])
  c = np.zeros(e_len, np.int64)                                   # (1)
  m = gates[real].mean(0) if real else np.zeros(e_len)            # (3)

  def Choices(s):
    g1, e1, g2, e2 = _Top2(gates[s])                              # (5)
    if policy == 'sampling':
      cand = [(logits_se[s, e] + gumbel_se[s, e], -e) for e in range(e_len)
              if e != e1]
      e2 = -max(cand)[1]
      g2 = gates[s, e2]
    return g1, e1, g2, e2

  for s in real:                                                  # (4)
    g1, e1, g2, _ = Choices(s)
    g1 = g1 / (g1 + g2)                                           # (6)
    pos = c[e1]                                                   # (7)
    if pos < capacity:                                            # (8)
      combine[s, e1, pos] = g1                                    # (9)
    c[e1] = pos + 1                                               # (11)
  n = len(real)
  aux = (np.mean(c / max(n, 1) * m) * e_len**2) if n else 0.0     # (13)
  for s in real:                                                  # (14)
    g1, _, g2, e2 = Choices(s)                                    # (15)
    g2 = g2 / (g1 + g2)                                           # (16)
    accept = policy != 'random' or 2 * g2 > rnd_s[s]              # (17)
    pos = c[e2]                                                   # (18)
    if pos < capacity and accept:                                 # (19)
      combine[s, e2, pos] = g2                                    # (20)
    if takes_slot or accept:
      c[e2] = pos + 1                                             # (22)
  if renormalize:
    tot = combine.sum(axis=(1, 2), keepdims=True)
    combine = np.where(tot > 0, combine / np.where(tot > 0, tot, 1), 0)
  return combine, aux


def _Inputs(g=3, s=40, e=5, seed=0, pad_frac=0.2, skew=1.5):
  rng = np.random.RandomState(seed)
  # A skewed gate so several experts overflow.
  logits = rng.normal(size=[g, s, e]) + skew * np.linspace(1, 0, e)
  nonpad = (rng.uniform(size=[g, s]) >= pad_frac).astype(np.float32)
  rnd = rng.uniform(size=[g, s]).astype(np.float32)
  gumbel = -np.log(-np.log(rng.uniform(size=[g, s, e])))
  return (logits.astype(np.float32), nonpad, rnd, gumbel.astype(np.float32))


def _Run(logits, nonpad, capacity, **kw):
  """(routing, aux, combine, dispatch) of Top2Gating."""
  r, aux, _ = top2.Top2Gating(tf.constant(logits), tf.constant(nonpad),
                                capacity, **kw)
  e = logits.shape[-1]
  combine = moe_dispatch.CombineWeightsGSEC(r, e, capacity).numpy()
  dispatch = moe_dispatch.DispatchMaskGSEC(r, e, capacity).numpy()
  return r, aux, combine, dispatch


@pytest.mark.parametrize('policy,takes_slot,renorm', [
    ('all', True, False),
    ('random', True, False),
    ('random', False, False),
    ('random', True, True),
    ('sampling', True, False),
])
def test_matches_per_token_algorithm1(policy, takes_slot, renorm):
  logits, nonpad, rnd, gumbel = _Inputs()
  capacity = 6
  r, aux_loss, combine, dispatch = _Run(
      logits, nonpad, capacity, second_expert_policy=policy,
      uniform_gs=tf.constant(rnd), gumbel_gse=tf.constant(gumbel),
      rejected_second_takes_slot=takes_slot, renormalize_after_drop=renorm)
  auxes = []
  for g in range(logits.shape[0]):
    ref, aux = Algorithm1(logits[g], nonpad[g], capacity, policy, rnd[g],
                          gumbel[g], takes_slot, renorm)
    auxes.append(aux)
    np.testing.assert_array_equal(dispatch[g] != 0, ref != 0)
    np.testing.assert_allclose(combine[g], ref, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(aux_loss.numpy(), np.mean(auxes), rtol=1e-6)
  # The inputs exercise drops of both choices and, for random, rejections.
  dropped = (r.wanted_gsk.numpy() & ~r.dispatched_gsk.numpy())
  assert dropped[..., 0].any() and dropped[..., 1].any()
  if policy == 'random':
    assert 0 < r.accept_gs.numpy().sum() < nonpad.sum()


def test_second_choices_queue_after_all_first_choices():
  # Every token: first choice expert 0, second expert 1, except the last
  # token whose first choice is expert 1: it gets slot 0 of expert 1 even
  # though it comes after the others in token order.
  logits = np.tile(np.array([[3.0, 2.0, 0.0]], np.float32), [6, 1])
  logits[-1] = [2.0, 3.0, 0.0]
  r, _, combine, _ = _Run(logits[None], np.ones([1, 6], np.float32), 8)
  pos = r.position_gsk.numpy()[0]
  assert pos[-1, 0] == 0                    # First choice, expert 1.
  np.testing.assert_array_equal(pos[:5, 1], [1, 2, 3, 4, 5])  # Seconds.
  assert combine[0, 5, 1, 0] > 0.5


def test_capacity_overflow_both_choices_full_gives_zero_weights():
  logits = np.tile(np.array([[4.0, 3.0, 0.0, 0.0]], np.float32), [8, 1])
  r, _, combine, dispatch = _Run(logits[None], np.ones([1, 8], np.float32),
                                 2)
  per_token = combine[0].sum(axis=(1, 2))
  # Tokens 0, 1: both experts; tokens 2..7: expert 0 full (first choices),
  # expert 1's 2 slots went to the seconds of tokens 0, 1.
  assert np.all(per_token[:2] > 0.99)
  np.testing.assert_array_equal(per_token[2:], 0.0)
  np.testing.assert_array_equal(dispatch[0, 2:], 0.0)
  np.testing.assert_array_equal(r.dispatched_gsk.numpy()[0, 2:], False)


def test_paddings_never_dispatched_and_not_counted():
  logits, nonpad, _, _ = _Inputs(seed=3)
  r, aux, combine, _ = _Run(logits, nonpad, 4)
  pad = nonpad == 0
  assert not r.dispatched_gsk.numpy()[pad].any()
  np.testing.assert_array_equal(combine[pad], 0.0)
  # Changing padded logits changes neither the routing nor the aux loss.
  logits2 = logits.copy()
  logits2[pad] = 100.0 * np.random.RandomState(9).normal(size=[pad.sum(), 5])
  _, aux2, combine2, _ = _Run(logits2, nonpad, 4)
  np.testing.assert_array_equal(combine2, combine)
  np.testing.assert_allclose(aux2.numpy(), aux.numpy(), rtol=1e-6)
  # An all-padding group does not count in the mean over groups.
  nonpad3 = nonpad.copy()
  nonpad3[1] = 0
  _, aux3, _, _ = _Run(logits, nonpad3, 4)
  ref = np.mean([Algorithm1(logits[g], nonpad3[g], 4)[1] for g in (0, 2)])
  np.testing.assert_allclose(aux3.numpy(), ref, rtol=1e-6)


def _UniformLogits(s, e):
  """Token s's logits are a cyclic shift by s of one vector."""
  v = np.random.RandomState(0).normal(size=e) * 2
  return np.stack([np.roll(v, i) for i in range(s)]).astype(np.float32)


def test_aux_loss_scale_uniform_is_one_collapsed_is_larger():
  e, s = 8, 64
  uniform = _UniformLogits(s, e)[None]
  _, aux, _, _ = _Run(uniform, np.ones([1, s], np.float32), 16)
  np.testing.assert_allclose(aux.numpy(), 1.0, rtol=1e-6)
  collapsed = np.zeros([1, s, e], np.float32)
  collapsed[..., 3] = 20.0
  _, aux, _, _ = _Run(collapsed, np.ones([1, s], np.float32), 16)
  np.testing.assert_allclose(aux.numpy(), e, rtol=1e-5)


def test_aux_loss_gradient_reaches_logits():
  logits = tf.constant(_Inputs()[0])
  with tf.GradientTape() as tape:
    tape.watch(logits)
    r, aux, _ = top2.Top2Gating(logits, tf.ones(logits.shape[:2]), 4)
    loss = aux + tf.reduce_sum(r.weight_gsk)
  grad = tape.gradient(loss, logits).numpy()
  assert np.abs(grad).max() > 1e-4


def test_expert_capacity():
  assert routing.ExpertCapacity(1024, 16, 1.0) == 128          # 2S/E
  assert routing.ExpertCapacity(1000, 16, 1.0) == 125
  assert routing.ExpertCapacity(1000, 16, 1.25) == 157         # ceil(156.25)
  assert routing.ExpertCapacity(1024, 16, 2.0, expert_capacity=7) == 7
  assert routing.ExpertCapacity(10, 64, 0.5, top_k=1) == 1
  with pytest.raises(ValueError, match='set expert_capacity or a '
                     'capacity_factor > 0'):
    routing.ExpertCapacity(10, 4, 0.0)


def test_bad_policy_message():
  with pytest.raises(ValueError, match="second_expert_policy must be one of "
                     r"\('all', 'random', 'sampling'\), got 'best'"):
    top2.Top2Gating(tf.zeros([1, 2, 3]), tf.ones([1, 2]), 2, 'best')


def test_sampling_policy_draws_second_expert_from_remaining_gates():
  """Gumbel-max over experts != e1 samples e2 with p = g_e / (1 - g_e1)."""
  n = 20000
  logits = np.tile(np.array([[2.0, 1.0, 0.5, -0.5]], np.float32), [n, 1])
  gumbel = routing_rng.TokenGumbel(5, routing_rng.STREAM_GUMBEL, 0,
                                   tf.range(n, dtype=tf.int64), 4)
  r, _, _ = top2.Top2Gating(tf.constant(logits[None]), tf.ones([1, n]), n,
                              'sampling', gumbel_gse=gumbel[None])
  e2 = r.expert_gsk.numpy()[0, :, 1]
  g = _Softmax(logits[0])
  freq = np.bincount(e2, minlength=4) / n
  expect = np.concatenate([[0.0], g[1:] / (1 - g[0])])
  # Binomial sd <= 0.0036: tolerance 0.015.
  np.testing.assert_allclose(freq, expect, atol=0.015)


def test_layer_routing_matches_algorithm1_with_the_layers_draws():
  """The MoE layer's routing = Algorithm 1 on x.wg with rnd = the layer's
  counter-based uniform draws (routing_rng, keyed by global token index)."""
  b, t, m, e = 3, 16, 8, 4
  p = top2.MoELayer.Params().Set(name='moe', input_dim=m, hidden_dim=8,
                                num_experts=e, num_groups=2,
                                expert_capacity=5,
                                second_expert_policy='random',
                                **{'aux_loss_weights.group_aux': 1.0})
  layer = p.Instantiate()
  rng = np.random.RandomState(4)
  x = rng.normal(size=[b, t, m]).astype(np.float32)
  pad = (rng.uniform(size=[b, t]) < 0.2).astype(np.float32)
  routing, aux, _ = layer.ComputeRouting(layer.theta, x, pad, step=21,
                                         token_offset=100)
  combine = moe_dispatch.CombineWeightsGSEC(routing, e, 5).numpy()
  logits = (x.reshape(2, -1, m).astype(np.float64) @
            layer.theta.wg.numpy().astype(np.float64))
  rnd = routing_rng.TokenUniform(
      layer.layer_seed, routing_rng.STREAM_SECOND_EXPERT, 21,
      tf.range(100, 100 + b * t, dtype=tf.int64)).numpy().reshape(2, -1)
  nonpad = 1 - pad.reshape(2, -1)
  auxes = []
  for g in range(2):
    ref, a = Algorithm1(logits[g], nonpad[g], 5, 'random', rnd[g])
    auxes.append(a)
    np.testing.assert_array_equal(combine[g] != 0, ref != 0)
    np.testing.assert_allclose(combine[g], ref, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(aux.numpy(), np.mean(auxes), rtol=1e-5)
