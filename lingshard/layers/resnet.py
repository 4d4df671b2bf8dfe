"""ResNet's pieces (He et al. 2016) on `[B, H, W, C]` images.

`ConvBnLayer`: act(BN(conv(x))) (the conv has no bias: BN's beta is one).
`ResidualBlock`: the basic block y = relu(x + BN(conv(relu(BN(conv(x))))))
with 3x3 convolutions that keep [H, W, C], so a stack of them can run as a
GPipe pipeline body: `FProp(theta, x, paddings)` with paddings [b] (1.0 =
a padded example: a pipeline bubble's micro-batch, left out of the batch
statistics and of the moving averages) returns (y, aux) with aux.moments
the batch-norm moments of its two BNs (pipeline_aux combines them over
micro-batches).

Sharding: every activation's batch dim over the logical 'batch' axis (the
convolutions' `out` mappings); weights replicated (batch_norm, conv).
`bn_groups` is every BatchNormLayer.num_groups: G > 1 gives each of G
consecutive blocks of the batch (each data replica's shard when G = the
data shards) its own batch statistics (layers/batch_norm.py).
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import batch_norm
from lingshard.layers import conv
from lingshard.layers import kinks
from lingshard.layers import linear
from lingshard.nested_map import NestedMap


def ImagePaddings(paddings_b, x_bhwc):
  """[b] example paddings -> [b, H, W] (each position of an example)."""
  if paddings_b is None:
    return None
  p = tf.cast(paddings_b, tf.float32)
  return p[:, tf.newaxis, tf.newaxis] * tf.ones_like(x_bhwc[..., 0],
                                                     tf.float32)


class ConvBnLayer(base_layer.BaseLayer):
  """`[B, H, W, Cin] -> [B, H', W', Cout]`: act(BN(conv(x)))."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('filter_shape', (3, 3, 0, 0), 'Filter (KH, KW, Cin, Cout).')
    p.Define('filter_stride', (1, 1), 'Strides (SH, SW).')
    p.Define('activation', 'relu', 'After BN (linear.ACTIVATIONS).')
    p.Define('bn_decay', 0.99, 'BatchNormLayer.decay.')
    p.Define('bn_groups', 1, 'BatchNormLayer.num_groups (per-replica '
             'statistics; module docstring).')
    p.Define('conv_impl', 'conv2d', 'Conv2DLayer.impl (patches: for a '
             'pipeline body on a mesh).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('conv', conv.Conv2DLayer.Params().Set(
        filter_shape=p.filter_shape, filter_stride=p.filter_stride,
        has_bias=False, impl=p.conv_impl))
    self.CreateChild('bn', batch_norm.BatchNormLayer.Params().Set(
        input_dim=p.filter_shape[3], decay=p.bn_decay,
        num_groups=p.bn_groups))
    self._act = linear.Activation(p.activation)

  def FPropWithMoments(self, theta, x, paddings=None):
    """(y, the BN input's moments); paddings None or [B] per example."""
    h = self.conv.FProp(theta.conv, x)
    h, moments = self.bn.FPropWithMoments(theta.bn, h,
                                          ImagePaddings(paddings, h))
    return self._act(h), moments

  def FProp(self, theta, x, paddings=None):
    return self.FPropWithMoments(theta, x, paddings)[0]


class ResidualBlock(base_layer.BaseLayer):
  """The basic residual block on [B, H, W, C] (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('channels', 0, 'C: input and output channels.')
    p.Define('kernel_size', 3, 'Square filter size.')
    p.Define('bn_decay', 0.99, 'BatchNormLayer.decay.')
    p.Define('bn_groups', 1, 'BatchNormLayer.num_groups (per-replica '
             'statistics; module docstring).')
    p.Define('conv_impl', 'conv2d', 'Conv2DLayer.impl of both convolutions '
             '(patches: vectorises over a pipeline\'s stacked stages).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('channels', 'kernel_size')
    shape = (p.kernel_size, p.kernel_size, p.channels, p.channels)
    self.CreateChild('a', ConvBnLayer.Params().Set(
        filter_shape=shape, activation='relu', bn_decay=p.bn_decay,
        bn_groups=p.bn_groups, conv_impl=p.conv_impl))
    self.CreateChild('b', ConvBnLayer.Params().Set(
        filter_shape=shape, activation='none', bn_decay=p.bn_decay,
        bn_groups=p.bn_groups, conv_impl=p.conv_impl))

  def FProp(self, theta, x, paddings=None, step=None):
    """x [b, H, W, C], paddings None or [b] -> (y [b, H, W, C], aux)."""
    del step  # No randomness.
    h, moments_a = self.a.FPropWithMoments(theta.a, x, paddings)
    h, moments_b = self.b.FPropWithMoments(theta.b, h, paddings)
    y = kinks.Relu(tf.cast(x, h.dtype) + h)
    return y, NestedMap(moments=NestedMap(a=moments_a, b=moments_b))
