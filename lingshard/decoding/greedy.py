"""Greedy decoding: the most likely token at every step until EOS.

Uses the same step-function contract as `beam_search.BeamSearch` with
N = B (one hypothesis per sentence). Tokens after EOS are 0 (padding) and
their log-probabilities are not added.
"""

import tensorflow as tf

from lingshard.nested_map import NestedMap


def GreedySearch(step_fn, init_states, batch_size, max_len, sos_id, eos_id):
  """Greedy search.

  Args:
    step_fn: `(ids_b [B] int32, t int32 scalar, states) -> (logp_bv [B, V],
      new states)`.
    init_states: the states before step 0.
    batch_size: B.
    max_len: L, the most tokens per output (including EOS).
    sos_id: the first input token.
    eos_id: the end-of-sentence token.

  Returns:
    NestedMap(ids [B, L] int32, lengths [B] int32 (including EOS),
    scores [B] float32: the summed log-probabilities).
  """
  if max_len < 1:
    raise ValueError(f'max_len must be >= 1, got {max_len}')
  b = batch_size

  def Body(t, cur_b, done_b, ids_bl, lengths_b, scores_b, states):
    logp_bv, states = step_fn(cur_b, t, states)
    token_b = tf.argmax(logp_bv, axis=-1, output_type=tf.int32)
    # The chosen token's log-prob is the row's max (what a gather by
    # token_b reads, without gathering indices across batch shards).
    logp_b = tf.reduce_max(tf.cast(logp_bv, tf.float32), axis=-1)
    live_b = tf.logical_not(done_b)
    token_b = tf.where(live_b, token_b, 0)
    ids_bl += token_b[:, tf.newaxis] * tf.one_hot(t, max_len, dtype=tf.int32)
    scores_b += tf.where(live_b, logp_b, 0.0)
    lengths_b += tf.cast(live_b, tf.int32)
    done_b = tf.logical_or(done_b, tf.equal(token_b, eos_id))
    return t + 1, token_b, done_b, ids_bl, lengths_b, scores_b, states

  def Cond(t, cur_b, done_b, *unused):
    del cur_b
    return tf.logical_and(t < max_len,
                          tf.logical_not(tf.reduce_all(done_b)))

  init = (tf.constant(0), tf.fill([b], tf.constant(sos_id, tf.int32)),
          tf.zeros([b], tf.bool), tf.zeros([b, max_len], tf.int32),
          tf.zeros([b], tf.int32), tf.zeros([b], tf.float32), init_states)
  _, _, _, ids, lengths, scores, _ = tf.while_loop(
      Cond, Body, init, maximum_iterations=max_len)
  return NestedMap(ids=ids, lengths=lengths, scores=scores)
