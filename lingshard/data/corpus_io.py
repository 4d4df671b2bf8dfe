"""Corpus files: `lang<TAB>source<TAB>target` TSV and the statistics table.

One example per line, UTF-8, '\\n' line ends, no header, no quoting (fields
never contain tabs or newlines; prepare collapses whitespace). Readers
validate every line and name the file and line of the first bad one.
"""

import collections
import os
import re

from lingshard import input_error

TSV_SUFFIX = '.tsv'
# Placeholder- and HTML-free subset of a split, e.g. 'train.noph.tsv'.
NOPH_SUFFIX = '.noph.tsv'
STATS_FILE = 'stats.tsv'
# The vocabularies' subdirectory of a prepared corpus (see vocab.py).
VOCAB_DIR = 'vocab'
# The directory name of `prepare --corpus=large`'s output (data/ui_m4_large).
LARGE_NAME = 'ui_m4_large'

# Language codes and package names become parts of file names.
_SAFE_NAME_RE = re.compile(r'[A-Za-z0-9_@.-]+')
SAFE_NAME_RULE = "letters, digits, '_', '@', '.', '-' only, no '..'"


class CorpusError(input_error.InputError):
  """A corpus file is missing, empty or malformed."""


def IsSafeName(name):
  """True if `name` is non-empty, of SAFE_NAME_RULE's characters and has no
  '..': it can name a file in a directory and never a path leaving it."""
  return (isinstance(name, str) and bool(_SAFE_NAME_RE.fullmatch(name)) and
          '..' not in name)


def BuilderArgs(module, data_dir, large_name, large_flag):
  """`python -m` arguments of corpus builder `module` writing `data_dir`:
  with `large_flag` when the directory is named `large_name` (the large
  corpus's conventional directory), the default corpus otherwise."""
  large = os.path.basename(os.path.normpath(data_dir)) == large_name
  return ([module] + ([large_flag] if large else []) +
          ['--out', data_dir or '.'])


def PrepareArgs(data_dir):
  """`python -m` arguments of the prepare command that writes `data_dir`
  (`--corpus=large` for a directory named LARGE_NAME)."""
  return BuilderArgs('lingshard.data.prepare', data_dir, LARGE_NAME,
                     '--corpus=large')


def PrepareHint(path):
  """'prepare the corpus with: python -m lingshard.data.prepare --out DIR'
  (PrepareArgs), DIR being the corpus directory holding `path` (the parent
  of `vocab/` for a vocabulary file)."""
  data_dir = os.path.dirname(path)
  if os.path.basename(data_dir) == VOCAB_DIR:
    data_dir = os.path.dirname(data_dir)
  return ('prepare the corpus with: python -m ' +
          ' '.join(PrepareArgs(data_dir)))


def MissingFileError(what, path):
  """The CorpusError of a missing corpus or vocabulary file."""
  return CorpusError(f'{what} not found: {path}; {PrepareHint(path)}')


def SplitPath(data_dir, split, noph=False):
  """Path of a split's TSV file inside a prepared corpus directory."""
  return os.path.join(data_dir, split + (NOPH_SUFFIX if noph else TSV_SUFFIX))


def WriteTsv(path, rows):
  """Writes (lang, source, target) rows in the given order.

  Raises:
    ValueError: if a field is empty or holds a tab or newline.
  """
  with open(path, 'w', encoding='utf-8', newline='\n') as f:
    for row in rows:
      for field in row:
        if not field or '\t' in field or '\n' in field or '\r' in field:
          raise ValueError(f'bad TSV field {field!r} in {row!r}')
      f.write('\t'.join(row) + '\n')


def WriteAttribution(out_dir, header, entries):
  """ATTRIBUTION.txt and licenses/ of a corpus (prepare, lm_prepare).

  header: the opening lines; entries: (line naming a source, [(licence file
  name, bytes)], line to add when it has no licence file, or None). Each
  file is written to licenses/<name> and listed under its source.
  """
  lic_dir = os.path.join(out_dir, 'licenses')
  os.makedirs(lic_dir, exist_ok=True)
  lines = list(header) + ['']
  for line, files, if_none in entries:
    lines.append(line)
    for filename, data in files:
      with open(os.path.join(lic_dir, filename), 'wb') as f:
        f.write(data)
      lines.append(f'    licenses/{filename}')
    if not files and if_none:
      lines.append(f'    {if_none}')
  with open(os.path.join(out_dir, 'ATTRIBUTION.txt'), 'w', encoding='utf-8',
            newline='\n') as f:
    f.write('\n'.join(lines) + '\n')


def _ParseLine(line, path, lineno):
  text = line.rstrip('\r\n')
  fields = text.split('\t')
  if len(fields) != 3:
    raise CorpusError(
        f'{path}:{lineno}: expected 3 tab-separated fields '
        f'(lang, source, target), got {len(fields)}: {text[:80]!r}')
  if not all(fields):
    raise CorpusError(f'{path}:{lineno}: empty field in {text[:80]!r}')
  if not IsSafeName(fields[0]):
    raise CorpusError(f'{path}:{lineno}: bad language code {fields[0]!r}: '
                      f'use {SAFE_NAME_RULE}')
  return fields[0], fields[1], fields[2]


def ReadTsv(path, allow_empty=False):
  """Reads and validates a corpus TSV file.

  Args:
    path: the TSV file.
    allow_empty: return [] for an empty file (prepare writes an evaluation
      split with no pairs when a corpus has none for it).

  Returns:
    list of (lang, source, target) tuples in file order.

  Raises:
    CorpusError: if the file is missing or empty, or a line is malformed
      or has a language code that is not IsSafeName (the message starts
      with 'path:line:').
  """
  if not os.path.isfile(path):
    raise MissingFileError('corpus file', path)
  rows = []
  # Bytes, decoded line by line: a text-mode file decodes 8 KiB chunks
  # ahead of the line being parsed, so a bad byte would be blamed on an
  # earlier line.
  with open(path, 'rb') as f:
    for lineno, raw in enumerate(f, start=1):
      try:
        line = raw.decode('utf-8')
      except UnicodeDecodeError as e:
        raise CorpusError(f'{path}:{lineno}: not UTF-8: {e}') from None
      rows.append(_ParseLine(line, path, lineno))
  if not rows and not allow_empty:
    raise CorpusError(f'corpus file is empty: {path}')
  return rows


def GroupByLanguage(rows):
  """Returns {lang: [(source, target), ...]} with languages sorted."""
  groups = collections.defaultdict(list)
  for lang, source, target in rows:
    groups[lang].append((source, target))
  return {lang: groups[lang] for lang in sorted(groups)}


def LanguageCounts(rows):
  """Returns {lang: number of rows}, languages sorted."""
  counts = collections.Counter(lang for lang, _, _ in rows)
  return {lang: counts[lang] for lang in sorted(counts)}


def WriteStatsTable(path, split_counts):
  """Writes the per-language pairs-per-split table.

  Args:
    path: output TSV path (with a header line).
    split_counts: ordered dict {split name: {lang: count}}.
  """
  names = list(split_counts)
  langs = sorted(set().union(*(set(c) for c in split_counts.values())))
  total_row = [sum(split_counts[n].values()) for n in names]
  with open(path, 'w', encoding='utf-8', newline='\n') as f:
    f.write('\t'.join(['lang'] + names + ['total']) + '\n')
    for lang in langs:
      row = [split_counts[n].get(lang, 0) for n in names]
      f.write('\t'.join([lang] + [str(x) for x in row + [sum(row)]]) + '\n')
    f.write('\t'.join(['ALL'] + [str(x) for x in total_row + [sum(total_row)]])
            + '\n')

