"""The routing type every MoE gate returns, and the token-choice helper.

A gate (`MoEBase.Route`) returns `(routing, aux_loss, stats)`:
`routing` is a `Routing` (below), `aux_loss` the layer's float32
auxiliary loss, its terms weighted by the layer's `aux_loss_weights`, and
`stats` a `GateStats` (below) that metrics.RoutingMetrics reports.

Shapes: G groups, S tokens per group, K choices per token, E experts, C
slots per (expert, group).
"""

import math
import typing

import tensorflow as tf


def ExpertCapacity(group_size, num_experts, capacity_factor=None,
                   expert_capacity=None, top_k=2):
  """Slots per (expert, group): explicit, or C = ceil(cf * k * S / E).

  GShard §2.2 gives each group 2N/(G*E) = 2S/E slots per expert (k = 2).
  """
  if expert_capacity is not None:
    if int(expert_capacity) < 1:
      raise ValueError(f'expert_capacity must be >= 1, got {expert_capacity}')
    return int(expert_capacity)
  if capacity_factor is None or capacity_factor <= 0:
    raise ValueError('set expert_capacity or a capacity_factor > 0, got '
                     f'capacity_factor={capacity_factor}')
  return max(1, int(math.ceil(capacity_factor * top_k * group_size /
                              num_experts)))


class GateStats(typing.NamedTuple):
  """What every gate reports beside its Routing (metrics.py reads it).

  importance_e: [E] float32 Importance (sum of gate values over real
    tokens, Shazeer eq. 6) if the gate defines its own, else None (the
    metrics compute it from the routing).
  load_e: [E] float32 Load (tokens, or expected tokens under noise,
    Shazeer eq. 10) if the gate defines its own, else None.
  metrics: NestedMap of further float32 scalars by metric name: the
    gate's loss terms (e.g. `group_aux` before its weight,
    `importance_loss` after) and diagnostics (`threshold_agreement`).
  router_z: float32 scalar, the router z-loss of the gate's logits
    (`RouterZLoss`) before its weight; MoEBase weights it by
    `aux_loss_weights.router_z` for every gate.
  """
  importance_e: typing.Any = None
  load_e: typing.Any = None
  metrics: typing.Any = None
  router_z: typing.Any = None

  def Flatten(self):
    """Every tensor reported, vectors first."""
    out = [t for t in (self.importance_e, self.load_e) if t is not None]
    out += self.metrics.Flatten() if self.metrics else []
    return out + ([] if self.router_z is None else [self.router_z])


class Routing(typing.NamedTuple):
  """Where each (group g, token s, choice k) goes and with what weight.

  Every field is always present (a NamedTuple: tf.nest and tf.function
  handle it as a structure of tensors plus the static `choice_is_expert`).

  Fields:
    expert_gsk: int32 [G, S, K], the expert that choice k of token s wants.
    gate_gsk: float32 [G, S, K], the gate value of that choice (before
      capacity drops).
    wanted_gsk: bool [G, S, K], the token is real (not padding) and the
      gating kept the choice (e.g. GShard's random second-expert policy).
    position_gsk: int32 [G, S, K], the choice's slot in its expert's buffer
      (may be >= C for a choice that did not fit).
    dispatched_gsk: bool [G, S, K], wanted and position < C: it already
      respects capacity, so dispatchers read it as is.
    weight_gsk: float32 [G, S, K], the combine weight; 0 wherever
      dispatched_gsk is False.
    accept_gs: bool [G, S], the token is real and its second choice passed
      the second-expert policy (True for every real token of gates without
      such a policy).
    choice_is_expert: Python bool. True for routings built from a mask
      (`MaskRouting`): K = E and choice k is expert k, so K is not a
      preference rank. Dispatchers and metrics read it to skip the expert
      one-hot and the per-rank metrics.
  """
  expert_gsk: tf.Tensor
  gate_gsk: tf.Tensor
  wanted_gsk: tf.Tensor
  position_gsk: tf.Tensor
  dispatched_gsk: tf.Tensor
  weight_gsk: tf.Tensor
  accept_gs: tf.Tensor
  choice_is_expert: bool = False


def GatingLogits(x_gsm, w_me):
  """float32 gating logits, einsum `GSM,ME->GSE` (GShard Algorithm 1 line 1)."""
  return tf.einsum('gsm,me->gse', tf.cast(x_gsm, tf.float32),
                   tf.cast(w_me, tf.float32))


def RouterZLoss(logits, nonpad_gs):
  """The router z-loss of ST-MoE (Zoph et al. 2022, eq. 5): the mean over
  real tokens of logsumexp(router logits)^2. It keeps the logits small
  (softmax and its gradient stay well conditioned in low precision), which
  ST-MoE found stabilises router training where balancing losses did not.

  Averaged per group, then over the groups with real tokens, as GShard's
  group loss is (equal to the token mean when groups hold as many real
  tokens; a pipeline's aux_groups-weighted combine over micro-batches is
  then exact, pipeline_aux).

  Args:
    logits: [G, S, ..., E] float32 logits whose softmax over the last dim
      is a gate; a token with several routers (e.g. the hierarchical
      gate's [G, S, A, B] secondary logits) adds their terms.
    nonpad_gs: [G, S] float32, 1 for real tokens.

  Returns:
    float32 scalar.
  """
  g, s = nonpad_gs.shape
  lse = tf.math.reduce_logsumexp(tf.cast(logits, tf.float32), axis=-1)
  z_gs = tf.reduce_sum(tf.reshape(tf.square(lse), [g, s, -1]), axis=-1)
  n_g = tf.reduce_sum(nonpad_gs, axis=1)
  per_group = tf.reduce_sum(z_gs * nonpad_gs, axis=1) / tf.maximum(n_g, 1.0)
  real_g = tf.cast(n_g > 0, tf.float32)
  return (tf.reduce_sum(per_group * real_g) /
          tf.maximum(tf.reduce_sum(real_g), 1.0))


