"""GShard top-2 gating (Lepikhin et al. 2020, §2.2 and Algorithm 1).

Vectorized over groups: `Top2Gating` takes float32 gating logits
`[G, S, E]` (einsum `GSM,ME->GSE`, routing.GatingLogits) and returns a
`routing.Routing`, the group auxiliary loss and its statistics. Equivalent,
token by token, to Algorithm 1 run on each group:

  (2)  gates g[s, :] = softmax(logits[s, :])
  (5)  g1, e1, g2, e2 = top_2(g[s, :]);  (6) g1 /= g1 + g2;  (16) g2 /= g1 + g2
  (7-11) first choices take slots c_e1 = 0, 1, ... in token order; a choice
       at position >= C is dropped (its combine weight is 0); c_e advances
       even past C.
  (13) aux = mean_e (c_e / S) * m_e, c_e = first-choice count, m_e = mean gate.
  (18-22) second choices queue after ALL first choices of the group; the
       `random` policy keeps e2 iff it has room and 2 * g2 > rnd (line 19).

Deliberate conventions (documented because peers differ silently):
- Paddings are not tokens: they are never dispatched, take no slot, and are
  excluded from c_e, m_e and S in the aux loss.
- Line 22 advances c_e2 whether or not the random draw kept the token, as
  written in Algorithm 1 (`rejected_second_takes_slot=True`). False gives
  the variant where a rejected second choice frees its slot.
- Weights are normalised by g1 + g2 before drops (lines 6/16) and not
  renormalised after (`renormalize_after_drop=False`): a token keeping only
  one expert gets weight g1/(g1+g2) < 1, the rest flows via the residual.
- Aux scale: aux = E^2 * mean_e (c_e/S) m_e = E * sum_e f_e m_e per group,
  averaged over groups that contain at least one real token. Perfectly
  uniform routing (f_e = m_e = 1/E) gives exactly 1.0; a gate collapsed on
  one expert gives up to E. The layer (moe.MoELayer) multiplies it by k,
  its `aux_loss_weights.group_aux`.
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers.moe import base as moe_base
from lingshard.layers import rng as routing_rng
from lingshard.layers.moe import routing
from lingshard.nested_map import NestedMap

SECOND_EXPERT_POLICIES = ('all', 'random', 'sampling')


def TakeByIndex(values_xe, index_xk):
  """values[..., index[..., k]] as a one-hot contraction (`...e,...ke->...k`).

  Used instead of tf.math.top_k values / tf.gather so the backward pass is
  elementwise per token: a gather's gradient is a scatter over the
  flattened tensor, which the SPMD partitioner all-gathers.
  """
  onehot_xke = tf.one_hot(index_xk, values_xe.shape[-1], dtype=values_xe.dtype)
  return tf.einsum('...e,...ke->...k', values_xe, onehot_xke)


def GroupAuxLoss(gates_gse, first_expert_gs, nonpad_gs):
  """Algorithm 1 line 13 over non-padding tokens, scaled by E^2.

  Returns (aux scalar, f_ge = c_e/S per group, m_ge mean gates per group).
  """
  num_experts = gates_gse.shape[-1]
  n_g = tf.reduce_sum(nonpad_gs, axis=1)
  inv_n_g = 1.0 / tf.maximum(n_g, 1.0)
  m_ge = tf.einsum('gse,gs->ge', gates_gse, nonpad_gs) * inv_n_g[:, None]
  onehot_gse = tf.one_hot(first_expert_gs, num_experts, dtype=tf.float32)
  f_ge = tf.einsum('gse,gs->ge', onehot_gse, nonpad_gs) * inv_n_g[:, None]
  aux_g = tf.reduce_mean(f_ge * m_ge, axis=-1) * float(num_experts**2)
  has_tokens_g = tf.cast(n_g > 0, tf.float32)
  aux = (tf.reduce_sum(aux_g * has_tokens_g) /
         tf.maximum(tf.reduce_sum(has_tokens_g), 1.0))
  return aux, f_ge, m_ge


def Top2Choices(logits_gse, second_expert_policy='all', uniform_gs=None,
                gumbel_gse=None, selection_bias_e=None):
  """Algorithm 1 lines 2, 5, 6, 16, 19 (no capacity): per-token choices.

  `selection_bias_e` [E] (auxiliary-loss-free balancing, bias_balance.py)
  is added to the gates to pick the top 2 only; g1, g2 stay the gates
  ('sampling' draws its second expert without it).

  Returns (gates_gse, expert_gs2, gate_gs2 = normalised (g1, g2), accept_gs
  = the second choice passes the policy).
  """
  if second_expert_policy not in SECOND_EXPERT_POLICIES:
    raise ValueError(f'second_expert_policy must be one of '
                     f'{SECOND_EXPERT_POLICIES}, got {second_expert_policy!r}')
  logits_gse = tf.cast(logits_gse, tf.float32)
  num_experts = logits_gse.shape[-1]
  if num_experts < 2:
    raise ValueError(f'top-2 gating needs >= 2 experts, got {num_experts}')
  gates_gse = tf.nn.softmax(logits_gse, axis=-1)               # line 2
  # Line 5: top-2 (ties -> lower expert index first); values re-read from
  # the gates by one-hot so gradients stay per token (TakeByIndex).
  scores_gse = tf.stop_gradient(gates_gse)
  if selection_bias_e is not None:
    scores_gse += selection_bias_e
  _, top_e = tf.math.top_k(scores_gse, k=2)
  e1 = top_e[..., 0]
  if second_expert_policy == 'sampling':
    if gumbel_gse is None:
      raise ValueError("second_expert_policy='sampling' needs gumbel_gse")
    is_e1 = tf.one_hot(e1, num_experts, on_value=True, off_value=False)
    masked = tf.where(is_e1, tf.constant(-float('inf')),
                      logits_gse + gumbel_gse)
    e2 = tf.argmax(masked, axis=-1, output_type=tf.int32)
  else:
    e2 = top_e[..., 1]
  g12 = TakeByIndex(gates_gse, tf.stack([e1, e2], axis=-1))
  g1, g2 = g12[..., 0], g12[..., 1]
  denom = g1 + g2
  g1n, g2n = g1 / denom, g2 / denom                            # lines 6, 16
  if second_expert_policy == 'random':
    if uniform_gs is None:
      raise ValueError("second_expert_policy='random' needs uniform_gs")
    accept_gs = 2.0 * g2n > uniform_gs                         # line 19
  else:
    accept_gs = tf.ones_like(g2n, dtype=tf.bool)
  return (gates_gse, tf.stack([e1, e2], axis=-1), tf.stack([g1n, g2n], -1),
          accept_gs)


def Top2Gating(logits_gse, nonpad_gs, capacity, second_expert_policy='all',
               uniform_gs=None, gumbel_gse=None, renormalize_after_drop=False,
               rejected_second_takes_slot=True, selection_bias_e=None):
  """GShard top-2 gating, Algorithm 1 vectorized over G groups.

  Args:
    logits_gse: float32 [G, S, E] gating logits.
    nonpad_gs: float32 [G, S], 1.0 for real tokens, 0.0 for padding.
    capacity: C, slots per (expert, group).
    second_expert_policy: 'all' | 'random' (line 19: keep e2 iff it has
      room and 2*g2 > rnd) | 'sampling' (e2 ~ softmax over experts != e1,
      by Gumbel-max; always wanted).
    uniform_gs: float32 [G, S] U(0,1) draws for 'random'.
    gumbel_gse: float32 [G, S, E] Gumbel draws for 'sampling'.
    renormalize_after_drop: divide kept weights by their sum (paper: no).
    rejected_second_takes_slot: Algorithm 1 line 22 as written (see module
      docstring).
    selection_bias_e: optional [E] bias for selection only (Top2Choices).

  Returns:
    (routing.Routing, aux (line 13, unweighted, E^2-scaled),
    NestedMap(gates_gse, f_ge, m_ge) of GroupAuxLoss).
  """
  gates_gse, expert_gsk, gate_gsk, accept_gs = Top2Choices(
      logits_gse, second_expert_policy, uniform_gs, gumbel_gse,
      selection_bias_e)
  nonpad_gs = tf.cast(nonpad_gs, tf.float32)
  num_experts = gates_gse.shape[-1]
  out = routing.TokenChoiceRouting(
      expert_gsk, gate_gsk, nonpad_gs, capacity, num_experts,
      accept_gs=accept_gs, rejected_takes_slot=rejected_second_takes_slot,
      renormalize_after_drop=renormalize_after_drop)
  aux, f_ge, m_ge = GroupAuxLoss(  # Line 13.
      gates_gse, expert_gsk[..., 0], nonpad_gs)
  return out, aux, NestedMap(gates_gse=gates_gse, f_ge=f_ge, m_ge=m_ge)


class MoELayer(moe_base.MoEBase):
  """GShard top-2 MoE FFN (§2.2, Algorithm 1 gating; see py).

  aux.aux_loss = k * aux with k = `aux_loss_weights.group_aux` and aux = E^2 * mean_e
  (c_e/S) m_e averaged over groups (1.0 for perfectly uniform routing;
  py); metrics.group_aux is aux before the weight.
  """

  REPLICATED_WEIGHTS = {'wg': 2}
  SELECTION_BIAS = True

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('second_expert_policy', 'all', 'all | random (Algorithm 1 '
             'line 19) | sampling (Gumbel-sampled second expert).')
    p.Define('renormalize_after_drop', False, 'Renormalise the kept '
             'weights of a token after drops (paper: False).')
    p.Define('rejected_second_takes_slot', True, 'Algorithm 1 line 22 as '
             'written: a second choice rejected by the random policy still '
             'advances the expert counter.')
    # GShard §2.2 writes L = nll + k * aux without a value for k; 0.01 is
    # the M4 configs' value (lingshard/params/m4.py).
    p.aux_loss_weights.Define('group_aux', 0.01, 'k of GShard §2.2: '
                              'aux_loss = k * aux.')
    p.weight_split_dims_mapping.Define('wg', None, 'Mapping of wg [M, E] '
                                       '(replicated).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckOneOf('second_expert_policy', SECOND_EXPERT_POLICIES)
    if p.num_experts_per_token not in (None, 2):
      raise ValueError(f'{p.name}: GShard top-2 gating routes each token to '
                       f'2 experts; num_experts_per_token must be None or 2, '
                       f'got {p.num_experts_per_token}')
    self.CreateVariable('wg', base_layer.WeightParams(
        [p.input_dim, p.num_experts]))

  @classmethod
  def ForInference(cls, p):
    """As MoEBase, and a `random` / `sampling` second-expert policy becomes
    `all`: every token keeps its top-2 experts, as noisy gating drops its
    noise at inference. Their draws are keyed by the token's index in the
    batch (layers/rng.py), so a sentence would otherwise translate
    differently with other batch neighbours, padding or beam layout."""
    keys = super().ForInference(p)
    p.second_expert_policy = 'all'
    return keys + ['second_expert_policy']

  @classmethod
  def CapacityTopK(cls, p):
    return 2

  def Route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    """Gates in float32 (einsum `GSM,ME->GSE`), then Top2Gating."""
    p = self.params
    logits_gse = routing.GatingLogits(x_gsm, theta.wg)
    uniform_gs = gumbel_gse = None
    if p.second_expert_policy == 'random':
      uniform_gs = routing_rng.TokenUniform(
          self.layer_seed, routing_rng.STREAM_SECOND_EXPERT, step, token_gs)
    elif p.second_expert_policy == 'sampling':
      gumbel_gse = routing_rng.TokenGumbel(
          self.layer_seed, routing_rng.STREAM_GUMBEL, step, token_gs,
          p.num_experts)
    out_routing, aux, _ = Top2Gating(
        logits_gse, nonpad_gs, capacity, p.second_expert_policy,
        uniform_gs=uniform_gs, gumbel_gse=gumbel_gse,
        renormalize_after_drop=p.renormalize_after_drop,
        rejected_second_takes_slot=p.rejected_second_takes_slot,
        selection_bias_e=self.SelectionBias(theta))
    return (out_routing, p.aux_loss_weights.group_aux * aux,
            routing.GateStats(metrics=NestedMap(group_aux=aux),
                              router_z=routing.RouterZLoss(logits_gse,
                                                           nonpad_gs)))
