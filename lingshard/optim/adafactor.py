"""Adafactor (Shazeer & Stern 2018, Algorithms 4 and 5) as a pure update.

For a weight X with gradient G at update t = step + 1 (1-based):

  beta2_t = 1 - t^(-decay_exponent)                       (§7.2, c = 0.8)
  factored (the last two dims are both >= min_dim_size_to_factor):
    R_t = beta2_t R + (1 - beta2_t) mean_col(G^2 + eps1)  [..., rows]
    C_t = beta2_t C + (1 - beta2_t) mean_row(G^2 + eps1)  [..., cols]
    V_t = R_t C_t / mean_row(R_t)                         (Algorithm 4)
  otherwise:
    V_t = beta2_t V + (1 - beta2_t)(G^2 + eps1)           (Algorithm 5)
  U_t = G / sqrt(V_t)
  U_t /= max(1, RMS(U_t) / d)                             (update clipping, §6)
  alpha_t = max(eps2, RMS(X_{t-1})) * rho_t               (relative step, §8)
  optional momentum: M_t = beta1 M + (1 - beta1) U_t; U_t = M_t
  X_t = X_{t-1} - alpha_t U_t

The paper's row/column *sums* are kept here as means (the ratio
R C / sum(R) is the same). Leading dims of a rank > 2 weight (e.g. the
experts dim E of `wi [E, M, H]`) are batch dims: each expert's matrix gets
its own factors, while RMS(X) is taken over the whole tensor. `rho_t` is the
learning rate the trainer's schedule gives; GShard uses 1.0 with
`rsqrt_decay` after 10k steps, i.e. the paper's min(1e-2, 1/sqrt(t)).
"""

import tensorflow as tf

from lingshard.nested_map import NestedMap
from lingshard.optim import base


class Adafactor(base.BaseOptimizer):
  """Adafactor with factored second moments, update clipping and relative
  step size; slots `vr`, `vc` (factored) or `v`, plus `m` if beta1 > 0."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.0, 'Momentum; 0 keeps no first moment (paper '
             'default, and what GShard uses).')
    p.Define('decay_exponent', 0.8, 'c in beta2_t = 1 - t^(-c).')
    p.Define('epsilon1', 1e-30, 'Added to G^2 (regularises V).')
    p.Define('epsilon2', 1e-3, 'Floor of the parameter scale RMS(X).')
    p.Define('clipping_threshold', 1.0, 'd of the update clipping; 0 off.')
    p.Define('multiply_by_parameter_scale', True,
             'Relative step: scale the learning rate by max(eps2, RMS(X)).')
    p.Define('factored', True, 'Factor the second moment of matrices.')
    p.Define('min_dim_size_to_factor', 128,
             'Factor only if both of the last two dims are at least this.')
    return p

  def _IsFactored(self, shape):
    p = self.params
    return (p.factored and len(shape) >= 2 and
            min(shape[-2], shape[-1]) >= p.min_dim_size_to_factor)

  def InitSlots(self, value):
    shape = list(value.shape)
    slots = NestedMap()
    if self._IsFactored(shape):
      slots.vr = tf.zeros(shape[:-1], tf.float32)
      slots.vc = tf.zeros(shape[:-2] + shape[-1:], tf.float32)
    else:
      slots.v = tf.zeros(shape, tf.float32)
    if self.params.beta1 > 0:
      slots.m = tf.zeros(shape, tf.float32)
    return slots

  def StepScalars(self, lr, step):
    """float32 scalars: lr and this step's second-moment decay beta2."""
    t = tf.cast(step, tf.float32) + 1.0
    return NestedMap(lr=tf.cast(lr, tf.float32),
                     beta2=1.0 - tf.pow(t, -self.params.decay_exponent))

  def UpdateOne(self, value, grad, slots, scalars):
    p = self.params
    x = tf.cast(value, tf.float32)
    g = tf.cast(grad, tf.float32)
    beta2 = scalars.beta2
    g2 = tf.square(g) + p.epsilon1
    new_slots = NestedMap()
    if 'vr' in slots:
      vr = beta2 * slots.vr + (1.0 - beta2) * tf.reduce_mean(g2, axis=-1)
      vc = beta2 * slots.vc + (1.0 - beta2) * tf.reduce_mean(g2, axis=-2)
      row_factor = vr / tf.reduce_mean(vr, axis=-1, keepdims=True)
      u = g * tf.math.rsqrt(row_factor[..., :, None]) * tf.math.rsqrt(
          vc[..., None, :])
      new_slots.vr, new_slots.vc = vr, vc
    else:
      v = beta2 * slots.v + (1.0 - beta2) * g2
      u = g * tf.math.rsqrt(v)
      new_slots.v = v
    if p.clipping_threshold > 0:
      u /= tf.maximum(1.0, _Rms(u) / p.clipping_threshold)
    step_size = scalars.lr
    if p.multiply_by_parameter_scale:
      step_size *= tf.maximum(p.epsilon2, _Rms(x))
    if p.beta1 > 0:
      u = p.beta1 * slots.m + (1.0 - p.beta1) * u
      new_slots.m = u
    return tf.cast(x - step_size * u, value.dtype), new_slots


def _Rms(t):
  return tf.sqrt(tf.reduce_mean(tf.square(t)))