def CapacityCut(wanted_gsk, position_gsk, capacity):
  """Dispatched = wanted & position < C (GShard Algorithm 1 lines 8, 19)."""
  return wanted_gsk & (position_gsk < capacity)


def RankMajorPositions(expert_gsk, occupy_gsk, num_experts):
  """Buffer positions: choice-rank major, then token order (Algorithm 1).

  All first choices of a group are queued (in token order) before any
  second choice, and so on: position of (s, k) in expert e = number of
  occupying choices (s', k') with e' = e and (k' < k or (k' = k, s' < s)).
  This is the exclusive cumsum of GShard Algorithm 1 lines 7/18 vectorized
  (lines 11/22 advance the counter even past capacity, as here).

  Args:
    expert_gsk: int32 [G, S, K] wanted expert per choice.
    occupy_gsk: bool [G, S, K], whether the choice advances the counter.
    num_experts: E.

  Returns:
    int32 [G, S, K] positions (may be >= capacity: CapacityCut drops those).
  """
  base_ge = None
  positions = []
  for k in range(expert_gsk.shape[-1]):
    onehot_gse = tf.one_hot(expert_gsk[:, :, k], num_experts, dtype=tf.int32)
    occ_gse = onehot_gse * tf.cast(occupy_gsk[:, :, k:k + 1], tf.int32)
    cum_gse = tf.math.cumsum(occ_gse, axis=1, exclusive=True)
    if base_ge is not None:
      cum_gse += base_ge[:, tf.newaxis, :]
    positions.append(tf.reduce_sum(cum_gse * onehot_gse, axis=-1))
    count_ge = tf.reduce_sum(occ_gse, axis=1)
    base_ge = count_ge if base_ge is None else base_ge + count_ge
  return tf.stack(positions, axis=-1)


def TokenChoiceRouting(expert_gsk, gate_gsk, nonpad_gs, capacity, num_experts,
                       accept_gs=None, rejected_takes_slot=True,
                       renormalize_after_drop=False):
  """A `Routing` from per-token choices (top-2, noisy top-k, hierarchical).

  Choice k of every real token is wanted, except a second choice (k = 1)
  whose `accept_gs` is False. Choices queue rank-major (RankMajorPositions);
  a choice is dispatched iff wanted and its position < C; its combine
  weight is its gate, or 0 when not dispatched.

  Args:
    expert_gsk: int32 [G, S, K] chosen experts.
    gate_gsk: float32 [G, S, K] their gate values.
    nonpad_gs: float32 [G, S], 1.0 for real tokens.
    capacity: C.
    num_experts: E.
    accept_gs: optional bool [G, S], the second choice passed the policy
      (GShard Algorithm 1 line 19); None = always.
    rejected_takes_slot: a rejected second choice still advances its
      expert's counter (Algorithm 1 line 22 as written).
    renormalize_after_drop: divide each token's kept weights by their sum.
  """
  nonpad_b = tf.cast(nonpad_gs, tf.float32) > 0
  k_len = expert_gsk.shape[-1]
  real_gsk = tf.broadcast_to(nonpad_b[..., tf.newaxis], tf.shape(expert_gsk))
  if accept_gs is None:
    accept_gs = tf.ones_like(nonpad_b)
    wanted_gsk = real_gsk
  else:
    keep_k = [tf.ones_like(accept_gs)] * k_len
    keep_k[1] = accept_gs
    wanted_gsk = real_gsk & tf.stack(keep_k, axis=-1)
  occupy_gsk = real_gsk if rejected_takes_slot else wanted_gsk
  position_gsk = RankMajorPositions(expert_gsk, occupy_gsk, num_experts)
  dispatched_gsk = CapacityCut(wanted_gsk, position_gsk, capacity)
  weight_gsk = gate_gsk * tf.cast(dispatched_gsk, tf.float32)
  if renormalize_after_drop:
    weight_gsk = tf.math.divide_no_nan(
        weight_gsk, tf.reduce_sum(weight_gsk, axis=-1, keepdims=True))
  return Routing(expert_gsk=expert_gsk, gate_gsk=gate_gsk,
                 wanted_gsk=wanted_gsk, position_gsk=position_gsk,
                 dispatched_gsk=dispatched_gsk, weight_gsk=weight_gsk,
                 accept_gs=accept_gs & nonpad_b)


def MaskRouting(mask_gse, weight_gse, nonpad_gs, capacity):
  """Token-choice routing from a [G, S, E] mask: choice k = expert k (K = E).

  Slots fill in token order per (group, expert); dispatched iff mask and
  position < C. accept_gs = the token is real (no second-expert policy).
  """
  position_gse = tf.math.cumsum(tf.cast(mask_gse, tf.int32), axis=1,
                                exclusive=True)
  dispatched_gse = CapacityCut(mask_gse, position_gse, capacity)
  num_experts = mask_gse.shape[-1]
  expert_gse = tf.broadcast_to(tf.range(num_experts, dtype=tf.int32),
                               tf.shape(position_gse))
  return Routing(expert_gsk=expert_gse, gate_gsk=weight_gse,
                 wanted_gsk=mask_gse, position_gsk=position_gse,
                 dispatched_gsk=dispatched_gse,
                 weight_gsk=weight_gse * tf.cast(dispatched_gse, tf.float32),
                 accept_gs=tf.cast(nonpad_gs, tf.float32) > 0,
                 choice_is_expert=True)
