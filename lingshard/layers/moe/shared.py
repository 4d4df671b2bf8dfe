"""Shared experts: n always-on FFNs beside the routed ones.

DeepSeekMoE (Dai et al. 2024, §3.2 "Shared Expert Isolation"): K_s experts
take every token, ungated, and their outputs add to the routed mixture,

    h_t = sum_{i <= K_s} FFN_i(u_t) + sum_{i > K_s} g_{i,t} FFN_i(u_t) (+ u_t)

(the residual u_t is the Transformer layer's here). `MoEBase` owns the
weights (`num_shared_experts` N > 0): shared_wi [N, M, Hs], shared_wo
[N, Hs, M] and, with `use_bias`, shared_bi [N, Hs], shared_bo [N, M]. They
compute on every token like a dense FFN: weights replicated, activations
split like the tokens (`gsm`, hidden `gsnh`).
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.weight_init import WeightInit

# Shared-expert weights and their ranks (all replicated: SetExpertSharding).
WEIGHT_RANKS = {'shared_wi': 3, 'shared_wo': 3, 'shared_bi': 2, 'shared_bo': 2}
WEIGHTS = tuple(WEIGHT_RANKS)


def CreateWeights(layer):
  """Declares shared_wi [N, M, Hs], shared_wo [N, Hs, M] (+ biases) on
  the MoE layer `layer` (in its __init__) if N > 0."""
  p = layer.params
  n, m = p.num_shared_experts, p.input_dim
  if n < 0:
    raise ValueError(f'{p.name}: num_shared_experts must be >= 0, got {n}')
  if n == 0:
    return
  if p.shared_hidden_dim is not None:
    layer.CheckPositive('shared_hidden_dim')
  h = p.shared_hidden_dim or p.hidden_dim
  layer.CreateVariable('shared_wi', base_layer.WeightParams([n, m, h]))
  layer.CreateVariable('shared_wo', base_layer.WeightParams([n, h, m]))
  if p.use_bias:
    zero = WeightInit.Constant(0.0)
    layer.CreateVariable('shared_bi',
                         base_layer.WeightParams([n, h], init=zero))
    layer.CreateVariable('shared_bo',
                         base_layer.WeightParams([n, m], init=zero))


def SharedExperts(layer, theta, x_gsm, nonpad_gs, step):
  """sum_n FFN_n(x) for every real token: [G, S, M] -> [G, S, M].

  einsums `GSM,NMH->GSNH`, the experts' activation and hidden dropout
  (an independent stream of the layer's dropout), then `GSNH,NHM->GSM` (the
  sum over n is the contraction). Computes in `expert_dtype` if set, like
  the routed experts; returns the caller's dtype, padding rows 0.
  """
  p = layer.params
  dtype = tf.as_dtype(p.expert_dtype or layer.fprop_dtype)
  h_gsnh = tf.einsum('gsm,nmh->gsnh', tf.cast(x_gsm, dtype),
                     tf.cast(theta.shared_wi, dtype))
  if p.use_bias:
    h_gsnh += tf.cast(theta.shared_bi, dtype)
  h_gsnh = layer.ActivateHidden(h_gsnh, step, stream=1)
  h_gsnh = layer.ShardActivation(h_gsnh, 'gsnh')
  y_gsm = tf.einsum('gsnh,nhm->gsm', h_gsnh, tf.cast(theta.shared_wo, dtype))
  if p.use_bias:
    y_gsm += tf.reduce_sum(tf.cast(theta.shared_bo, dtype), axis=0)
  y_gsm = tf.cast(y_gsm, x_gsm.dtype)
  return y_gsm * tf.cast(nonpad_gs, y_gsm.dtype)[..., tf.newaxis]
