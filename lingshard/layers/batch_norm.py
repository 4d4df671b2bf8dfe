"""Batch normalisation whose training statistics are those of its input.

`y = (x - mean) / sqrt(var + eps) * gamma + beta` over the last dim D, with
mean/var over every other position (paddings excluded). In training the
moments are the input's own: inside a GPipe pipeline that is one
micro-batch (GPipe §2.2). The moving averages used at inference are not
updated inside FProp (theta is an input): `FPropWithMoments` returns the
input's moments as NestedMap(count, mean, m2) (m2 = sum of squared
deviations), `CombineMoments` merges moments of disjoint parts exactly
(Chan et al. 1979), so a pipeline can return the moments of the whole
mini-batch, and `UpdatedMoving` gives the weights with the moving averages
moved towards them.
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit


def CombineMoments(a, b):
  """Moments of the union of two disjoint parts (Chan et al.'s update)."""
  count = a.count + b.count
  delta = b.mean - a.mean
  frac_b = tf.math.divide_no_nan(b.count, count)
  mean = a.mean + delta * frac_b
  m2 = a.m2 + b.m2 + tf.square(delta) * a.count * frac_b
  return NestedMap(count=count, mean=mean, m2=m2)


def Variance(moments):
  """Population variance m2 / count (0 for an empty part)."""
  return tf.math.divide_no_nan(moments.m2, moments.count)


class BatchNormLayer(base_layer.BaseLayer):
  """Normalises the last dim D of `[..., D]` inputs by batch statistics."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Normalised dim D.')
    p.Define('epsilon', 1e-3, 'Added to the variance.')
    for name in ('beta', 'gamma', 'moving_mean', 'moving_variance'):
      p.weight_split_dims_mapping.Define(name, [-1], f'{name} [D].')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckPositive('input_dim')
    d = self.params.input_dim
    for name, value, trainable in (('beta', 0.0, True), ('gamma', 1.0, True),
                                   ('moving_mean', 0.0, False),
                                   ('moving_variance', 1.0, False)):
      self.CreateVariable(name, base_layer.WeightParams(
          [d], init=WeightInit.Constant(value), trainable=trainable))

  def Moments(self, inputs, paddings=None):
    """NestedMap(count [], mean [D], m2 [D]) over the non-padded positions.

    inputs [..., D]; paddings None or [...] (inputs' leading dims, 1.0 = pad).
    """
    x = tf.cast(inputs, tf.float32)
    axes = list(range(x.shape.rank - 1))
    if paddings is None:
      w = tf.ones_like(x[..., :1])
    else:
      w = 1.0 - tf.cast(paddings, tf.float32)[..., tf.newaxis]
    count = tf.reduce_sum(w * tf.ones_like(x[..., :1]))
    mean = tf.math.divide_no_nan(tf.reduce_sum(w * x, axes), count)
    m2 = tf.reduce_sum(w * tf.square(x - mean), axes)
    return NestedMap(count=count, mean=mean, m2=m2)

  def FPropWithMoments(self, theta, inputs, paddings=None):
    """(outputs [..., D], the input's Moments).

    Training: normalised by the input's moments; inference: by the moving
    averages in theta.
    """
    moments = self.Moments(inputs, paddings)
    if self.params.is_inference:
      mean, var = theta.moving_mean, theta.moving_variance
    else:
      mean, var = moments.mean, Variance(moments)
    x = tf.cast(inputs, tf.float32)
    y = (x - mean) * tf.math.rsqrt(var + self.params.epsilon)
    y = y * tf.cast(theta.gamma, tf.float32) + tf.cast(theta.beta, tf.float32)
    return tf.cast(y, self.fprop_dtype), moments

  def FProp(self, theta, inputs, paddings=None):
    """inputs [..., D] -> [..., D]; see FPropWithMoments."""
    return self.FPropWithMoments(theta, inputs, paddings)[0]

  @staticmethod
  def UpdatedMoving(theta, moments, decay):
    """theta with moving_* moved to the moments: m <- decay m + (1-decay) x."""
    out = theta.copy()
    out.moving_mean = (decay * theta.moving_mean +
                       (1.0 - decay) * moments.mean)
    out.moving_variance = (decay * theta.moving_variance +
                           (1.0 - decay) * Variance(moments))
    return out
