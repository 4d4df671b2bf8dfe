"""Sampled softmax for large vocabularies (Jean et al. 2015; Jozefowicz et
al. 2016, used by Shazeer et al. 2017 App. C).

Training approximates the full softmax NLL of each token by a softmax over
its true class and `num_sampled` (= S) classes drawn from a log-uniform
(Zipfian) proposal shared by the batch,

    Q(k) = log((k + 2) / (k + 1)) / log(V + 1)   (ids sorted by frequency)

with each logit corrected by `- log(S * Q(k))` (the expected count of k
among S draws with replacement), and sampled classes equal to the token's
label removed (`remove_accidental_hits`): the math of
tf.nn.sampled_softmax_loss with a non-unique log-uniform sampler. The draws
are stateless, keyed by (layer seed, step), so the loss is a pure function
of (theta, inputs, step). Weights are those of softmax.SoftmaxLayer (w [M, V],
b [V]): `Logits` gives the full softmax used for evaluation, and a model
switches between the two without changing its checkpoint.
"""

import math

import tensorflow as tf

from lingshard.layers import dropout
from lingshard.layers import softmax

_ACCIDENTAL_HIT_LOGIT = -1e9


def LogUniformSample(seed, num_sampled, vocab_size):
  """[S] int32 ids drawn with replacement from Q (module docstring).

  Inverse CDF: CDF(k) = log(k + 2) / log(V + 1), so k = floor(exp(u *
  log(V + 1))) - 1 for u ~ U[0, 1).
  """
  u = tf.random.stateless_uniform([num_sampled], seed, dtype=tf.float64)
  k = tf.floor(tf.exp(u * math.log(vocab_size + 1.0))) - 1.0
  return tf.cast(tf.clip_by_value(k, 0.0, vocab_size - 1.0), tf.int32)


def LogUniformLogProb(ids, vocab_size):
  """log Q(k) of int ids (float32, same shape)."""
  k = tf.cast(ids, tf.float64)
  q = (tf.math.log1p(1.0 / (k + 1.0))) / math.log(vocab_size + 1.0)
  return tf.cast(tf.math.log(q), tf.float32)


class SampledSoftmaxLayer(softmax.SoftmaxLayer):
  """SoftmaxLayer plus `SampledNll`, the sampled training loss."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_sampled', 0, 'Classes S sampled per batch (> 0).')
    p.Define('remove_accidental_hits', True, 'Drop sampled classes equal '
             'to a token\'s label from its softmax.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CheckPositive('num_sampled')

  def SampledNll(self, theta, inputs, labels, step=None):
    """inputs [B, T, M], labels [B, T] -> sampled-softmax NLL [B, T] (f32).

    einsums: true logits 'btm,mbt->bt' with w's label columns, sampled
    logits 'btm,ms->bts'.
    """
    p = self.params
    x_btm = tf.cast(inputs, tf.float32)
    w_mv = tf.cast(theta.w, tf.float32)
    labels = tf.cast(labels, tf.int32)
    seed = dropout.StepSeed(self.layer_seed, step)
    sampled_s = LogUniformSample(seed, p.num_sampled, p.num_classes)
    sampled_s = tf.stop_gradient(sampled_s)
    true_bt = tf.einsum('btm,mbt->bt', x_btm,
                        tf.gather(w_mv, labels, axis=1))
    sampled_bts = tf.einsum('btm,ms->bts', x_btm,
                            tf.gather(w_mv, sampled_s, axis=1))
    if p.use_bias:
      b_v = tf.cast(theta.b, tf.float32)
      true_bt += tf.gather(b_v, labels)
      sampled_bts += tf.gather(b_v, sampled_s)
    log_s = math.log(p.num_sampled)
    true_bt -= LogUniformLogProb(labels, p.num_classes) + log_s
    sampled_bts -= LogUniformLogProb(sampled_s, p.num_classes) + log_s
    if p.remove_accidental_hits:
      hit_bts = tf.equal(labels[..., tf.newaxis], sampled_s)
      sampled_bts = tf.where(hit_bts, _ACCIDENTAL_HIT_LOGIT, sampled_bts)
    logits = tf.concat([true_bt[..., tf.newaxis], sampled_bts], axis=-1)
    return -tf.nn.log_softmax(logits, axis=-1)[..., 0]
