"""Prints per-language counts and the effective sampling distribution.

  python -m lingshard.data.stats DIR [--temperature 5]

Counts come from the split TSV files in DIR (train is required; missing
held-out splits show as 0). Sampling probabilities follow the input
generator's rule p_l ~ (n_l / N) ** (1 / T) over the training counts; the
table shows T = 1 (proportional) next to the requested T ('inf' for
uniform).
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import argparse
import math
import os
import sys

from lingshard.data import corpus_io
from lingshard.data import sampling
from lingshard.data import splits


def SplitCounts(data_dir):
  """{split: {lang: count}} for the splits present; train must exist and
  hold pairs, an evaluation split may be empty (all its counts are 0)."""
  counts = {}
  for name in splits.ALL_SPLITS:
    path = corpus_io.SplitPath(data_dir, name)
    if name == splits.TRAIN or os.path.exists(path):
      counts[name] = corpus_io.LanguageCounts(
          corpus_io.ReadTsv(path, allow_empty=name != splits.TRAIN))
  return counts


def FormatTable(counts, temperature):
  """The statistics table as text (languages by descending train count)."""
  names = list(counts)
  train = counts[splits.TRAIN]
  p1 = sampling.TemperatureProbs(train, 1.0)
  pt = sampling.TemperatureProbs(train, temperature)
  t_name = 'inf' if math.isinf(temperature) else f'{temperature:g}'
  langs = sorted(set().union(*counts.values()),
                 key=lambda lg: (-train.get(lg, 0), lg))
  width = max(8, max(len(lg) for lg in langs) + 1)
  header = (f'{"lang":<{width}}' + ''.join(f'{n:>16}' for n in names) +
            f'{"p(T=1)":>10}{f"p(T={t_name})":>12}')
  lines = [header]
  for lang in langs:
    lines.append(f'{lang:<{width}}' +
                 ''.join(f'{counts[n].get(lang, 0):>16}' for n in names) +
                 f'{p1.get(lang, 0.0):>10.5f}{pt.get(lang, 0.0):>12.5f}')
  lines.append(f'{"ALL":<{width}}' +
               ''.join(f'{sum(counts[n].values()):>16}' for n in names) +
               f'{sum(p1.values()):>10.5f}{sum(pt.values()):>12.5f}')
  lines.append('')
  lines.append(f'{len(train)} training languages; effective number of '
               f'languages (exp entropy) at T=1: '
               f'{sampling.EffectiveNumLanguages(p1):.1f}, at T={t_name}: '
               f'{sampling.EffectiveNumLanguages(pt):.1f}')
  return '\n'.join(lines)


def main(argv=None):
  """CLI entry point; returns the process exit code."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('data_dir', help='Corpus directory (with train.tsv).')
  parser.add_argument('--temperature', type=float, default=5.0,
                      help="Sampling temperature T > 0; 'inf' for uniform.")
  args = parser.parse_args(argv)
  try:
    counts = SplitCounts(args.data_dir)
    print(f'corpus: {args.data_dir}')
    print(FormatTable(counts, args.temperature))
  except (corpus_io.CorpusError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
