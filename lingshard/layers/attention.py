"""Multi-head dot-product attention: self, causal self, cross, incremental.

Einsum letters: b batch, t query position, s key position, m model dim,
n heads, h key/value dim per head (GShard App. A.2: 16 heads of 128).

  q_btnh = einsum('btm,mnh->btnh', x, wq)     (likewise k_bsnh, v_bsnh)
  logits_bnts = einsum('btnh,bsnh->bnts', q, k) / sqrt(h)
  probs_bnts = softmax_s(logits + (1 - mask_bts) * -1e9)   (float32)
  ctx_btnh = einsum('bnts,bsnh->btnh', probs, v)
  out_btm = einsum('btnh,nhm->btm', ctx, wo)

No biases (as in GShard's Transformer). Weights are replicated and
activations split on the batch dim (GShard §3.2, Figure 3(c)).

Incremental decoding keeps a cache of projected keys/values `[B, S, N, H]`
and writes the new step's keys/values at given positions; the attention
mask is explicit, so the same code serves standard beam search (one query
per hypothesis, S = L) and GShard App. A.1's flat beam search (k queries
per sentence over one interleaved sequence of S = k * L positions).
"""

import math

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import dropout
from lingshard.nested_map import NestedMap

_NEG_INF = -1e9


def PaddingMask(key_paddings_bs, num_queries):
  """mask_bts (1.0 = may attend) from key paddings [B, S] (1.0 = pad)."""
  keep_bs = 1.0 - tf.cast(key_paddings_bs, tf.float32)
  return tf.tile(keep_bs[:, tf.newaxis, :], [1, num_queries, 1])


def CausalMask(seq_len):
  """mask_ts: 1.0 where key position s <= query position t."""
  return tf.linalg.band_part(tf.ones([seq_len, seq_len], tf.float32), -1, 0)


