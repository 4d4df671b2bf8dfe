"""Routing metrics every MoE layer returns for summaries (float32).

Computed from a `routing.Routing` over real (non-padding) tokens only. A
choice is *wanted* when the gate picked it and the second-expert policy
kept it; it is
*dispatched* when it also got a slot (position < C); wanted but not
dispatched = dropped (over capacity).

Keys (E experts, K choices per token, B position buckets; for routings with
`choice_is_expert` (K = E, e.g. batchwise gating) the per-rank keys
tokens_per_expert_first and over_capacity_first/second are omitted):
  tokens_per_expert_first [E]  fraction of tokens whose 1st choice is e
  tokens_per_expert_all   [E]  fraction of tokens wanting e (any choice)
  dispatched_per_expert   [E]  fraction of tokens dispatched to e
  over_capacity_first, over_capacity_second   dropped / wanted, per rank
  over_capacity_by_choice [K]  the same for every rank
  tokens_with_n_experts [K+1]  fraction of tokens dispatched to 0..K experts
  frac_dispatched_0/1/2        scalars of the above (GShard's 0/1/2 experts)
  importance [E], load [E]      Importance(X), Load(X) (layer-defined)
  cv_importance, cv_load, max_over_mean_load   Shazeer et al. Table 6
  drop_frac_by_position   [B]  dropped / wanted by position bucket in group
                               (cumsum dispatch drops late tokens)
  drop_frac_by_expert     [E]  dropped / wanted by wanted expert
  random_accept_rate           second choices kept by the policy / tokens
                               (1.0 for gates without a policy)
  num_tokens                   real tokens in the batch

`CombineParts(parts)` combines the metrics of parts of a batch (a
pipeline's micro-batches) into the batch's: counts (num_tokens,
importance, load) sum, so the CVs and max_over_mean_load computed from
them are exact; fractions of the real tokens are token-weighted means
(exact), drop_frac_by_expert is weighted by each expert's wanted choices
(exact); the other ratios (over capacity by choice / second, drops by
position) and the gate's own metrics are token-weighted means of the
parts' values.
"""

import tensorflow as tf

from lingshard import nested_map
from lingshard.nested_map import NestedMap


def CV(x):
  """Coefficient of variation std/mean (population std, Shazeer §4)."""
  x = tf.cast(x, tf.float32)
  mean = tf.reduce_mean(x)
  var = tf.reduce_mean(tf.square(x - mean))
  return tf.math.divide_no_nan(tf.sqrt(var), mean)


def CVSquared(x, eps=1e-10):
  """CV(x)^2 = var / mean^2, as used by L_importance and L_load (eqs. 7, 11).

  `eps` keeps the loss finite when all entries are 0 (e.g. an all-padding
  batch); it changes the value by a relative 1e-10 otherwise.
  """
  x = tf.cast(x, tf.float32)
  mean = tf.reduce_mean(x)
  var = tf.reduce_mean(tf.square(x - mean))
  return var / (tf.square(mean) + eps)


def _F32(t):
  return tf.cast(t, tf.float32)


def _PerExpert(values_gsk, expert_gsk, num_experts):
  return tf.math.unsorted_segment_sum(tf.reshape(values_gsk, [-1]),
                                      tf.reshape(expert_gsk, [-1]),
                                      num_experts)


