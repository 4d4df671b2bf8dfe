"""Noisy top-k gating and its MoE layer (Shazeer et al. 2017, §2.1, §4, App. A).

  H(x)_i = (x Wg)_i + StandardNormal() * Softplus((x Wnoise)_i)      eq. (4)
  G(x) = Softmax(KeepTopK(H(x), k))                                  eq. (3)
  (gate_softmax='all', Switch Transformer §2.1: G(x)_i = Softmax(H(x))_i
  for the top k, not renormalised: with k = 1 the router keeps a gradient)
  Importance(X) = sum_x G(x);  L_importance = w_imp * CV(Importance)^2  (6, 7)
  P(x, i) = Phi(((x Wg)_i - kth_excluding(H(x), k, i)) / Softplus(...)_i) (9)
  Load(X)_i = sum_x P(x, i);   L_load = w_load * CV(Load)^2          (10, 11)

kth_excluding(H, k, i) is the (k+1)-th largest of H when i is in the top k,
else the k-th largest. Wg and Wnoise start at zero (App. A, "Initial Load
Imbalance"). Noise is added in training only; at inference G uses x Wg and
Load falls back to the count of tokens per expert. Sums run over real
(non-padding) tokens of the whole batch. The StandardNormal() draws come from
the counter-based routing RNG (layers/rng.py), one per (token, expert).

The layer (`NoisyTopKMoELayer`) dispatches each token to its k experts with
the shared dispatch code. Shazeer et al. never drop tokens: the default
capacity_factor None gives C = S (dropless); set a factor to bound buffers
GShard-style (choices queue rank-major, as in GShard Algorithm 1).
"""

import numpy as np
import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers.moe import routing
from lingshard.layers.moe import metrics as routing_metrics
from lingshard.layers import rng as routing_rng
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit
from lingshard.layers.moe import base as moe_base
from lingshard.layers.moe import top2


def _NormalCdf(z):
  """Phi, the standard normal CDF."""
  return 0.5 * tf.math.erfc(-z / np.sqrt(2.0))


def LoadProbability(clean_xe, noisy_xe, noise_std_xe, k):
  """P(x, i) of App. A eq. (9) for every expert i (float32, [..., E]).

  Args:
    clean_xe: (x Wg), [..., E].
    noisy_xe: H(x), [..., E] (same draws as used for routing).
    noise_std_xe: Softplus(x Wnoise) (+ epsilon), [..., E], > 0.
    k: experts kept per token.
  """
  num_experts = clean_xe.shape[-1]
  if k >= num_experts:
    return tf.ones_like(clean_xe)
  _, top_idx = tf.math.top_k(tf.stop_gradient(noisy_xe), k=k + 1)
  top_vals = top2.TakeByIndex(noisy_xe, top_idx)
  thresh_if_in = top_vals[..., k:k + 1]       # (k+1)-th largest.
  thresh_if_out = top_vals[..., k - 1:k]      # k-th largest.
  is_in = noisy_xe > thresh_if_in
  prob_if_in = _NormalCdf((clean_xe - thresh_if_in) / noise_std_xe)
  prob_if_out = _NormalCdf((clean_xe - thresh_if_out) / noise_std_xe)
  return tf.where(is_in, prob_if_in, prob_if_out)


GATE_SOFTMAX = ('kept', 'all')


def NoisyTopK(clean_xe, k, noise_std_xe=None, normal_xe=None,
              gate_softmax='kept', selection_bias_e=None):
  """Eqs. (3)-(5): top-k of H(x) then softmax over the kept values
  (gate_softmax='kept'), or the top k's probabilities under a softmax over
  every expert (gate_softmax='all', Switch Transformer §2.1). With k = 1,
  'kept' gives gate 1 and no router gradient; 'all' gives p_i(x).

  `selection_bias_e` [E] (bias_balance.py) is added to H(x) to pick the
  top k only; the gates are computed from H(x) without it.

  Returns NestedMap(noisy_xe, expert_xk, gate_xk (the k kept gates),
  gates_xe (dense G(x), zeros off the top k), prob_xe (P(x, i), or None
  without noise)).
  """
  if gate_softmax not in GATE_SOFTMAX:
    raise ValueError(f'gate_softmax must be one of {GATE_SOFTMAX}, got '
                     f'{gate_softmax!r}')
  clean_xe = tf.cast(clean_xe, tf.float32)
  num_experts = clean_xe.shape[-1]
  if not 1 <= k <= num_experts:
    raise ValueError(f'top-k needs 1 <= k <= E, got k={k}, E={num_experts}')
  if noise_std_xe is not None:
    noisy_xe = clean_xe + normal_xe * noise_std_xe
  else:
    noisy_xe = clean_xe
  scores_xe = tf.stop_gradient(noisy_xe)
  if selection_bias_e is not None:
    scores_xe += selection_bias_e
  _, top_idx = tf.math.top_k(scores_xe, k=k)
  top_vals = top2.TakeByIndex(noisy_xe, top_idx)
  if gate_softmax == 'all':
    gate_xk = top2.TakeByIndex(tf.nn.softmax(noisy_xe, axis=-1), top_idx)
  else:
    gate_xk = tf.nn.softmax(top_vals, axis=-1)
  gates_xe = tf.einsum('...k,...ke->...e', gate_xk,
                       tf.one_hot(top_idx, num_experts, dtype=tf.float32))
  prob_xe = None
  if noise_std_xe is not None:
    prob_xe = LoadProbability(clean_xe, noisy_xe, noise_std_xe, k)
  return NestedMap(noisy_xe=noisy_xe, expert_xk=top_idx, gate_xk=gate_xk,
                   gates_xe=gates_xe, prob_xe=prob_xe)


