"""Beam search, flat beam search and greedy search on toy models with
hand-set next-token probabilities, against brute-force enumeration."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from lingshard.decoding import beam_search
from lingshard.decoding import flat_beam_search
from lingshard.decoding import greedy
from lingshard.nested_map import NestedMap

SOS, EOS = 1, 2


class ToyModel:
  """log P(next | generated prefix) from a table indexed by the prefix.

  A prefix y_1..y_t (tokens in [0, V)) has row offset(t) + sum_i y_i V^(i-1).
  Step functions see only the fed tokens (and, for the flat search, the
  ancestry mask), so they must reconstruct prefixes exactly to be right.
  """

  def __init__(self, logp_table, vocab, max_len):
    self.table = np.asarray(logp_table, np.float32)
    self.v, self.l = vocab, max_len
    self.offsets = np.cumsum([0] + [vocab**t for t in range(max_len)])
    self.powers = np.array([0] + [vocab**i for i in range(max_len - 1)],
                           np.int64)

  def Row(self, prefix):
    return self.offsets[len(prefix)] + sum(
        y * self.v**i for i, y in enumerate(prefix))

  def LogP(self, prefix):
    return self.table[self.Row(prefix)]

  def _Lookup(self, code, t):
    rows = tf.cast(code, tf.int32) + tf.constant(self.offsets, tf.int32)[t]
    return tf.gather(tf.constant(self.table), rows)

  def StandardStep(self, ids_n, t, states):
    """states.fed [N, L]: the token fed at each step (reordered by search)."""
    fed = states.fed + ids_n[:, None] * tf.one_hot(t, self.l, dtype=tf.int32)
    # Generated prefix = tokens fed at steps 1..t.
    code = tf.reduce_sum(tf.cast(fed, tf.int64) * self.powers, axis=1)
    return self._Lookup(code, t), NestedMap(fed=fed)

  def FlatStep(self, ids_bk, t, mask_bks, states, k):
    """states.flat [B, k*L]: fed tokens at flat positions t*k + j."""
    pos = flat_beam_search.StepPositions(t, k)
    flat = states.flat + tf.einsum(
        'bk,ks->bs', ids_bk, tf.one_hot(pos, k * self.l, dtype=tf.int32))
    time_s = np.arange(k * self.l) // k
    weight_s = np.where(time_s >= 1, self.v**np.maximum(time_s - 1, 0),
                        0).astype(np.int64)
    code = tf.einsum('bks,bs->bk', tf.cast(mask_bks, tf.int64),
                     tf.cast(flat, tf.int64) * weight_s)
    return self._Lookup(code, t), NestedMap(flat=flat)

  def BruteForce(self, alpha):
    """[(score, tokens)] of every finished sequence, best first."""
    out = []
    for n in range(1, self.l + 1):
      for seq in itertools.product(range(self.v), repeat=n):
        if EOS in seq[:-1] or (n < self.l and seq[-1] != EOS):
          continue
        logp = sum(self.LogP(seq[:i])[seq[i]] for i in range(n))
        lp = ((5.0 + n) / 6.0)**alpha
        out.append((logp / lp, list(seq)))
    return sorted(out, key=lambda x: -x[0])


def RandomToy(seed, vocab=3, max_len=4):
  rng = np.random.RandomState(seed)
  rows = sum(vocab**t for t in range(max_len))
  logits = rng.normal(size=[rows, vocab]) * 2.0
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return ToyModel(logp, vocab, max_len)


def RunSearch(toy, kind, beam, alpha, batch=1):
  if kind == 'standard':
    init = NestedMap(fed=tf.zeros([batch * beam, toy.l], tf.int32))
    return beam_search.BeamSearch(toy.StandardStep, init, batch, beam, toy.l,
                                  SOS, EOS, alpha)
  init = NestedMap(flat=tf.zeros([batch, beam * toy.l], tf.int32))
  return flat_beam_search.FlatBeamSearch(
      lambda i, t, m, s: toy.FlatStep(i, t, m, s, beam), init, batch, beam,
      toy.l, SOS, EOS, alpha)


def Tokens(ids, length):
  return list(np.asarray(ids)[:int(length)])


def HandSetToy():
  """Greedy takes 'a' (p=.5) but 'b EOS' (p=.4*.9) is the best sentence.

  Tokens: 0 = 'a', 3 = 'b', 2 = EOS (1 = SOS is never produced).
  """
  v, max_len = 4, 3
  toy = ToyModel(np.full([sum(v**t for t in range(max_len)), v], -30.0), v,
                 max_len)
  def Set(prefix, probs):
    row = np.full([v], -30.0)
    for tok, p in probs.items():
      row[tok] = np.log(p)
    toy.table[toy.Row(prefix)] = row
  Set([], {0: 0.5, 3: 0.4, 2: 0.1})
  Set([0], {0: 0.35, 3: 0.35, 2: 0.3})
  Set([3], {0: 0.05, 3: 0.05, 2: 0.9})
  for first in (0, 3):
    for second in (0, 3):
      Set([first, second], {2: 1.0})
  return toy


def test_length_norm_is_gnmt_formula():
  got = beam_search.LengthNorm(tf.constant([1, 7]), 0.6).numpy()
  np.testing.assert_allclose(got, [(6 / 6)**0.6, (12 / 6)**0.6], rtol=1e-6)


@pytest.mark.parametrize('kind', ['standard', 'flat'])
def test_beam_finds_best_sequence_greedy_misses(kind):
  toy = HandSetToy()
  out = RunSearch(toy, kind, beam=2, alpha=0.0)
  assert Tokens(out.ids[0], out.lengths[0]) == [3, 2]
  np.testing.assert_allclose(out.scores[0], np.log(0.4 * 0.9), rtol=1e-5)
  assert toy.BruteForce(0.0)[0][1] == [3, 2]
  g = greedy.GreedySearch(toy.StandardStep,
                          NestedMap(fed=tf.zeros([1, toy.l], tf.int32)), 1,
                          toy.l, SOS, EOS)
  assert Tokens(g.ids[0], g.lengths[0])[0] == 0  # Greedy commits to 'a'.
  assert float(g.scores[0]) < np.log(0.4 * 0.9)


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('alpha', [0.0, 1.5])
def test_exhaustive_beam_equals_brute_force(seed, alpha):
  toy = RandomToy(seed)
  ref = toy.BruteForce(alpha)
  # k = 8 >= (V-1)^(L-1) alive prefixes: nothing is ever pruned.
  for kind in ('standard', 'flat'):
    out = RunSearch(toy, kind, beam=8, alpha=alpha)
    for j in range(8):
      assert Tokens(out.topk_ids[0, j], out.topk_lengths[0, j]) == ref[j][1]
      np.testing.assert_allclose(out.topk_scores[0, j], ref[j][0], rtol=1e-5)


def test_length_norm_changes_the_winner():
  # [EOS] has logp -1.0; [0, 0, EOS] has logp -1.2 (lp(3) = 4/3 at alpha 1).
  v, max_len = 3, 3
  toy = ToyModel(np.full([sum(v**t for t in range(max_len)), v], -30.0), v,
                 max_len)
  toy.table[toy.Row([])] = [np.log(1 - np.exp(-1.0)), -30.0, -1.0]
  toy.table[toy.Row([0])] = [-1.2 - np.log(1 - np.exp(-1.0)), -30.0, -30.0]
  toy.table[toy.Row([0, 0])] = [-30.0, -30.0, 0.0]
  out = RunSearch(toy, 'standard', 2, 0.0)
  assert Tokens(out.ids[0], out.lengths[0]) == [2]
  out = RunSearch(toy, 'flat', 2, 1.0)
  assert Tokens(out.ids[0], out.lengths[0]) == [0, 0, 2]
  np.testing.assert_allclose(out.scores[0], -1.2 / (8 / 6), rtol=1e-4)


@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_flat_beam_equals_standard_beam_when_pruning(alpha):
  toy = RandomToy(7, vocab=4, max_len=5)
  a = RunSearch(toy, 'standard', beam=3, alpha=alpha, batch=2)
  b = RunSearch(toy, 'flat', beam=3, alpha=alpha, batch=2)
  for key in ('topk_ids', 'topk_lengths'):
    np.testing.assert_array_equal(a[key], b[key])
  np.testing.assert_allclose(a.topk_scores, b.topk_scores, rtol=1e-6)
  # The beam really pruned: brute force may differ, but beam's best is a
  # real sentence scored correctly.
  best = Tokens(a.ids[0], a.lengths[0])
  logp = sum(toy.LogP(best[:i])[best[i]] for i in range(len(best)))
  np.testing.assert_allclose(
      a.scores[0], logp / ((5.0 + len(best)) / 6.0)**alpha, rtol=1e-5)


def test_greedy_stops_at_eos_and_pads():
  toy = HandSetToy()
  g = greedy.GreedySearch(toy.StandardStep,
                          NestedMap(fed=tf.zeros([1, toy.l], tf.int32)), 1,
                          toy.l, SOS, EOS)
  ids = g.ids.numpy()[0]
  # 'a' (0.5), then 'a' or 'b' (0.35 each; argmax takes 'a'), then EOS.
  np.testing.assert_array_equal(ids, [0, 0, 2])
  np.testing.assert_allclose(g.scores[0], np.log(0.5 * 0.35 * 1.0),
                             rtol=1e-5)
  assert int(g.lengths[0]) == 3


def test_search_runs_inside_tf_function():
  toy = RandomToy(3)

  @tf.function
  def Run():
    return RunSearch(toy, 'flat', 2, 0.6, batch=2).ids

  assert Run().shape == (2, toy.l)


def test_bad_args():
  with pytest.raises(ValueError, match='beam_size and max_len must be >= 1'):
    beam_search.BeamSearch(None, None, 1, 0, 3, SOS, EOS)
