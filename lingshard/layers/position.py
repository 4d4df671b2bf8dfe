"""Sinusoidal position encoding (Vaswani et al. 2017, §3.5).

For position t and channel i < M/2, with timescales geometric between
`min_timescale` and `max_timescale`:
`pe[t, i] = sin(t / ts_i)`, `pe[t, M/2 + i] = cos(t / ts_i)` (the
tensor2tensor / Lingvo layout: sines, then cosines). No weights.
"""

import math

import tensorflow as tf

from lingshard.layers import base_layer


class PositionalEncoding(base_layer.BaseLayer):
  """Sinusoids of integer positions; `[T, M]` or `[B, T, M]`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('embedding_dim', 0, 'Output dim M (even).')
    p.Define('min_timescale', 1.0, 'Smallest timescale.')
    p.Define('max_timescale', 1.0e4, 'Largest timescale.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.embedding_dim <= 0 or p.embedding_dim % 2:
      raise ValueError(f'{p.name}: embedding_dim must be even and > 0, got '
                       f'{p.embedding_dim}')

  def FProp(self, theta, seq_length=None, positions=None):
    """Encodings of `range(seq_length)` -> [T, M], or of `positions`.

    Args:
      theta: unused (no weights).
      seq_length: T, an int or int scalar tensor.
      positions: int tensor of any shape [...]; gives [..., M].
    """
    del theta
    p = self.params
    if (seq_length is None) == (positions is None):
      raise ValueError('give exactly one of seq_length and positions')
    if positions is None:
      positions = tf.range(seq_length)
    pos = tf.cast(positions, tf.float32)
    half = p.embedding_dim // 2
    log_inc = (math.log(p.max_timescale / p.min_timescale) /
               max(half - 1, 1))
    inv_ts = p.min_timescale * tf.exp(
        tf.range(half, dtype=tf.float32) * -log_inc)
    scaled = pos[..., tf.newaxis] * inv_ts
    pe = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=-1)
    return tf.cast(pe, self.fprop_dtype)
