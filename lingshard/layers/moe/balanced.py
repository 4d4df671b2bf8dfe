"""Strictly balanced gating and its MoE layer (Shazeer et al. 2017, App. F).

  G_sigma(x) = Softmax(x Wg)                                          (15)
  G(x)_i = G_sigma(x)_i M_i / sum_j G_sigma(x)_j M_j                   (16)
  M_batchwise(X, m)_{j,i} = 1 iff X_{j,i} is in the top m values of
      expert i over the batch, m = k|X|/n                               (18)
  M_threshold(x, T)_i = 1 iff x_i > T_i                                 (19)
  L_batchwise = sum_j sum_i (M_threshold(x_j, T)_i - M_batchwise_{j,i})
                            * (X_{j,i} - T_i)                           (20)

Here X = G_sigma over the real tokens of one group (the batch of the mask is
the group, so capacity, like everything else, is per group); m =
floor(k |X| / n) with |X| the group's real tokens, so every expert receives
exactly m tokens in training (ties broken by token order). T is a learned
per-expert vector; inference uses M_threshold and the eval capacity.

L_batchwise trains T only: X enters it through stop_gradient (the paper
introduces it "to learn the threshold values"; letting it move the router
would trade routing quality for threshold fit).
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers.moe import routing
from lingshard.layers.moe import metrics as routing_metrics
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit
from lingshard.layers.moe import base as moe_base


def BatchwiseMask(x_gse, nonpad_gs, m_g):
  """Eq. (18) per group: top m_g real tokens of each expert (bool [G,S,E]).

  Args:
    x_gse: float32 [G, S, E] values (G_sigma).
    nonpad_gs: float32 [G, S].
    m_g: int32 [G] tokens kept per expert in each group.
  """
  real = tf.cast(nonpad_gs, tf.bool)[..., tf.newaxis]
  masked = tf.where(real, x_gse, tf.constant(-float('inf')))
  order_gse = tf.argsort(masked, axis=1, direction='DESCENDING', stable=True)
  rank_gse = tf.argsort(order_gse, axis=1, stable=True)  # Inverse perm.
  return real & (rank_gse < tf.cast(m_g, tf.int32)[:, tf.newaxis, tf.newaxis])


def ThresholdMask(x_gse, thresholds_e):
  """Eq. (19): x_i > T_i."""
  return x_gse > thresholds_e


def BatchwiseLoss(x_gse, thresholds_e, batch_mask_gse, nonpad_gs):
  """Eq. (20) summed over real tokens and experts (float32 scalar)."""
  thr = tf.cast(ThresholdMask(x_gse, thresholds_e), tf.float32)
  diff = thr - tf.cast(batch_mask_gse, tf.float32)
  per = diff * (x_gse - thresholds_e) * nonpad_gs[..., tf.newaxis]
  return tf.reduce_sum(per)


def MaskedGates(gates_gse, mask_gse):
  """Eq. (16): renormalise G_sigma over the mask (0 if the mask is empty)."""
  g = gates_gse * tf.cast(mask_gse, gates_gse.dtype)
  return tf.math.divide_no_nan(g, tf.reduce_sum(g, axis=-1, keepdims=True))


class BalancedMoELayer(moe_base.MoEBase):
  """MoE with strictly balanced (batchwise) gating, App. F.

  aux.aux_loss = w_batchwise * L_batchwise / |X| (eq. 20 averaged over real
  tokens: a per-token scale independent of batch size) + w_importance *
  CV(Importance)^2. At inference only the importance term is computed.
  """

  REPLICATED_WEIGHTS = {'wg': 2, 'thresholds': 1}

  @classmethod
  def Params(cls):
    p = super().Params()
    p.num_experts_per_token = 2  # k: each expert keeps m = k|X|/n tokens.
    p.aux_loss_weights.Define('batchwise', 1.0, 'Scale of L_batchwise / |X| '
                              '(App. F gives no weight: 1.0 adds the loss as '
                              'written).')
    p.aux_loss_weights.Define('importance', 0.0, 'Optional importance loss '
                              '(eq. 7; App. F uses none).')
    p.weight_split_dims_mapping.Define('wg', None, 'Mapping of Wg [M, E].')
    p.weight_split_dims_mapping.Define('thresholds', None,
                                       'Mapping of T [E].')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckExpertsPerToken()
    self.CreateVariable('wg', base_layer.WeightParams(
        [p.input_dim, p.num_experts]))
    # T starts at the uniform gate value 1/n.
    self.CreateVariable('thresholds', base_layer.WeightParams(
        [p.num_experts], init=WeightInit.Constant(1.0 / p.num_experts)))

  @classmethod
  def CapacityTopK(cls, p):
    return p.num_experts_per_token

  @classmethod
  def RoutingLeaks(cls, p):
    """Training's batchwise mask (eq. 18) is group-level: leaks unless
    groups are single tokens."""
    if p.group_size == 1:
      return None
    return ("each expert keeps the top m = k|X|/n tokens of its group "
            '(App. F batchwise mask), so later tokens change earlier '
            "tokens' experts")

  def TokensPerExpert(self, nonpad_gs):
    """m per group: floor(k |X| / n), int32 [G]."""
    p = self.params
    n_g = tf.cast(tf.reduce_sum(nonpad_gs, axis=1), tf.int32)
    return (p.num_experts_per_token * n_g) // p.num_experts

  def Route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    del token_gs, step  # Deterministic.
    p = self.params
    logits_gse = routing.GatingLogits(x_gsm, theta.wg)
    gates_gse = tf.nn.softmax(logits_gse, axis=-1)
    thresholds = tf.cast(theta.thresholds, tf.float32)
    real = tf.cast(nonpad_gs, tf.bool)[..., tf.newaxis]
    metrics = NestedMap()
    if p.is_inference:
      mask_gse = real & ThresholdMask(gates_gse, thresholds)
      aux_loss = tf.constant(0.0)
    else:
      mask_gse = BatchwiseMask(gates_gse, nonpad_gs,
                               self.TokensPerExpert(nonpad_gs))
      loss = BatchwiseLoss(tf.stop_gradient(gates_gse), thresholds,
                           mask_gse, nonpad_gs)
      n = tf.maximum(tf.reduce_sum(nonpad_gs), 1.0)
      aux_loss = p.aux_loss_weights.batchwise * loss / n
      metrics.batchwise_loss = loss / n
      thr_mask = real & ThresholdMask(gates_gse, thresholds)
      agree = tf.cast(tf.equal(thr_mask, mask_gse), tf.float32)
      metrics.threshold_agreement = tf.reduce_sum(
          agree * nonpad_gs[..., tf.newaxis]) / (n * p.num_experts)
    weight_gse = MaskedGates(gates_gse, mask_gse)
    out_routing = routing.MaskRouting(mask_gse, weight_gse, nonpad_gs,
                                      capacity)
    importance_e = tf.reduce_sum(weight_gse * nonpad_gs[..., tf.newaxis],
                                 axis=[0, 1])
    importance_loss = p.aux_loss_weights.importance * routing_metrics.CVSquared(importance_e)
    metrics.importance_loss = importance_loss
    load_e = tf.reduce_sum(tf.cast(mask_gse, tf.float32), axis=[0, 1])
    return (out_routing, aux_loss + importance_loss,
            routing.GateStats(importance_e, load_e, metrics,
                              routing.RouterZLoss(logits_gse, nonpad_gs)))