class MultiHeadAttention(base_layer.BaseLayer):
  """Multi-head attention with `num_heads` heads of `dim_per_head` dims."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Model dim M (queries, keys and outputs).')
    p.Define('num_heads', 0, 'Heads N.')
    p.Define('dim_per_head', 0, 'Key/value dim per head H.')
    p.Define('atten_dropout_prob', 0.0, 'Dropout on attention probs.')
    for w in ('wq', 'wk', 'wv'):
      p.weight_split_dims_mapping.Define(w, [-1, -1, -1], f'{w} [M, N, H].')
    p.weight_split_dims_mapping.Define('wo', [-1, -1, -1], 'wo [N, H, M].')
    p.activation_split_dims_mapping.Define(
        'btnh', [base_layer.BATCH, -1, -1, -1], 'Projected q/k/v [B, T, N, H]: batch split.')
    p.activation_split_dims_mapping.Define(
        'bnts', [base_layer.BATCH, -1, -1, -1], 'Attention probs [B, N, T, S].')
    p.activation_split_dims_mapping.Define('btm', [base_layer.BATCH, -1, -1],
                                           'Output [B, T, M]: batch split.')
    p.activation_split_dims_mapping.Define(
        'cache_bsnh', [base_layer.BATCH, -1, -1, -1],
        'Incremental decoding\'s key/value cache [B, S, N, H]: batch split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'num_heads', 'dim_per_head')
    mnh = [p.input_dim, p.num_heads, p.dim_per_head]
    for w in ('wq', 'wk', 'wv'):
      self.CreateVariable(w, base_layer.WeightParams(mnh))
    self.CreateVariable('wo', base_layer.WeightParams(
        [p.num_heads, p.dim_per_head, p.input_dim]))
    self.CreateChild('atten_dropout', dropout.DropoutLayer.Params().Set(
        dropout_prob=p.atten_dropout_prob))

  def _Project(self, w, x_btm):
    y = tf.einsum('btm,mnh->btnh', tf.cast(x_btm, self.fprop_dtype),
                  tf.cast(w, self.fprop_dtype))
    return self.ShardActivation(y, 'btnh')

  def ProjectKeyValue(self, theta, key_bsm):
    """Keys/values of `key_bsm`: NestedMap(k, v), each [B, S, N, H]."""
    return NestedMap(k=self._Project(theta.wk, key_bsm),
                     v=self._Project(theta.wv, key_bsm))

  def Attend(self, theta, query_btm, kv, mask_bts, step=None):
    """Attention of `query_btm` over projected `kv` under `mask_bts`.

    Args:
      theta: weights.
      query_btm: queries [B, T, M].
      kv: NestedMap(k, v) of [B, S, N, H].
      mask_bts: [B, T, S] float, 1.0 where query t may attend key s.
      step: int scalar keying the attention dropout.

    Returns:
      [B, T, M].
    """
    q_btnh = self._Project(theta.wq, query_btm)
    scale = 1.0 / math.sqrt(self.params.dim_per_head)
    logits_bnts = tf.einsum('btnh,bsnh->bnts', tf.cast(q_btnh, tf.float32),
                            tf.cast(kv.k, tf.float32)) * scale
    mask_bnts = tf.cast(mask_bts, tf.float32)[:, tf.newaxis, :, :]
    logits_bnts += (1.0 - mask_bnts) * _NEG_INF
    probs_bnts = tf.nn.softmax(logits_bnts, axis=-1)
    probs_bnts = self.ShardActivation(probs_bnts, 'bnts')
    probs_bnts = self.atten_dropout.FProp(theta.atten_dropout, probs_bnts,
                                          step=step)
    ctx_btnh = tf.einsum('bnts,bsnh->btnh',
                         tf.cast(probs_bnts, self.fprop_dtype),
                         tf.cast(kv.v, self.fprop_dtype))
    out_btm = tf.einsum('btnh,nhm->btm', ctx_btnh,
                        tf.cast(theta.wo, self.fprop_dtype))
    return self.ShardActivation(out_btm, 'btm')

  def FProp(self, theta, query_btm, key_bsm=None, key_paddings_bs=None,
            causal=False, step=None):
    """Self-attention (key_bsm None) or cross-attention.

    Args:
      theta: weights.
      query_btm: [B, T, M].
      key_bsm: [B, S, M] or None (self-attention: keys are the queries).
      key_paddings_bs: [B, S] float, 1.0 = padding; None = no padding.
      causal: query t only sees keys s <= t (self-attention only).
      step: int scalar keying the attention dropout.

    Returns:
      [B, T, M].
    """
    if key_bsm is None:
      key_bsm = query_btm
    elif causal:
      raise ValueError('causal masking is for self-attention only')
    t = tf.shape(query_btm)[1]
    s = tf.shape(key_bsm)[1]
    if key_paddings_bs is None:
      key_paddings_bs = tf.zeros(tf.shape(key_bsm)[:2], tf.float32)
    mask_bts = PaddingMask(key_paddings_bs, t)
    if causal:
      mask_bts *= CausalMask(s)[tf.newaxis]
    return self.Attend(theta, query_btm, self.ProjectKeyValue(theta, key_bsm),
                       mask_bts, step=step)

  # ---------------------------------------------------- incremental decoding
  def InitCache(self, batch_size, max_len):
    """Zero key/value cache NestedMap(k, v), each [B, S=max_len, N, H]."""
    p = self.params
    shape = [batch_size, max_len, p.num_heads, p.dim_per_head]
    return NestedMap(
        k=self.ShardActivation(tf.zeros(shape, self.fprop_dtype), 'cache_bsnh'),
        v=self.ShardActivation(tf.zeros(shape, self.fprop_dtype), 'cache_bsnh'))

  def ExtendStep(self, theta, query_bqm, cache, positions_q, mask_bqs):
    """Self-attention of Q new tokens over the cache, after writing them.

    Args:
      theta: weights.
      query_bqm: the new tokens' inputs [B, Q, M].
      cache: NestedMap(k, v) of [B, S, N, H].
      positions_q: [Q] int, distinct cache positions of the new tokens.
      mask_bqs: [B, Q, S] float, 1.0 where new token q may attend s (it
        should include the token's own position).

    Returns:
      (out [B, Q, M], updated cache).
    """
    new = self.ProjectKeyValue(theta, query_bqm)
    s = tf.shape(cache.k)[1]
    write_qs = tf.one_hot(positions_q, s, dtype=cache.k.dtype)
    keep_s = 1.0 - tf.reduce_sum(write_qs, axis=0)
    keep = keep_s[tf.newaxis, :, tf.newaxis, tf.newaxis]
    cache = NestedMap(
        k=cache.k * keep + tf.einsum('qs,bqnh->bsnh', write_qs, new.k),
        v=cache.v * keep + tf.einsum('qs,bqnh->bsnh', write_qs, new.v)
    ).Transform(lambda t: self.ShardActivation(t, 'cache_bsnh'))
    return self.Attend(theta, query_bqm, cache, mask_bqs), cache
