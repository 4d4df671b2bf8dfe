"""Expert-choice routing (Zhou et al. 2022): each expert's top-C tokens per
group, numpy per-expert reference, einsum == gather, params checked."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers.moe import expert_choice

B, T, M, H, E, G = 3, 8, 8, 16, 4, 2   # 12 tokens per group.


def _Params(**kw):
  return expert_choice.ExpertChoiceMoELayer.Params().Set(
      name='ec', input_dim=M, hidden_dim=H, num_experts=E,
      num_groups=G).Set(**kw)


def _Batch(seed=0, pad_frac=0.25):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = (rng.uniform(size=[B, T]) < pad_frac).astype(np.float32)
  return tf.constant(x), tf.constant(pad)


def _Scores(theta, x_gsm):
  logits = x_gsm.astype(np.float64) @ theta.wg.numpy().astype(np.float64)
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def _NumpyPicks(scores_gse, nonpad_gs, c):
  """{(g, e): sorted tokens}: the top-c real tokens by score (ties: the
  earlier token), fewer when the group has fewer real tokens."""
  picks = {}
  for g in range(scores_gse.shape[0]):
    real = np.nonzero(nonpad_gs[g] > 0)[0]
    for e in range(scores_gse.shape[2]):
      order = real[np.argsort(-scores_gse[g, real, e], kind='stable')]
      picks[g, e] = sorted(order[:c].tolist())
  return picks


def _NumpyMoE(theta, x_gsm, scores_gse, picks):
  """y[g, s] = sum over experts e that picked s of S_gse * FFN_e(x_gs)."""
  wi, wo = theta.wi.numpy(), theta.wo.numpy()
  out = np.zeros(x_gsm.shape, np.float64)
  for (g, e), tokens in picks.items():
    for s in tokens:
      out[g, s] += scores_gse[g, s, e] * (np.maximum(x_gsm[g, s] @ wi[e], 0)
                                          @ wo[e])
  return out


@pytest.mark.parametrize('cf', [1.0, 2.0, 3.5])
def test_each_expert_picks_its_top_c_real_tokens_and_output_matches(cf):
  layer = _Params(capacity_factor=cf, dispatch_impl='gather').Instantiate()
  x, pad = _Batch()
  s = B * T // G
  c = int(np.ceil(cf * s / E))
  routing, aux_loss, stats = layer.ComputeRouting(layer.theta, x, pad)
  mask = routing.wanted_gsk.numpy()
  assert routing.choice_is_expert
  assert (routing.dispatched_gsk.numpy() == mask).all()  # No drops.
  nonpad = 1.0 - pad.numpy().reshape(G, s)
  assert not (mask & (nonpad[..., None] == 0)).any()     # Never a pad.
  for g in range(G):
    if nonpad[g].sum() >= c:                             # Exactly C each.
      assert (mask[g].sum(0) == c).all()
  x_gsm = x.numpy().reshape(G, s, M)
  scores = _Scores(layer.theta, x_gsm)
  picks = _NumpyPicks(scores, nonpad, c)
  for (g, e), tokens in picks.items():
    assert np.nonzero(mask[g, :, e])[0].tolist() == tokens, (g, e)
  np.testing.assert_allclose(routing.weight_gsk.numpy(), scores * mask,
                             rtol=1e-5, atol=1e-7)
  assert float(aux_loss) == 0.0 and stats.router_z is not None
  out, aux = layer.FProp(layer.theta, x, pad)
  ref = _NumpyMoE(layer.theta, x_gsm, scores, picks)
  np.testing.assert_allclose(out.numpy().reshape(ref.shape), ref, rtol=1e-4,
                             atol=1e-5)
  assert float(aux.metrics.capacity) == c


def test_group_with_fewer_real_tokens_than_capacity_gives_all_of_them():
  layer = _Params(capacity_factor=4.0, dispatch_impl='einsum').Instantiate()
  x, _ = _Batch()
  pad = np.zeros([B, T], np.float32)
  pad[:, 3:] = 1.0          # 9 real tokens of 12 in each group; C = 12.
  routing, _, _ = layer.ComputeRouting(layer.theta, x, tf.constant(pad))
  mask = routing.wanted_gsk.numpy()
  nonpad = (1.0 - pad).reshape(G, -1, 1) > 0
  assert (mask == np.broadcast_to(nonpad, mask.shape)).all()


def _Grads(layer, theta, x, pad):
  leaves = theta.Flatten()
  r = tf.constant(np.random.RandomState(7).normal(size=[B, T, M]),
                  tf.float32)
  with tf.GradientTape() as tape:
    tape.watch(leaves + [x])
    out, aux = layer.FProp(theta, x, pad)
    loss = tf.reduce_sum(out * r) + aux.aux_loss
  grads = tape.gradient(loss, leaves + [x])
  names = [k for k, _ in theta.FlattenItems()] + ['inputs']
  return out, dict(zip(names, grads))


def test_einsum_and_gather_same_outputs_and_gradients():
  x, pad = _Batch(seed=2)
  results, theta = {}, None
  for impl in ('einsum', 'gather'):
    layer = _Params(dispatch_impl=impl, use_bias=True,
                    capacity_factor=1.5).Instantiate()
    theta = theta or layer.theta
    results[impl] = _Grads(layer, theta, x, pad)
  (out_e, g_e), (out_g, g_g) = results['einsum'], results['gather']
  np.testing.assert_allclose(out_g.numpy(), out_e.numpy(), rtol=1e-5,
                             atol=1e-6)
  assert set(g_e) == {'bi', 'bo', 'wg', 'wi', 'wo', 'inputs'}
  for name in g_e:
    a, b = (tf.convert_to_tensor(g_e[name]).numpy(),
            tf.convert_to_tensor(g_g[name]).numpy())
    assert np.abs(a).max() > 0, name   # The router learns from S_gse.
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=name)


def test_capacity_is_at_most_the_group_and_eval_keeps_groups():
  layer = _Params(capacity_factor=8.0).Instantiate()  # ceil(8*12/4) > 12.
  assert layer.Capacity(12) == 12
  p = _Params(eval_capacity_factor=1.0)
  base_layer.ResolveParams(p, inference=True)
  assert (p.num_groups, p.group_size) == (G, None)
  assert p.Copy().Set(is_inference=True).Instantiate().Capacity(12) == 3


def test_routing_is_declared_non_causal_unless_groups_are_single_tokens():
  cls = expert_choice.ExpertChoiceMoELayer
  assert cls.RoutingLeaks(_Params()) == (
      'each expert picks its top-C tokens of the group, so later tokens '
      "change earlier tokens' experts")
  assert cls.RoutingLeaks(_Params(num_groups=None, group_size=1)) is None


def test_bad_param_is_one_line_error():
  with pytest.raises(ValueError) as e:
    _Params(num_experts_per_token=2).Instantiate()
  assert str(e.value) == (
      'ec: expert-choice routing has no experts per token (experts pick '
      'capacity_factor * S / E tokens each); num_experts_per_token must be '
      'None, got 2')
