"""A small residual MLP body layer for the pipeline tests."""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import batch_norm
from lingshard.layers import dropout
from lingshard.layers import linear
from lingshard.nested_map import NestedMap


class MlpBody(base_layer.BaseLayer):
  """y = x + out(bn(dropout(relu(fc(x + ctx))))) on non-padded positions."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 4, 'Model dim M.')
    p.Define('hidden', 8, 'Hidden dim H.')
    p.Define('dropout_prob', 0.0, 'Dropout on the hidden units.')
    p.Define('batch_norm', False, 'Batch norm on the hidden units.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('fc', linear.LinearLayer.Params().Set(
        input_dim=p.dim, output_dim=p.hidden, activation='relu'))
    self.CreateChild('out', linear.LinearLayer.Params().Set(
        input_dim=p.hidden, output_dim=p.dim, activation='none'))
    self.CreateChild('dropout', dropout.DropoutLayer.Params().Set(
        dropout_prob=p.dropout_prob))
    if p.batch_norm:
      self.CreateChild('bn', batch_norm.BatchNormLayer.Params().Set(
          input_dim=p.hidden))

  def FProp(self, theta, x_btm, paddings_bt, ctx_bm, step=None):
    h = self.fc.FProp(theta.fc, x_btm + ctx_bm[:, tf.newaxis, :])
    h = self.dropout.FProp(theta.dropout, h, step=step)
    aux = NestedMap(aux_loss=1e-2 * tf.reduce_mean(tf.square(h)),
                    metrics=NestedMap(h_mean=tf.reduce_mean(h)))
    if self.params.batch_norm:
      h, aux.moments = self.bn.FPropWithMoments(theta.bn, h, paddings_bt)
    y = self.out.FProp(theta.out, h) * (1.0 - paddings_bt)[..., tf.newaxis]
    return x_btm + y, aux
