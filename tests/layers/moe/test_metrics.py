"""Routing metrics against direct numpy counting over a routing."""

import numpy as np
import tensorflow as tf

from lingshard.layers.moe import routing
from lingshard.layers.moe import metrics as routing_metrics


def _Routing(seed=0, g=2, s=16, e=4):
  rng = np.random.RandomState(seed)
  expert = np.stack([rng.randint(0, e, size=[g, s]) for _ in range(2)], -1)
  expert[..., 1] = (expert[..., 0] + 1 + rng.randint(0, e - 1, [g, s])) % e
  accept = rng.uniform(size=[g, s]) < 0.7
  wanted = np.stack([np.ones([g, s], bool), accept], -1)
  dispatched = wanted & (rng.uniform(size=[g, s, 2]) < 0.75)
  gate = rng.uniform(size=[g, s, 2]).astype(np.float32)
  nonpad = (rng.uniform(size=[g, s]) > 0.2).astype(np.float32)
  r = routing.Routing(
      expert_gsk=tf.constant(expert, tf.int32), gate_gsk=tf.constant(gate),
      wanted_gsk=tf.constant(wanted),
      position_gsk=tf.zeros([g, s, 2], tf.int32),  # Metrics do not read it.
      dispatched_gsk=tf.constant(dispatched),
      weight_gsk=tf.constant(gate * dispatched), accept_gs=tf.constant(accept))
  return r, nonpad, (expert, wanted, dispatched, gate, accept)


def test_metrics_match_numpy_counts():
  e = 4
  r, nonpad, (expert, wanted, disp, gate, accept) = _Routing(e=e)
  m = routing_metrics.RoutingMetrics(r, tf.constant(nonpad), e,
                                     num_position_buckets=4)
  real = nonpad > 0
  n = real.sum()
  w = wanted & real[..., None]
  d = disp & w

  def cnt(mask, ex):
    return np.bincount(ex[mask], minlength=e).astype(float)

  np.testing.assert_allclose(m.num_tokens.numpy(), n)
  np.testing.assert_allclose(m.tokens_per_expert_first.numpy(),
                             cnt(real, expert[..., 0]) / n, rtol=1e-6)
  np.testing.assert_allclose(m.tokens_per_expert_all.numpy(),
                             cnt(w, expert) / n, rtol=1e-6)
  np.testing.assert_allclose(m.dispatched_per_expert.numpy(),
                             cnt(d, expert) / n, rtol=1e-6)
  for k, key in ((0, 'over_capacity_first'), (1, 'over_capacity_second')):
    ref = (w[..., k] & ~d[..., k]).sum() / w[..., k].sum()
    np.testing.assert_allclose(m[key].numpy(), ref, rtol=1e-6)
  n_exp = d.sum(-1)[real]
  hist = np.array([np.mean(n_exp == i) for i in range(3)])
  np.testing.assert_allclose(m.tokens_with_n_experts.numpy(), hist, rtol=1e-6)
  np.testing.assert_allclose(
      [m.frac_dispatched_0.numpy(), m.frac_dispatched_1.numpy(),
       m.frac_dispatched_2.numpy()], hist, rtol=1e-6)
  importance = np.zeros(e)
  np.add.at(importance, expert[w], gate[w])
  load = cnt(w, expert)
  np.testing.assert_allclose(m.importance.numpy(), importance, rtol=1e-5)
  np.testing.assert_allclose(m.cv_importance.numpy(),
                             importance.std() / importance.mean(), rtol=1e-5)
  np.testing.assert_allclose(m.cv_load.numpy(), load.std() / load.mean(),
                             rtol=1e-5)
  np.testing.assert_allclose(m.max_over_mean_load.numpy(),
                             load.max() / load.mean(), rtol=1e-6)
  dropped = w & ~d
  bucket = (np.arange(16) * 4) // 16
  for b in range(4):
    sel = bucket == b
    ref = dropped[:, sel].sum() / w[:, sel].sum()
    np.testing.assert_allclose(m.drop_frac_by_position.numpy()[b], ref,
                               rtol=1e-6)
  np.testing.assert_allclose(m.drop_frac_by_expert.numpy(),
                             cnt(dropped, expert) / cnt(w, expert), rtol=1e-6)
  np.testing.assert_allclose(m.random_accept_rate.numpy(),
                             (accept & real).sum() / n, rtol=1e-6)
  for v in m.values():
    assert v.dtype == tf.float32


def test_cv_squared():
  v = np.array([1.0, 2.0, 3.0, 6.0])
  np.testing.assert_allclose(routing_metrics.CVSquared(v).numpy(),
                             v.var() / v.mean()**2, rtol=1e-6)
  assert routing_metrics.CVSquared(np.zeros(3)).numpy() == 0.0
  np.testing.assert_allclose(routing_metrics.CV(v).numpy(),
                             v.std() / v.mean(), rtol=1e-6)