def SumOverTokens(v_gse, nonpad_gs):
  """sum over real tokens: [G, S, ...] -> [...]."""
  mask = tf.reshape(tf.cast(nonpad_gs, tf.float32),
                    nonpad_gs.shape.as_list() + [1] * (v_gse.shape.rank - 2))
  return tf.reduce_sum(v_gse * mask, axis=[0, 1])


class NoisyTopKMoELayer(moe_base.MoEBase):
  """Sparsely-gated MoE with noisy top-k gating (Shazeer et al. 2017).

  aux.aux_loss = L_importance + L_load = w_importance * CV(Importance)^2 +
  w_load * CV(Load)^2 (eqs. 7, 11; defaults w = 0.1 as in App. C), weighted
  here: the task adds it as is. In inference only L_importance is defined
  (no noise): aux_loss then omits L_load. With inputs [B, T, M] from an
  LSTM, k = 4 and output_activation 'sigmoid' it is the LM layer of App. C.
  """

  REPLICATED_WEIGHTS = {'wg': 2, 'w_noise': 2}
  SELECTION_BIAS = True

  @classmethod
  def Params(cls):
    p = super().Params()
    p.capacity_factor = None
    p.eval_capacity_factor = None
    # k of noisy top-k (2: the multilingual MT model of App. E; its flat LM
    # and single-pair MT layers use 4).
    p.num_experts_per_token = 2
    p.Define('noisy_gating', True, 'Add the eq. (4) noise in training.')
    p.Define('noise_epsilon', 0.0, 'Added to Softplus(x Wnoise) (paper: 0; '
             "the authors' code uses 1e-2).")
    p.aux_loss_weights.Define('importance', 0.1, 'w_importance of eq. (7): '
                              'importance_loss = w * CV(Importance)^2.')
    p.aux_loss_weights.Define('load', 0.1, 'w_load of eq. (11): load_loss = '
                              'w * CV(Load)^2 (noisy training only).')
    p.Define('renormalize_after_drop', False, 'Renormalise kept weights '
             'after capacity drops.')
    p.Define('gate_softmax', 'kept', "kept: softmax over the k kept logits "
             "(Shazeer eq. 3); all: each chosen expert's gate is its "
             'probability under a softmax over all E logits, not '
             'renormalised (Switch Transformer §2.1: with k = 1 the router '
             'keeps a gradient).')
    p.weight_split_dims_mapping.Define('wg', None, 'Mapping of Wg [M, E].')
    p.weight_split_dims_mapping.Define('w_noise', None,
                                       'Mapping of Wnoise [M, E].')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckExpertsPerToken()
    self.CheckOneOf('gate_softmax', GATE_SOFTMAX)
    if (p.selection_bias_rate and p.noisy_gating and
        p.aux_loss_weights.load):
      raise ValueError(f'{p.name}: selection_bias_rate > 0 needs '
                       'aux_loss_weights.load = 0 (eq. 9\'s P(x, i) does not '
                       'see the selection bias)')
    zero = WeightInit.Constant(0.0)
    shape = [p.input_dim, p.num_experts]
    self.CreateVariable('wg', base_layer.WeightParams(shape, init=zero))
    self.CreateVariable('w_noise', base_layer.WeightParams(shape, init=zero))

  @classmethod
  def CapacityTopK(cls, p):
    return p.num_experts_per_token

  def Gate(self, theta, x_gsm, token_gs, step):
    """NoisyTopK on [G, S, M] inputs (float32), noise in training only."""
    p = self.params
    clean_gse = routing.GatingLogits(x_gsm, theta.wg)
    std_gse = normal_gse = None
    if p.noisy_gating and not p.is_inference:
      std_gse = tf.nn.softplus(routing.GatingLogits(x_gsm, theta.w_noise))
      std_gse += p.noise_epsilon
      normal_gse = routing_rng.TokenNormal(
          self.layer_seed, routing_rng.STREAM_NOISE, step, token_gs,
          p.num_experts)
    return NoisyTopK(clean_gse, p.num_experts_per_token, std_gse, normal_gse,
                     gate_softmax=p.gate_softmax,
                     selection_bias_e=self.SelectionBias(theta))

  def Route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    p = self.params
    out = self.Gate(theta, x_gsm, token_gs, step)
    out_routing = routing.TokenChoiceRouting(
        out.expert_xk, out.gate_xk, nonpad_gs, capacity, p.num_experts,
        renormalize_after_drop=p.renormalize_after_drop)
    importance_e = SumOverTokens(out.gates_xe, nonpad_gs)
    if out.prob_xe is not None:
      load_e = SumOverTokens(out.prob_xe, nonpad_gs)
    else:
      load_e = SumOverTokens(tf.cast(out.gates_xe > 0, tf.float32), nonpad_gs)
    importance_loss = p.aux_loss_weights.importance * routing_metrics.CVSquared(importance_e)
    load_loss = p.aux_loss_weights.load * routing_metrics.CVSquared(load_e)
    aux_loss = importance_loss
    if out.prob_xe is not None:
      aux_loss += load_loss
    # z-loss of the logits the gate's softmax sees (noisy in training).
    stats = routing.GateStats(importance_e, load_e, NestedMap(
        importance_loss=importance_loss, load_loss=load_loss),
                              routing.RouterZLoss(out.noisy_xe, nonpad_gs))
    return out_routing, aux_loss, stats
