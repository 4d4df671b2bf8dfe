"""Max / average pooling and global average pooling on `[B, H, W, C]`.

`PoolingLayer`: y[b, i, j, c] = max or mean of x[b, s i + u - p_h,
s j + v - p_w, c] over the window (u, v) with TensorFlow's SAME/VALID
padding (SAME average pooling divides by the in-image positions only).
`GlobalAvgPoolLayer`: y[b, c] = mean_{h, w} x[b, h, w, c] (`bhwc->bc`).

Neither has weights. Sharding: the batch dim B of the output is split over
the logical 'batch' axis (`activation_split_dims_mapping.out`); H, W and C
are not split.
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import conv
from lingshard.layers import kinks

POOLING_TYPES = ('MAX', 'AVG')


class PoolingLayer(base_layer.BaseLayer):
  """`[B, H, W, C] -> [B, H', W', C]` max or average pooling."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('window_shape', (2, 2), 'Window (KH, KW).')
    p.Define('window_stride', (2, 2), 'Strides (SH, SW).')
    p.Define('padding', 'SAME', 'SAME or VALID.')
    p.Define('pooling_type', 'MAX', 'MAX or AVG.')
    p.activation_split_dims_mapping.Define(
        'out', [base_layer.BATCH, -1, -1, -1],
        'Mapping of the output [B, H, W, C]: batch over data.')
    return p

  def __init__(self, params):
    super().__init__(params)
    conv.CheckPair(self, 'window_shape')
    conv.CheckPair(self, 'window_stride')
    self.CheckOneOf('padding', conv.PADDINGS)
    self.CheckOneOf('pooling_type', POOLING_TYPES)

  def FProp(self, theta, inputs):
    """inputs [B, H, W, C] -> [B, H', W', C]."""
    del theta
    p = self.params
    conv.CheckImageInput(self, inputs, tuple(inputs.shape)[-1])
    x = tf.cast(inputs, self.fprop_dtype)
    window, strides = list(p.window_shape), list(p.window_stride)
    if p.pooling_type == 'MAX':  # The SPMD checker's hooks (kinks.py).
      y = kinks.MaxPool(x, window, strides, p.padding)
    else:
      y = tf.nn.pool(x, window_shape=window, pooling_type='AVG',
                     strides=strides, padding=p.padding)
    return self.ShardActivation(y, 'out')


class GlobalAvgPoolLayer(base_layer.BaseLayer):
  """`[B, H, W, C] -> [B, C]`: the mean over H and W."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.activation_split_dims_mapping.Define(
        'out', [base_layer.BATCH, -1], 'Mapping of the output [B, C].')
    return p

  def FProp(self, theta, inputs):
    """inputs [B, H, W, C] -> [B, C]."""
    del theta
    conv.CheckImageInput(self, inputs, tuple(inputs.shape)[-1])
    y = tf.reduce_mean(tf.cast(inputs, self.fprop_dtype), axis=[1, 2])
    return self.ShardActivation(y, 'out')
