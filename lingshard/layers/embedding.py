"""Token embedding, optionally doubling as the softmax weights.

`emb [V, M]` maps ids `[B, T]` to `[B, T, M]` (a gather with a dense
gradient), times sqrt(M) when `scale_sqrt_depth` (Vaswani et al. 2017
§3.4). With a shared
target embedding/softmax the same table gives the logits
`btv = einsum('btm,vm->btv', x, emb)`. GShard §3.2 / Figure 3(c): weights
replicated, activations split on the batch dim.
"""

import math

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.weight_init import WeightInit


def _Lookup(table_vm, ids):
  """`tf.gather(table, ids)` whose gradient is a dense [V, M] tensor.

  tf.gather's own gradient is IndexedSlices, which the optimizers' dense
  update math (and XLA SPMD) do not take; the dense gradient is
  `unsorted_segment_sum(dy, ids, V)`.
  """

  @tf.custom_gradient
  def Fn(table):
    def Grad(dy):
      return tf.math.unsorted_segment_sum(dy, ids, tf.shape(table)[0])
    return tf.gather(table, ids), Grad

  return Fn(table_vm)


class EmbeddingLayer(base_layer.BaseLayer):
  """Looks ids up in `emb [V, M]`; `Logits` reuses it as a softmax."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 0, 'Vocabulary size V.')
    p.Define('embedding_dim', 0, 'Embedding dim M.')
    p.Define('scale_sqrt_depth', True, 'Multiply lookups by sqrt(M).')
    p.weight_split_dims_mapping.Define('emb', [-1, -1],
                                       'emb [V, M]: replicated.')
    p.activation_split_dims_mapping.Define('btm', [base_layer.BATCH, -1, -1],
                                           'Lookups [B, T, M]: batch split.')
    p.activation_split_dims_mapping.Define('btv', [base_layer.BATCH, -1, -1],
                                           'Logits [B, T, V]: batch split.')
    p.activation_split_dims_mapping.Define(
        'bt', [base_layer.BATCH, -1], 'Ids [B, T]: batch split (as the '
        'lookups, so the table gradient sums locally, then all-reduces).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('vocab_size', 'embedding_dim')
    self.CreateVariable('emb', base_layer.WeightParams(
        [p.vocab_size, p.embedding_dim],
        init=WeightInit.Gaussian(1.0 / math.sqrt(p.embedding_dim))))

  def FProp(self, theta, ids):
    """ids [B, T] int -> [B, T, M]."""
    p = self.params
    emb = tf.cast(theta.emb, self.fprop_dtype)
    x = _Lookup(emb, self.ShardActivation(ids, 'bt'))
    if p.scale_sqrt_depth:
      x *= tf.cast(math.sqrt(p.embedding_dim), self.fprop_dtype)
    return self.ShardActivation(x, 'btm')

  def Logits(self, theta, inputs):
    """inputs [B, T, M] -> logits [B, T, V] (shared embedding/softmax)."""
    logits = tf.einsum('btm,vm->btv', tf.cast(inputs, self.fprop_dtype),
                       tf.cast(theta.emb, self.fprop_dtype))
    return self.ShardActivation(logits, 'btv')
