"""Invariants of the held-out splits on random multi-way corpora."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from lingshard.data import splits
from lingshard.data.po_extract import Pair

LANGS = ['de', 'fr', 'ja', 'ru', 'de_CH']
WORDS = ['save', 'page', 'user', 'file', 'open', 'close', 'new', 'old']

# A corpus: English strings, each translated into a subset of languages;
# translations are drawn from a small word set so that collisions (the same
# source under two languages or two English strings) actually happen.
_corpora = st.lists(
    st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
              st.lists(st.tuples(st.sampled_from(LANGS),
                                 st.lists(st.sampled_from(WORDS), min_size=1,
                                          max_size=2)),
                       min_size=1, max_size=5)),
    min_size=1, max_size=40)


def _Pairs(corpus):
  pairs = []
  for i, (english_words, translations) in enumerate(corpus):
    english = ' '.join(english_words) + f' #{i}'
    for lang, words in translations:
      pairs.append(Pair(lang, ' '.join(words), english))
  return pairs


def _CheckInvariants(pairs, result):
  train = result[splits.TRAIN]
  train_english = {p.target for p in train}
  train_keys = {(p.lang, p.source) for p in train}
  train_source_target = {(p.source, p.target) for p in train}
  seen_keys = set()
  for name in splits.HELDOUT:
    keys = {(p.lang, p.source) for p in result[name]}
    assert not keys & train_keys, name
    assert not keys & seen_keys, name
    seen_keys |= keys
    assert not ({(p.source, p.target) for p in result[name]} &
                train_source_target), name
  for name in (splits.DEV_UNSEEN, splits.TEST_UNSEEN):
    assert not {p.target for p in result[name]} & train_english
  for name in (splits.DEV_SEEN, splits.TEST_SEEN):
    for p in result[name]:
      others = {q.lang for q in train if q.target == p.target}
      assert others and p.lang not in others
  # Every output pair is an input pair, each at most once, and nothing
  # lands in train that was not in the input.
  out = [p for name in splits.ALL_SPLITS for p in result[name]]
  assert len(out) == len(set(out))
  assert set(out) <= set(pairs)
  assert set(train) | set().union(*(result[n] for n in splits.HELDOUT)) == (
      set(out))
  for name in splits.ALL_SPLITS:
    assert result[name] == sorted(result[name])


@settings(max_examples=60, deadline=None, database=None)
@given(_corpora, st.randoms(use_true_random=False))
def test_invariants_and_order_independence(corpus, rnd):
  pairs = _Pairs(corpus)
  result, _ = splits.SplitPairs(pairs, (0.2, 0.2), (0.2, 0.2))
  _CheckInvariants(pairs, result)
  shuffled = pairs + pairs[:3]  # Duplicates must not matter either.
  rnd.shuffle(shuffled)
  again, _ = splits.SplitPairs(shuffled, (0.2, 0.2), (0.2, 0.2))
  assert again == result


def test_all_held_out_kinds_appear_and_drops_are_counted():
  rnd = random.Random(0)
  pairs = []
  for i in range(200):
    english = f'English string {i}'
    german = f'de {i} {rnd.randrange(3)}'
    pairs.append(Pair('de', german, english))
    # de_CH copies de half the time: a near-duplicate variant.
    swiss = german if rnd.random() < 0.5 else f'ch {i}'
    pairs.append(Pair('de_CH', swiss, english))
    for lang in ('fr', 'ja', 'ru'):
      if rnd.random() < 0.7:
        pairs.append(Pair(lang, f'{lang} {i} {rnd.randrange(3)}', english))
  result, counts = splits.SplitPairs(pairs, (0.1, 0.1), (0.1, 0.1))
  _CheckInvariants(pairs, result)
  for name in splits.ALL_SPLITS:
    assert result[name], name
  # The near-duplicate copies were caught, not leaked into held-out sets.
  assert any(k.endswith('_pair_in_train_other_lang') for k in counts)
  dropped = sum(counts.values())
  kept = sum(len(v) for v in result.values())
  moved = counts['seen_en_without_train_english_to_train']
  assert kept + dropped - moved == len(set(pairs))


def test_salt_changes_the_split():
  pairs = [Pair('de', f'd{i}', f'e{i}') for i in range(300)]
  a, _ = splits.SplitPairs(pairs, (0.1, 0.1), (0.1, 0.1), salt='a')
  b, _ = splits.SplitPairs(pairs, (0.1, 0.1), (0.1, 0.1), salt='b')
  assert a[splits.DEV_UNSEEN] != b[splits.DEV_UNSEEN]


def test_hash_unit_is_in_unit_interval_and_keyed():
  values = [splits.HashUnit('s', str(i)) for i in range(1000)]
  assert all(0.0 <= v < 1.0 for v in values)
  assert len(set(values)) == 1000
  # Roughly uniform: each tenth of [0, 1) gets 100 +- 40 of 1000 draws.
  for k in range(10):
    assert 60 <= sum(k / 10 <= v < (k + 1) / 10 for v in values) <= 140
