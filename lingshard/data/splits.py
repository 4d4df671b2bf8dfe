"""Held-out splits for a multi-way parallel corpus.

The same English string is translated into many languages, so a random
pair-level split would leak: the model would see the English target of a
test pair in training (with other languages). Two kinds of held-out sets
are therefore made:

* `*_unseen_en`: chosen by a hash of the English string; no pair with that
  English string is in training (strict generalisation).
* `*_seen_en`: chosen by a hash of (language, English); the English target
  does occur in training with other languages (a new language's rendering
  of known content, like M4's multi-way test sets).

Held-out pairs whose (language, source) occurs in training, or whose
(source, English) pair occurs in training under another language code
(near-duplicate variants such as ca / ca@valencia), are dropped. A
(language, source) pair belongs to at most one held-out split.

Every decision is a pure function of the pair's strings (sha256, never
Python's salted `hash()`) and all iteration is over sorted lists, so the
same input gives the same splits on every machine.
"""

import collections
import hashlib

TRAIN = 'train'
DEV_UNSEEN = 'dev_unseen_en'
TEST_UNSEEN = 'test_unseen_en'
DEV_SEEN = 'dev_seen_en'
TEST_SEEN = 'test_seen_en'
HELDOUT = (DEV_UNSEEN, TEST_UNSEEN, DEV_SEEN, TEST_SEEN)
ALL_SPLITS = (TRAIN,) + HELDOUT


def HashUnit(salt, *parts):
  """A stable pseudo-random number in [0, 1) from strings."""
  key = '\x1f'.join((salt,) + parts).encode('utf-8')
  return int.from_bytes(hashlib.sha256(key).digest()[:8], 'big') / 2.0**64


def _Pick(u, dev_frac, test_frac, dev_name, test_name):
  if u < dev_frac:
    return dev_name
  if u < dev_frac + test_frac:
    return test_name
  return None


def SplitPairs(pairs, unseen_fracs=(0.02, 0.02), seen_fracs=(0.015, 0.015),
               salt='lingshard-splits-v1'):
  """Assigns pairs to train and the four held-out splits.

  Args:
    pairs: iterable of po_extract.Pair (any order; duplicates removed).
    unseen_fracs: (dev, test) fractions of distinct English strings held out
      entirely.
    seen_fracs: (dev, test) fractions of the remaining (language, English)
      pairs held out while the English string stays in training.
    salt: mixed into every hash; change it to draw different splits.

  Returns:
    (dict split name -> sorted list of pairs, collections.Counter of pairs
    dropped or moved, by reason).
  """
  for frac in tuple(unseen_fracs) + tuple(seen_fracs):
    if not 0.0 <= frac < 1.0:
      raise ValueError(f'split fractions must be in [0, 1), got {frac}')
  counts = collections.Counter()
  candidates = {name: [] for name in ALL_SPLITS}
  for pair in sorted(set(pairs)):
    split = _Pick(HashUnit(salt, 'english', pair.target), *unseen_fracs,
                  DEV_UNSEEN, TEST_UNSEEN)
    if split is None:
      split = _Pick(HashUnit(salt, 'seen', pair.lang, pair.target),
                    *seen_fracs, DEV_SEEN, TEST_SEEN) or TRAIN
    candidates[split].append(pair)

  # A seen_en pair needs its English in training; if every language holding
  # that English string was drawn out, the pairs go back to training.
  train_english = {p.target for p in candidates[TRAIN]}
  for name in (DEV_SEEN, TEST_SEEN):
    keep = []
    for pair in candidates[name]:
      if pair.target in train_english:
        keep.append(pair)
      else:
        candidates[TRAIN].append(pair)
        counts['seen_en_without_train_english_to_train'] += 1
    candidates[name] = keep

  train = sorted(candidates[TRAIN])
  train_lang_source = {(p.lang, p.source) for p in train}
  train_source_target = {(p.source, p.target) for p in train}
  claimed = set()
  result = {TRAIN: train}
  for name in HELDOUT:
    keep = []
    for pair in candidates[name]:
      key = (pair.lang, pair.source)
      if key in train_lang_source:
        counts[f'{name}_lang_source_in_train'] += 1
      elif (pair.source, pair.target) in train_source_target:
        counts[f'{name}_pair_in_train_other_lang'] += 1
      elif key in claimed:
        counts[f'{name}_lang_source_in_earlier_split'] += 1
      else:
        keep.append(pair)
    claimed.update((p.lang, p.source) for p in keep)
    result[name] = sorted(keep)
  return result, counts
