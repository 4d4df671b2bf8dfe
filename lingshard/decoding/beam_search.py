"""Beam search with GNMT length normalisation (GShard App. A.1).

Hypotheses are scored by `log P(Y) / lp(Y)` with
`lp(Y) = ((5 + |Y|) / 6) ** alpha` (Wu et al. 2016, §7), where |Y| counts
the generated tokens including EOS. Each step expands the k alive
hypotheses of a sentence by every token, keeps the best 2k candidates
(at most k of them end in EOS, so k non-EOS ones always remain), continues
the k best non-EOS candidates and moves EOS candidates into the k-best
finished list. A hypothesis that reaches `max_len` tokens without EOS is
finished there. The search stops early once no alive hypothesis can still
beat the k-th finished one: logP only falls as tokens are added and, for
alpha >= 0, lp(Y) <= lp(max_len), so `alive_logp / lp(max_len)` bounds
every completion.

This module holds the bookkeeping shared by both formulations and the
standard one, which re-orders the decoder state (e.g. cached keys/values)
after every step; `flat_beam_search` keeps the state in place.

Shapes: B sentences, k beam, V vocabulary, L = max_len, N = B * k.
"""

import tensorflow as tf

from lingshard.nested_map import NestedMap

NEG_INF = float('-inf')


def LengthNorm(length, alpha):
  """GNMT lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14)."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def InitHyps(batch_size, beam_size, max_len):
  """Initial alive/finished hypotheses (only alive hypothesis 0 is live)."""
  b, k = batch_size, beam_size
  first = tf.one_hot(tf.zeros([b], tf.int32), k, on_value=0.0,
                     off_value=NEG_INF)
  return NestedMap(
      alive_ids=tf.zeros([b, k, max_len], tf.int32),
      alive_logp=first,
      fin_ids=tf.zeros([b, k, max_len], tf.int32),
      fin_scores=tf.fill([b, k], NEG_INF),
      fin_lengths=tf.zeros([b, k], tf.int32))


def _WriteToken(ids_bkl, token_bk, t):
  """ids with position t set to token (positions > t are still 0)."""
  max_len = tf.shape(ids_bkl)[2]
  return ids_bkl + token_bk[:, :, tf.newaxis] * tf.one_hot(
      t, max_len, dtype=tf.int32)[tf.newaxis, tf.newaxis, :]


def _MergeFinished(hyps, ids_bcl, scores_bc, lengths_bc):
  """Top k of (finished so far) + (c new candidates), by score."""
  k = hyps.fin_scores.shape[1]
  scores = tf.concat([hyps.fin_scores, scores_bc], axis=1)
  ids = tf.concat([hyps.fin_ids, ids_bcl], axis=1)
  lengths = tf.concat([hyps.fin_lengths, lengths_bc], axis=1)
  top_scores, top_idx = tf.math.top_k(scores, k=k)
  return (tf.gather(ids, top_idx, batch_dims=1), top_scores,
          tf.gather(lengths, top_idx, batch_dims=1))


def ExpandAndSelect(hyps, logp_bkv, t, eos_id, alpha):
  """One beam step: expand by `logp_bkv [B, k, V]` at time t and select.

  Returns:
    (new hyps, parent_bk [B, k] int32: the alive hypothesis each new alive
    hypothesis extends, token_bk [B, k] int32: its new token).
  """
  k = hyps.alive_logp.shape[1]
  v = tf.shape(logp_bkv)[2]
  cand_bkv = hyps.alive_logp[:, :, tf.newaxis] + tf.cast(logp_bkv, tf.float32)
  cand_bx = tf.reshape(cand_bkv, [tf.shape(cand_bkv)[0], -1])
  top_logp, top_idx = tf.math.top_k(cand_bx, k=2 * k)
  top_parent = top_idx // v
  top_token = top_idx % v
  top_ids = _WriteToken(tf.gather(hyps.alive_ids, top_parent, batch_dims=1),
                        top_token, t)
  is_eos = tf.equal(top_token, eos_id)
  # Finished candidates: end in EOS, length t + 1.
  fin_scores = tf.where(is_eos, top_logp / LengthNorm(t + 1, alpha), NEG_INF)
  fin_ids, fin_scores, fin_lengths = _MergeFinished(
      hyps, top_ids, fin_scores, tf.fill(tf.shape(top_token), t + 1))
  # Alive: the k best non-EOS candidates.
  alive_cand = tf.where(is_eos, NEG_INF, top_logp)
  alive_logp, sel = tf.math.top_k(alive_cand, k=k)
  new = NestedMap(
      alive_ids=tf.gather(top_ids, sel, batch_dims=1),
      alive_logp=alive_logp,
      fin_ids=fin_ids, fin_scores=fin_scores, fin_lengths=fin_lengths)
  return (new, tf.gather(top_parent, sel, batch_dims=1),
          tf.gather(top_token, sel, batch_dims=1))


def NotDone(hyps, t, max_len, alpha):
  """Whether any sentence's alive hypotheses can still beat its k-th best."""
  bound_b = tf.reduce_max(hyps.alive_logp, axis=1) / LengthNorm(max_len, alpha)
  worst_fin_b = tf.reduce_min(hyps.fin_scores, axis=1)
  return tf.logical_and(t < max_len, tf.reduce_any(bound_b > worst_fin_b))