def RoutingMetrics(routing, nonpad_gs, num_experts, importance_e=None,
                   load_e=None, num_position_buckets=4):
  """NestedMap of float32 routing metrics (module docstring).

  Args:
    routing: a routing.Routing.
    nonpad_gs: float32 [G, S].
    num_experts: E.
    importance_e: optional [E] Importance(X); default sum of the wanted
      choices' gates per expert.
    load_e: optional [E] Load(X); default number of wanted choices per
      expert (before capacity).
    num_position_buckets: B.
  """
  nonpad_gs = _F32(nonpad_gs)
  expert_gsk = routing.expert_gsk
  k_len = expert_gsk.shape[-1]
  s_len = expert_gsk.shape[1]
  real_gsk = _F32(tf.broadcast_to(nonpad_gs[..., tf.newaxis],
                                 tf.shape(expert_gsk)))
  wanted_gsk = _F32(routing.wanted_gsk) * real_gsk
  dispatched_gsk = _F32(routing.dispatched_gsk) * wanted_gsk
  dropped_gsk = wanted_gsk - dispatched_gsk
  n = tf.reduce_sum(nonpad_gs)
  inv_n = 1.0 / tf.maximum(n, 1.0)
  m = NestedMap(num_tokens=n)

  by_rank = not routing.choice_is_expert
  if by_rank:  # Choice k is a preference rank (not so for K = E routing).
    m.tokens_per_expert_first = _PerExpert(
        real_gsk[..., 0], expert_gsk[..., 0], num_experts) * inv_n
  m.tokens_per_expert_all = _PerExpert(wanted_gsk, expert_gsk,
                                       num_experts) * inv_n
  m.dispatched_per_expert = _PerExpert(dispatched_gsk, expert_gsk,
                                       num_experts) * inv_n

  wanted_k = tf.reduce_sum(wanted_gsk, axis=[0, 1])
  dropped_k = tf.reduce_sum(dropped_gsk, axis=[0, 1])
  m.over_capacity_by_choice = tf.math.divide_no_nan(dropped_k, wanted_k)
  if by_rank:
    m.over_capacity_first = m.over_capacity_by_choice[0]
    if k_len > 1:
      m.over_capacity_second = m.over_capacity_by_choice[1]

  n_disp_gs = tf.cast(tf.reduce_sum(dispatched_gsk, axis=-1), tf.int32)
  hist = tf.math.unsorted_segment_sum(tf.reshape(nonpad_gs, [-1]),
                                      tf.reshape(n_disp_gs, [-1]), k_len + 1)
  m.tokens_with_n_experts = hist * inv_n
  for i in range(min(k_len, 2) + 1):
    m[f'frac_dispatched_{i}'] = m.tokens_with_n_experts[i]

  if importance_e is None:
    importance_e = _PerExpert(_F32(routing.gate_gsk) * wanted_gsk, expert_gsk,
                              num_experts)
  if load_e is None:
    load_e = _PerExpert(wanted_gsk, expert_gsk, num_experts)
  m.importance = _F32(importance_e)
  m.load = _F32(load_e)
  m.cv_importance = CV(importance_e)
  m.cv_load = CV(load_e)
  m.max_over_mean_load = tf.math.divide_no_nan(
      tf.reduce_max(_F32(load_e)), tf.reduce_mean(_F32(load_e)))

  # Drop attribution.
  bucket_s = (tf.range(s_len) * num_position_buckets) // s_len
  wanted_s = tf.reduce_sum(wanted_gsk, axis=[0, 2])
  dropped_s = tf.reduce_sum(dropped_gsk, axis=[0, 2])
  m.drop_frac_by_position = tf.math.divide_no_nan(
      tf.math.unsorted_segment_sum(dropped_s, bucket_s, num_position_buckets),
      tf.math.unsorted_segment_sum(wanted_s, bucket_s, num_position_buckets))
  m.drop_frac_by_expert = tf.math.divide_no_nan(
      _PerExpert(dropped_gsk, expert_gsk, num_experts),
      _PerExpert(wanted_gsk, expert_gsk, num_experts))
  m.random_accept_rate = tf.reduce_sum(
      _F32(routing.accept_gs) * nonpad_gs) * inv_n
  return m


COUNTS = ('num_tokens', 'importance', 'load')


def CombineParts(parts):
  """The routing metrics of a batch from those of its parts (module
  docstring): a list of NestedMaps with one structure -> NestedMap."""
  n_i = [_F32(m.num_tokens) for m in parts]

  def Mean(key, weights=None):
    weights = weights or n_i
    total = tf.add_n(weights)
    return tf.math.divide_no_nan(
        tf.add_n([_F32(m[key]) * w for m, w in zip(parts, weights)]), total)

  out = NestedMap()
  for key in parts[0]:
    if key in COUNTS:
      out[key] = tf.add_n([_F32(m[key]) for m in parts])
    elif key == 'drop_frac_by_expert' and 'tokens_per_expert_all' in parts[0]:
      out[key] = Mean(key, [_F32(m.tokens_per_expert_all) * w
                            for m, w in zip(parts, n_i)])
    elif key in ('cv_importance', 'cv_load', 'max_over_mean_load'):
      continue  # From the combined counts below.
    else:
      out[key] = Mean(key)
  if 'importance' in out:
    out.cv_importance = CV(out.importance)
  if 'load' in out:
    out.cv_load = CV(out.load)
    out.max_over_mean_load = tf.math.divide_no_nan(
        tf.reduce_max(out.load), tf.reduce_mean(out.load))
  return NestedMap({key: out[key] for key in parts[0]})


def WeightedMetrics(metrics, prefix):
  """Sorted [(name, (value, weight))] of a layer's routing metrics for a
  task's metrics: each weighted by the layer's real tokens (`num_tokens`),
  so means over replicas or eval batches weight batches by their tokens;
  `num_tokens` itself is a count (weight 1; the step sums counts over
  replicas)."""
  one = tf.constant(1.0)
  tokens = tf.cast(metrics.get('num_tokens', one), tf.float32)
  return [(name, (tf.cast(value, tf.float32),
                  one if name.endswith('num_tokens') else tokens))
          for name, value in nested_map.FlattenMetrics(metrics, prefix)]
