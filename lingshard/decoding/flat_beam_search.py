"""Flat beam search (GShard App. A.1).

The k hypotheses of a sentence are flattened into one sequence holding all
their tokens interleaved: the token hypothesis j feeds in at step t sits at
flat position `t * k + j` of a sequence of `k * L` positions. The decoder's
self-attention cached keys/values live at those positions and are never
re-ordered; instead each hypothesis carries a 0/1 mask over the flat
sequence marking its own ancestors, and only that mask is re-ordered after
each beam expansion. Attention then runs over k times more keys per step.

Hypothesis selection and length normalisation are exactly those of
`beam_search` (same code), so given the same per-step log-probabilities
both formulations return the same hypotheses.

Shapes: B sentences, k beam, V vocabulary, L = max_len, S = k * L.
"""

import tensorflow as tf

from lingshard.decoding import beam_search


def StepPositions(t, beam_size):
  """Flat positions [k] of the tokens fed in at step t."""
  return t * beam_size + tf.range(beam_size)


def FlatBeamSearch(step_fn, init_states, batch_size, beam_size, max_len,
                   sos_id, eos_id, length_norm_alpha=0.0):
  """Beam search over a flat, never re-ordered decoder state.

  Args:
    step_fn: `(ids_bk [B, k] int32, t int32 scalar, mask_bks [B, k, S]
      float32, states) -> (logp_bkv [B, k, V], new states)`. At step t the
      k new tokens go to positions `StepPositions(t, k)`; `mask_bks[b, j]`
      is 1.0 exactly at the positions of hypothesis j's tokens so far
      (its ancestors and its new token at `t * k + j`).
    init_states: the states before step 0 (never gathered or re-ordered).
    batch_size: B.
    beam_size: k.
    max_len: L.
    sos_id: the first input token.
    eos_id: the end-of-sentence token.
    length_norm_alpha: GNMT alpha (>= 0).

  Returns:
    As `beam_search.BeamSearch`.
  """
  beam_search.CheckArgs(beam_size, max_len)
  b, k = batch_size, beam_size
  s = k * max_len
  alpha = float(length_norm_alpha)
  hyps = beam_search.InitHyps(b, k, max_len)
  cur_bk = tf.fill([b, k], tf.constant(sos_id, tf.int32))
  ancestors_bks = tf.zeros([b, k, s], tf.float32)

  def Body(t, hyps, cur_bk, ancestors_bks, states):
    own_ks = tf.one_hot(StepPositions(t, k), s, dtype=tf.float32)
    mask_bks = ancestors_bks + own_ks[tf.newaxis]
    logp_bkv, states = step_fn(cur_bk, t, mask_bks, states)
    hyps, parent_bk, token_bk = beam_search.ExpandAndSelect(
        hyps, logp_bkv, t, eos_id, alpha)
    # Only the 0/1 ancestry mask follows the selected parents.
    ancestors_bks = tf.gather(mask_bks, parent_bk, batch_dims=1)
    return t + 1, hyps, token_bk, ancestors_bks, states

  def Cond(t, hyps, *unused):
    return beam_search.NotDone(hyps, t, max_len, alpha)

  t, hyps, _, _, _ = tf.while_loop(
      Cond, Body, (tf.constant(0), hyps, cur_bk, ancestors_bks, init_states),
      maximum_iterations=max_len)
  return beam_search.Finalize(hyps, t, max_len, alpha)