def Finalize(hyps, t, max_len, alpha):
  """Finished hypotheses, best first; alive ones at max_len count too.

  Returns:
    NestedMap(ids [B, L], lengths [B], scores [B]: the best hypothesis;
    topk_ids [B, k, L], topk_lengths [B, k], topk_scores [B, k]).
  """
  at_end = tf.equal(t, max_len)
  alive_scores = tf.where(
      tf.logical_and(at_end, hyps.alive_logp > NEG_INF),
      hyps.alive_logp / LengthNorm(max_len, alpha), NEG_INF)
  ids, scores, lengths = _MergeFinished(
      hyps, hyps.alive_ids, alive_scores,
      tf.fill(tf.shape(hyps.alive_logp), max_len))
  return NestedMap(ids=ids[:, 0], lengths=lengths[:, 0], scores=scores[:, 0],
                   topk_ids=ids, topk_lengths=lengths, topk_scores=scores)


def CheckArgs(beam_size, max_len):
  if beam_size < 1 or max_len < 1:
    raise ValueError(f'beam_size and max_len must be >= 1, got {beam_size}, '
                     f'{max_len}')


def BeamSearch(step_fn, init_states, batch_size, beam_size, max_len, sos_id,
               eos_id, length_norm_alpha=0.0):
  """Standard beam search: the decoder state is re-ordered every step.

  Args:
    step_fn: `(ids_n [N] int32, t int32 scalar, states) -> (logp_nv [N, V],
      new states)`; N = B * k, row b * k + j is hypothesis j of sentence b.
      Every tensor in `states` has leading dim N.
    init_states: the states before step 0 (a nest of tensors).
    batch_size: B.
    beam_size: k.
    max_len: L, the most tokens a hypothesis has (including EOS).
    sos_id: the first input token.
    eos_id: the end-of-sentence token.
    length_norm_alpha: GNMT alpha (>= 0).

  Returns:
    Finalize()'s NestedMap (ids [B, L] int32, lengths [B], scores [B],
    topk_ids [B, k, L], topk_lengths [B, k], topk_scores [B, k]).
  """
  CheckArgs(beam_size, max_len)
  b, k = batch_size, beam_size
  alpha = float(length_norm_alpha)
  hyps = InitHyps(b, k, max_len)
  cur_bk = tf.fill([b, k], tf.constant(sos_id, tf.int32))
  # Row offset of sentence b's hypotheses in the [N] layout.
  base_b1 = (tf.range(b) * k)[:, tf.newaxis]

  def Body(t, hyps, cur_bk, states):
    logp_nv, states = step_fn(tf.reshape(cur_bk, [-1]), t, states)
    logp_bkv = tf.reshape(logp_nv, [b, k, -1])
    hyps, parent_bk, token_bk = ExpandAndSelect(hyps, logp_bkv, t, eos_id,
                                                alpha)
    rows_n = tf.reshape(base_b1 + parent_bk, [-1])
    states = tf.nest.map_structure(lambda s: tf.gather(s, rows_n), states)
    return t + 1, hyps, token_bk, states

  def Cond(t, hyps, cur_bk, states):
    del cur_bk, states
    return NotDone(hyps, t, max_len, alpha)

  t, hyps, _, _ = tf.while_loop(
      Cond, Body, (tf.constant(0), hyps, cur_bk, init_states),
      maximum_iterations=max_len)
  return Finalize(hyps, t, max_len, alpha)
