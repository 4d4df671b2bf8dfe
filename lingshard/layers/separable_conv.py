"""Depthwise-separable 2-D convolution (Chollet 2017; AmoebaNet's cells).

A depthwise convolution, each input channel c filtered by its own
`multiplier` filters, then a 1x1 (pointwise) projection:

    d[b, i, j, c m] = sum_{u, v} x[b, s i + u - p_h, s j + v - p_w, c]
                      dw[u, v, c, m]                       (depthwise)
    y = act(d pw + bias)                                   (`bhwk,ko->bhwo`)

with k = c m (channel c's m-th filter at index c * multiplier + m, as
tf.nn.depthwise_conv2d orders them) and TensorFlow's SAME/VALID padding.

Sharding: the output's batch dim B is split over the logical 'batch' axis
(`activation_split_dims_mapping.out`, default ['batch', -1, -1, -1]);
dw [KH, KW, Cin, multiplier], pw [Cin multiplier, Cout] and the bias
[Cout] are replicated by default (`weight_split_dims_mapping`).
"""

import math

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import conv
from lingshard.layers import linear
from lingshard.weight_init import WeightInit


class SeparableConv2DLayer(base_layer.BaseLayer):
  """`[B, H, W, Cin] -> [B, H', W', Cout]` (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input channels Cin.')
    p.Define('output_dim', 0, 'Output channels Cout.')
    p.Define('kernel_size', (3, 3), 'Depthwise window (KH, KW).')
    p.Define('multiplier', 1, 'Depthwise filters per input channel.')
    p.Define('filter_stride', (1, 1), 'Depthwise strides (SH, SW).')
    p.Define('padding', 'SAME', 'SAME or VALID.')
    p.Define('activation', 'none', 'Activation name (linear.ACTIVATIONS).')
    p.Define('has_bias', True, 'Whether to add a bias [Cout].')
    p.weight_split_dims_mapping.Define('dw', None, 'Mapping of dw [KH, KW, '
                                       'Cin, multiplier]; None: replicated.')
    p.weight_split_dims_mapping.Define('pw', None, 'Mapping of pw [Cin '
                                       'multiplier, Cout]; None: replicated.')
    p.weight_split_dims_mapping.Define('b', None, 'Mapping of b [Cout]; '
                                       'None: replicated.')
    p.activation_split_dims_mapping.Define(
        'out', [base_layer.BATCH, -1, -1, -1],
        'Mapping of the output [B, H, W, Cout]: batch over data.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'output_dim', 'multiplier')
    conv.CheckPair(self, 'kernel_size')
    conv.CheckPair(self, 'filter_stride')
    self.CheckOneOf('padding', conv.PADDINGS)
    self._act = linear.Activation(p.activation)
    kh, kw = p.kernel_size
    # Fans gives dw fan_in Cin; its real fan-in is KH KW: std 1/sqrt(KH KW).
    self.CreateVariable('dw', base_layer.WeightParams(
        [kh, kw, p.input_dim, p.multiplier], init=WeightInit.GaussianSqrtFanIn(
            math.sqrt(p.input_dim / (kh * kw)))))
    self.CreateVariable('pw', base_layer.WeightParams(
        [p.input_dim * p.multiplier, p.output_dim],
        init=WeightInit.GaussianSqrtFanIn(math.sqrt(2.0))))
    if p.has_bias:
      self.CreateVariable('b', base_layer.WeightParams(
          [p.output_dim], init=WeightInit.Constant(0.0)))

  def FProp(self, theta, inputs):
    """inputs [B, H, W, Cin] -> [B, H', W', Cout]."""
    p = self.params
    conv.CheckImageInput(self, inputs, p.input_dim)
    x = tf.cast(inputs, self.fprop_dtype)
    d = tf.nn.depthwise_conv2d(x, tf.cast(theta.dw, self.fprop_dtype),
                               strides=[1, *p.filter_stride, 1],
                               padding=p.padding)
    y = tf.einsum('bhwk,ko->bhwo', d, tf.cast(theta.pw, self.fprop_dtype))
    if p.has_bias:
      y += tf.cast(theta.b, self.fprop_dtype)
    return self.ShardActivation(self._act(y), 'out')
