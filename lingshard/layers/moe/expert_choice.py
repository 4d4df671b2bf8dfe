"""Expert-choice routing and its MoE layer (Zhou et al. 2022, §3.1, §3.2).

Experts pick tokens instead of tokens picking experts. Per group of S
tokens (n in the paper), with Wg [M, E] (replicated):

  S_gse = Softmax_e(x_gs . Wg)                            §3.1, "S = Softmax"
  I_ge = TopK over s of S_gse, k = C tokens per expert    "G, I = TopK(S^T, k)"
  y_gs = sum over experts e with s in I_ge of S_gse * FFN_e(x_gs)    eq. (3)

Capacity: Zhou et al. set k = n * c / e with c the capacity factor, "the
average number of experts each token is routed to" (c = 2 in EC-CF2). Here
C = min(S, ceil(cf * S / E)) with cf = `capacity_factor` (`CapacityTopK`
is 1 in MoEBase's C = ceil(cf * k * S / E)), or `expert_capacity` (also at
most S); cf None gives C = S (every expert takes every token). Each expert
thus gets exactly C tokens of a group with >= C real tokens: load balance
holds by construction, so the layer has no balancing loss (the router
z-loss, ST-MoE eq. 5, is reported like every gate's). Padding tokens are
never picked (score -inf); a group with fewer than C real tokens gives
each expert all of them. Ties in score go to the earlier token. A token may
be picked by no expert (its output is 0; the Transformer's residual
carries it) or by several (Zhou et al. §3.1).

Not causal: a token's experts depend on every token of its group, later
ones and other sequences included (layers/moe/causality.py). It is an
encoder layer; a decoder or language model refuses it unless the task sets
`allow_noncausal_routing`. Inference (`ForInference`) keeps the training
groups (a source is encoded whole; a group of one token would be picked by
every expert, a dense mixture unlike training) with C from
`eval_capacity_factor`; a source's routing thus depends on the sources
grouped with it, as in training.
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers.moe import base as moe_base
from lingshard.layers.moe import routing


def ExpertChoiceMask(scores_gse, nonpad_gs, capacity):
  """bool [G, S, E]: token s is among expert e's top-C real tokens by score.

  Top-k over S of the [G, E, S] scores (pads at -inf, so a pad is picked
  only when a group has fewer than C real tokens, and then masked out).
  """
  s = scores_gse.shape[1]
  real_gs = tf.cast(nonpad_gs, tf.float32) > 0
  masked_gse = tf.where(real_gs[..., tf.newaxis],
                        tf.stop_gradient(scores_gse),
                        tf.constant(-float('inf')))
  _, index_gec = tf.math.top_k(tf.transpose(masked_gse, [0, 2, 1]),
                               k=capacity)
  picked_ges = tf.reduce_max(tf.one_hot(index_gec, s, dtype=tf.int32),
                             axis=2)
  return ((tf.transpose(picked_ges, [0, 2, 1]) > 0) &
          real_gs[..., tf.newaxis])


class ExpertChoiceMoELayer(moe_base.MoEBase):
  """MoE FFN with expert-choice routing (Zhou et al. 2022); encoder-only.

  aux.aux_loss = aux_loss_weights.router_z * router z-loss (0 by default):
  expert choice needs no balancing loss.
  """

  REPLICATED_WEIGHTS = {'wg': 2}

  @classmethod
  def Params(cls):
    p = super().Params()
    # c = 2: Zhou et al.'s EC-CF2 (each token gets 2 experts on average).
    p.capacity_factor = 2.0
    p.eval_capacity_factor = 2.0
    p.weight_split_dims_mapping.Define('wg', None, 'Mapping of Wg [M, E] '
                                       '(replicated).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.num_experts_per_token is not None:
      raise ValueError(f'{p.name}: expert-choice routing has no experts per '
                       'token (experts pick capacity_factor * S / E tokens '
                       'each); num_experts_per_token must be None, got '
                       f'{p.num_experts_per_token}')
    # Initialised as GShard's wg (the default init): a zero router would
    # give every token equal scores, and every expert the same tokens.
    self.CreateVariable('wg', base_layer.WeightParams(
        [p.input_dim, p.num_experts]))

  @classmethod
  def CapacityTopK(cls, p):
    return 1  # C = ceil(cf * S / E): cf is Zhou et al.'s c.

  @classmethod
  def RoutingLeaks(cls, p):
    if p.group_size == 1:
      return None
    return ('each expert picks its top-C tokens of the group, so later '
            "tokens change earlier tokens' experts")

  @classmethod
  def ForInference(cls, p):
    """Keeps the training groups (module docstring); C from
    eval_capacity_factor (MoEBase.Capacity). Nothing to set."""
    del p
    return []

  def Capacity(self, group_size):
    """MoEBase's C, at most S (an expert cannot pick a token twice)."""
    return min(super().Capacity(group_size), group_size)

  def Route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    """Scores (einsum `GSM,ME->GSE`, softmax over E), each expert's top-C
    tokens, combine weight S_gse (module docstring)."""
    del token_gs, step  # Deterministic.
    logits_gse = routing.GatingLogits(x_gsm, theta.wg)
    scores_gse = tf.nn.softmax(logits_gse, axis=-1)
    mask_gse = ExpertChoiceMask(scores_gse, nonpad_gs, capacity)
    weight_gse = scores_gse * tf.cast(mask_gse, tf.float32)
    # Slots fill in token order: each expert has <= C picks, all dispatched.
    out_routing = routing.MaskRouting(mask_gse, weight_gse, nonpad_gs,
                                      capacity)
    return (out_routing, tf.constant(0.0),
            routing.GateStats(router_z=routing.RouterZLoss(logits_gse,
                                                           nonpad_gs)))
