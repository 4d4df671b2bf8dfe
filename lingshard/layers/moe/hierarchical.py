"""Two-level hierarchical MoE (Shazeer et al. 2017, App. B).

A primary gate picks among `a` groups of experts; group i has its own
secondary gate over its `b` experts; expert (i, j) is flat expert i*b + j
of E = a*b. The output is eq. (12):

  y_H = sum_i sum_j G_primary(x)_i * G_i(x)_j * E_ij(x)

so each token has k_primary * k_secondary (expert, weight) choices, which go
through the shared dispatch code (rank-major capacity queues; the default
capacity_factor None is dropless). Utilisation metrics are eqs. (13)-(14):

  Importance_H(X)_ij = sum_x G_primary(x)_i * G_i(x)_j
  Load_H(X)_ij = Load_primary(X)_i * Load_i(X^(i))_j / |X^(i)|

with X^(i) the tokens whose G_primary(x)_i > 0.

`gating_kind`:
- 'noisy_top_k' (App. B as written): both levels are noisy top-k gates
  (noisy_top_k); Load is the smooth estimator of App. A; aux_loss =
  w_importance * CV(Importance_H)^2 + w_load * CV(Load_H)^2.
- 'top2': both levels are GShard top-2 gates (softmax, top-2, normalised by
  g1 + g2; policy 'all'); Load is the number of tokens choosing each expert
  (so Load_H_ij = Load_i(X^(i))_j); aux_loss = aux_loss_weights.group_aux * (the
  GShard aux of the primary gate + the mean over (group g, expert group i)
  of the GShard aux of gate i over X^(i)) (each E^2-scaled: 1.0 when
  uniform, so 2.0 before the weight).

aux_loss is weighted here (aux_loss_weights: importance, load, group_aux): the task
adds it as is.
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers.moe import noisy_top_k
from lingshard.layers.moe import routing
from lingshard.layers.moe import metrics as routing_metrics
from lingshard.layers import rng as routing_rng
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit
from lingshard.layers.moe import base as moe_base
from lingshard.layers.moe import top2

GATING_KINDS = ('noisy_top_k', 'top2')


def HierarchicalImportance(gates_p_gsa, gates_s_gsab, nonpad_gs):
  """Eq. (13): [a, b]."""
  return noisy_top_k.SumOverTokens(
      gates_p_gsa[..., tf.newaxis] * gates_s_gsab, nonpad_gs)


def HierarchicalLoad(load_p_a, load_s_ab, count_a):
  """Eq. (14): Load_primary_i * Load_i(X^(i))_j / |X^(i)| ([a, b])."""
  return tf.math.divide_no_nan(load_p_a[:, tf.newaxis] * load_s_ab,
                               count_a[:, tf.newaxis])


def _F32(t):
  return tf.cast(t, tf.float32)


def _DenseGates(expert_xk, gate_xk, num):
  return tf.einsum('...k,...ke->...e', gate_xk,
                   tf.one_hot(expert_xk, num, dtype=tf.float32))


class HierarchicalMoELayer(moe_base.MoEBase):
  """Hierarchical MoE with a primary gate over groups of experts (App. B)."""

  REPLICATED_WEIGHTS = {'wg_primary': 2, 'wg_secondary': 3,
                        'w_noise_primary': 2, 'w_noise_secondary': 3}

  @classmethod
  def Params(cls):
    p = super().Params()
    p.capacity_factor = None
    p.eval_capacity_factor = None
    p.Define('num_expert_groups', 0, 'a: groups of the primary gate; '
             'num_experts = a * b.')
    p.Define('gating_kind', 'noisy_top_k', 'noisy_top_k | top2.')
    p.Define('k_primary', 2, 'Groups kept per token (noisy_top_k).')
    p.Define('k_secondary', 2, 'Experts kept per group (noisy_top_k).')
    p.Define('noisy_gating', True, 'Add eq. (4) noise in training.')
    p.Define('noise_epsilon', 0.0, 'Added to the noise stddev.')
    p.aux_loss_weights.Define('importance', 0.1, 'w_importance (eq. 7) of '
                              'Importance_H.')
    p.aux_loss_weights.Define('load', 0.1, 'w_load (eq. 11) of Load_H.')
    p.aux_loss_weights.Define('group_aux', 0.01, "gating_kind 'top2': k of "
                              'GShard §2.2 (L = nll + k * aux); as '
                              "top2.MoELayer's.")
    for name, doc in (('wg_primary', '[M, a]'), ('wg_secondary', '[a, M, b]'),
                      ('w_noise_primary', '[M, a]'),
                      ('w_noise_secondary', '[a, M, b]')):
      p.weight_split_dims_mapping.Define(name, None, f'Mapping of {doc}.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckOneOf('gating_kind', GATING_KINDS)
    a = p.num_expert_groups
    if a <= 0 or p.num_experts % a:
      raise ValueError(f'{p.name}: num_experts = {p.num_experts} must be a '
                       f'multiple of num_expert_groups = {a}')
    self._a, self._b = a, p.num_experts // a
    k1, k2 = self._Ks()
    if not (1 <= k1 <= self._a and 1 <= k2 <= self._b):
      raise ValueError(f'{p.name}: need 1 <= k_primary <= {self._a} and '
                       f'1 <= k_secondary <= {self._b}, got {k1}, {k2}')
    noisy = p.gating_kind == 'noisy_top_k'
    init = WeightInit.Constant(0.0) if noisy else None  # App. A zero init.
    m = p.input_dim
    self.CreateVariable('wg_primary', base_layer.WeightParams(
        [m, self._a], init=init))
    self.CreateVariable('wg_secondary', base_layer.WeightParams(
        [self._a, m, self._b], init=init))
    if noisy:
      self.CreateVariable('w_noise_primary', base_layer.WeightParams(
          [m, self._a], init=init))
      self.CreateVariable('w_noise_secondary', base_layer.WeightParams(
          [self._a, m, self._b], init=init))

  @staticmethod
  def _KsOf(p):
    if p.gating_kind == 'top2':
      return 2, 2
    return p.k_primary, p.k_secondary

  def _Ks(self):
    return self._KsOf(self.params)

  @classmethod
  def CapacityTopK(cls, p):
    k1, k2 = cls._KsOf(p)
    return k1 * k2

  def Gate(self, theta, x_gsm, nonpad_gs, token_gs, step):
    """Both levels' gates: NestedMap(gates_p_gsa, gates_s_gsab, expert_p,
    gate_p (k1 choices), expert_s_gsak, gate_s_gsak, load_p_a, load_s_ab,
    count_a, aux_loss, importance_loss, load_loss)."""
    p = self.params
    a, b = self._a, self._b
    k1, k2 = self._Ks()
    x = tf.cast(x_gsm, tf.float32)
    clean_p = routing.GatingLogits(x, theta.wg_primary)  # [G, S, a]
    clean_s = tf.einsum('gsm,amb->gsab', x, _F32(theta.wg_secondary))
    out = NestedMap()
    if p.gating_kind == 'top2':
      gates_p, out.expert_p, out.gate_p, _ = top2.Top2Choices(clean_p)
      gates_s, out.expert_s_gsak, out.gate_s_gsak, _ = top2.Top2Choices(
          clean_s)
      out.gates_p_gsa = _DenseGates(out.expert_p, out.gate_p, a)
      out.gates_s_gsab = _DenseGates(out.expert_s_gsak, out.gate_s_gsak, b)
      prob_p = tf.cast(out.gates_p_gsa > 0, tf.float32)
      prob_s = tf.cast(out.gates_s_gsab > 0, tf.float32)
      out.logits_p, out.logits_s = clean_p, clean_s
    else:
      noisy = p.noisy_gating and not p.is_inference
      std_p = normal_p = std_s = normal_s = None
      if noisy:
        std_p = tf.nn.softplus(tf.einsum(
            'gsm,ma->gsa', x, _F32(theta.w_noise_primary))) + p.noise_epsilon
        std_s = tf.nn.softplus(tf.einsum(
            'gsm,amb->gsab', x, _F32(theta.w_noise_secondary)))
        std_s += p.noise_epsilon
        normal_p = routing_rng.TokenNormal(
            self.layer_seed, routing_rng.STREAM_NOISE, step, token_gs, a)
        normal_s = tf.reshape(routing_rng.TokenNormal(
            self.layer_seed, routing_rng.STREAM_NOISE_SECONDARY, step,
            token_gs, a * b), tf.shape(clean_s))
      prim = noisy_top_k.NoisyTopK(clean_p, k1, std_p, normal_p)
      sec = noisy_top_k.NoisyTopK(clean_s, k2, std_s, normal_s)
      out.expert_p, out.gate_p = prim.expert_xk, prim.gate_xk
      out.expert_s_gsak, out.gate_s_gsak = sec.expert_xk, sec.gate_xk
      out.gates_p_gsa, out.gates_s_gsab = prim.gates_xe, sec.gates_xe
      out.logits_p, out.logits_s = prim.noisy_xe, sec.noisy_xe
      prob_p = prim.prob_xe if noisy else tf.cast(prim.gates_xe > 0,
                                                  tf.float32)
      prob_s = sec.prob_xe if noisy else tf.cast(sec.gates_xe > 0, tf.float32)
    selected_gsa = tf.cast(out.gates_p_gsa > 0, tf.float32)  # x in X^(i).
    out.load_p_a = noisy_top_k.SumOverTokens(prob_p, nonpad_gs)
    out.load_s_ab = noisy_top_k.SumOverTokens(
        selected_gsa[..., tf.newaxis] * prob_s, nonpad_gs)
    out.count_a = noisy_top_k.SumOverTokens(selected_gsa, nonpad_gs)
    out.importance_ab = HierarchicalImportance(out.gates_p_gsa,
                                               out.gates_s_gsab, nonpad_gs)
    out.load_ab = HierarchicalLoad(out.load_p_a, out.load_s_ab, out.count_a)
    out.importance_loss = p.aux_loss_weights.importance * routing_metrics.CVSquared(
        out.importance_ab)
    out.load_loss = p.aux_loss_weights.load * routing_metrics.CVSquared(out.load_ab)
    if p.gating_kind == 'top2':
      aux_p, _, _ = top2.GroupAuxLoss(gates_p, out.expert_p[..., 0],
                                        nonpad_gs)
      s = x.shape[1]
      gates_s_ias = tf.reshape(tf.transpose(gates_s, [0, 2, 1, 3]),
                               [-1, s, b])
      first_s = tf.reshape(tf.transpose(out.expert_s_gsak[..., 0], [0, 2, 1]),
                           [-1, s])
      nonpad_is = tf.reshape(tf.transpose(
          selected_gsa * nonpad_gs[..., tf.newaxis], [0, 2, 1]), [-1, s])
      aux_s, _, _ = top2.GroupAuxLoss(gates_s_ias, first_s, nonpad_is)
      out.aux_loss = p.aux_loss_weights.group_aux * (aux_p + aux_s)
    elif p.noisy_gating and not p.is_inference:
      out.aux_loss = out.importance_loss + out.load_loss
    else:
      out.aux_loss = out.importance_loss
    return out

  def Route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    p = self.params
    k1, _ = self._Ks()
    out = self.Gate(theta, x_gsm, nonpad_gs, token_gs, step)
    experts, gates = [], []
    for r in range(k1):
      i_gs = out.expert_p[..., r]
      # Group i's secondary choices, selected by one-hot (per-token grads).
      onehot_gsa = tf.one_hot(i_gs, self._a, dtype=tf.int32)
      j_gsk = tf.reduce_sum(out.expert_s_gsak * onehot_gsa[..., None], 2)
      g_gsk = tf.einsum('gsak,gsa->gsk', out.gate_s_gsak,
                        tf.cast(onehot_gsa, tf.float32))
      experts.append(i_gs[..., tf.newaxis] * self._b + j_gsk)
      gates.append(out.gate_p[..., r:r + 1] * g_gsk)    # Eq. (12).
    out_routing = routing.TokenChoiceRouting(
        tf.concat(experts, axis=-1), tf.concat(gates, axis=-1), nonpad_gs,
        capacity, p.num_experts)
    stats = routing.GateStats(
        tf.reshape(out.importance_ab, [-1]), tf.reshape(out.load_ab, [-1]),
        NestedMap(importance_loss=out.importance_loss,
                  load_loss=out.load_loss),
        # The primary router's z-loss plus every secondary router's.
        routing.RouterZLoss(out.logits_p, nonpad_gs) +
        routing.RouterZLoss(out.logits_s, nonpad_gs))
    return out_routing, out.aux_loss, stats
