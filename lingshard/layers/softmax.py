"""Softmax projection and label-smoothed cross-entropy with padding.

Logits `btv = einsum('btm,mv->btv', x, w) + b`. The loss of token (b, t)
with label y and smoothing eps uses the target distribution
`q = (1 - eps) * onehot(y) + eps / V` (Szegedy et al. 2016 §7):
`xent = -sum_v q_v log p_v`; the unsmoothed `nll = -log p_y` gives the
log-perplexity. Padded tokens get weight 0 (the caller's `weights`).
Everything is computed in float32.
"""

import math

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit


def LabelSmoothedXent(logits_btv, labels_bt, weights_bt, label_smoothing):
  """Per-token smoothed cross-entropy and nll, zero where weights are 0.

  Args:
    logits_btv: [B, T, V] logits.
    labels_bt: [B, T] int labels.
    weights_bt: [B, T] float weights (0 for padding).
    label_smoothing: eps in [0, 1).

  Returns:
    NestedMap(xent [B, T], nll [B, T], weights [B, T]), all float32.
  """
  logits = tf.cast(logits_btv, tf.float32)
  weights = tf.cast(weights_bt, tf.float32)
  log_probs = tf.nn.log_softmax(logits, axis=-1)
  # A one-hot product, not a gather: XLA's SPMD partitioner keeps it local
  # on a batch-split [B, T, V] (a batch_dims gather became all-gathers).
  vocab = tf.shape(logits)[-1]
  nll = -tf.reduce_sum(
      log_probs * tf.one_hot(labels_bt, vocab, dtype=tf.float32), axis=-1)
  if label_smoothing:
    uniform = -tf.reduce_mean(log_probs, axis=-1)
    xent = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  else:
    xent = nll
  return NestedMap(xent=xent * weights, nll=nll * weights, weights=weights)


class SoftmaxLayer(base_layer.BaseLayer):
  """Projects `[B, T, M]` to logits over V classes."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input dim M.')
    p.Define('num_classes', 0, 'Vocabulary size V.')
    p.Define('use_bias', True, 'Add a bias b [V].')
    p.weight_split_dims_mapping.Define('w', [-1, -1], 'w [M, V].')
    p.weight_split_dims_mapping.Define('b', [-1], 'b [V].')
    p.activation_split_dims_mapping.Define('btv', [base_layer.BATCH, -1, -1],
                                           'Logits [B, T, V]: batch split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'num_classes')
    self.CreateVariable('w', base_layer.WeightParams(
        [p.input_dim, p.num_classes],
        init=WeightInit.Gaussian(1.0 / math.sqrt(p.input_dim))))
    if p.use_bias:
      self.CreateVariable('b', base_layer.WeightParams(
          [p.num_classes], init=WeightInit.Constant(0.0)))

  def Logits(self, theta, inputs):
    """inputs [B, T, M] -> logits [B, T, V]."""
    logits = tf.einsum('btm,mv->btv', tf.cast(inputs, self.fprop_dtype),
                       tf.cast(theta.w, self.fprop_dtype))
    if self.params.use_bias:
      logits += tf.cast(theta.b, self.fprop_dtype)
    return self.ShardActivation(logits, 'btv')

  def FProp(self, theta, inputs):
    return self.Logits(theta, inputs)
