"""Auxiliary-loss-free load balancing (DeepSeek-V3, Liu et al. 2024, §2.1.2).

A per-expert bias b [E] is added to the router's scores for the top-k
selection only; the gate values (combine weights) stay the unbiased
scores:

    selected(x) = TopK(score(x) + b, k)          (selection: biased)
    g_i(x) = score(x)_i for i in selected(x)     (weights: unbiased)

After every step, each bias moves against its expert's load:

    b_e <- b_e + gamma * sign(mean_e'(c_e') - c_e)            (§2.1.2)

c_e = the load of expert e in the step: the choices of real tokens that
want it (`Routing.wanted_gsk`: selected, and kept by a second-expert policy
such as GShard's `random`; before capacity), summed over the whole batch:
every group, micro-batch, replica and SPMD shard. (Counting every selected
rank instead balanced the selections but not the load: with GShard's
random policy an expert picked mostly as a low-gate second choice is often
rejected, so equal selections left max/mean load at 2.0, measured.)

How the counts reach the step: b is a non-trainable weight whose gradient
slot carries c (`CountCarrier`: an identity on the combine weights whose
custom gradient for b is c). Gradients are already summed wherever the
counts must be (a pipeline's micro-batches, replicas' CrossReplicaSum, an
SPMD step's all-reduce), so the step receives the batch's counts in the
bias's gradient. The step (train/step.py) gives such weights (WeightParams
`count_update_rate` = gamma, `update_rule` = CountBalance) no optimizer
update and no share of the gradient norm, and applies `UpdatedBias`
instead. The bias is a variable
of the layer: checkpointed and restored with the other weights.

Off by default (`selection_bias_rate` 0: no variable); DeepSeek-V3 uses
gamma = 0.001 with its balancing loss weight near 0.
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.weight_init import WeightInit

WEIGHT = 'selection_bias'


def BiasWeightParams(p, layer_cls):
  """WeightParams of the [E] bias of MoE layer params `p` (rate > 0):
  zeros, non-trainable, updated by the count rule at `p.selection_bias_rate`.
  """
  if not layer_cls.SELECTION_BIAS:
    raise ValueError(f'{p.name}: selection_bias_rate needs a top-k gate '
                     f'(GShard top-2, noisy top-k); {layer_cls.__name__} '
                     'does not select by per-token scores')
  if p.selection_bias_rate < 0:
    raise ValueError(f'{p.name}: selection_bias_rate must be >= 0, got '
                     f'{p.selection_bias_rate}')
  return base_layer.WeightParams(
      [p.num_experts], init=WeightInit.Constant(0.0), trainable=False,
      count_update_rate=float(p.selection_bias_rate),
      update_rule=CountBalance)


def LoadCounts(expert_gsk, wanted_gsk, num_experts):
  """c [E]: wanted choices per expert, einsum `GSKE,GSK->E` (float32;
  `wanted_gsk` is False for padding tokens)."""
  onehot_gske = tf.one_hot(expert_gsk, num_experts, dtype=tf.float32)
  return tf.einsum('gske,gsk->e', onehot_gske,
                   tf.cast(wanted_gsk, tf.float32))


def CountCarrier(t, bias_e, counts_e):
  """`t` unchanged; d/d(bias_e) = counts_e, whatever the upstream gradient.

  `t` must reach the loss (the combine weights do), so the tape visits the
  carrier and the bias's gradient slot holds this batch part's counts.
  """
  counts_e = tf.stop_gradient(tf.cast(counts_e, bias_e.dtype))

  @tf.custom_gradient
  def Carry(t, bias_e):
    def Grad(dt):
      return dt, counts_e
    return tf.identity(t), Grad

  return Carry(t, bias_e)


def CarryCounts(routing, bias_e, num_experts):
  """`routing` whose combine weights carry its load counts to the
  gradient slot of `bias_e` (training: the step reads them there)."""
  counts_e = LoadCounts(routing.expert_gsk, routing.wanted_gsk, num_experts)
  return routing._replace(
      weight_gsk=CountCarrier(routing.weight_gsk, bias_e, counts_e))


def UpdatedBias(bias, counts, rate):
  """b + rate * sign(mean(c) - c) over the last dim (experts; leading dims
  are a pipeline's stacked [K, S] copies, each its own layer)."""
  counts = tf.cast(counts, bias.dtype)
  mean = tf.reduce_mean(counts, axis=-1, keepdims=True)
  return bias + tf.cast(rate, bias.dtype) * tf.sign(mean - counts)


class CountBalance:
  """The bias's `update_rule` (base_layer.WeightParams): the train step's
  update of a weight whose gradient slot holds the step's counts."""

  @staticmethod
  def Updated(bias, counts, rate):
    return UpdatedBias(bias, counts, rate)
