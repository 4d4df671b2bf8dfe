"""Layer normalisation over the model dim (Ba et al. 2016).

`y = (x - mean_m(x)) / sqrt(var_m(x) + eps) * scale + bias`, statistics in
float32 whatever the activation dtype. Weights `scale [M]`, `bias [M]` are
replicated; the activation keeps the batch split of its input (`btm`).
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.weight_init import WeightInit


class LayerNorm(base_layer.BaseLayer):
  """Normalises the last dim M of `[..., M]` inputs."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Model dim M.')
    p.Define('epsilon', 1e-6, 'Added to the variance.')
    p.weight_split_dims_mapping.Define('scale', [-1], 'scale [M].')
    p.weight_split_dims_mapping.Define('bias', [-1], 'bias [M].')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim')
    self.CreateVariable('scale', base_layer.WeightParams(
        [p.input_dim], init=WeightInit.Constant(1.0)))
    self.CreateVariable('bias', base_layer.WeightParams(
        [p.input_dim], init=WeightInit.Constant(0.0)))

  def FProp(self, theta, inputs):
    """inputs [..., M] -> [..., M] (same dtype)."""
    x = tf.cast(inputs, tf.float32)
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * tf.math.rsqrt(var + self.params.epsilon)
    y = y * tf.cast(theta.scale, tf.float32) + tf.cast(theta.bias, tf.float32)
    return tf.cast(y, self.fprop_dtype)
