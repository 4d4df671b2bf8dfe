"""An English LM corpus, offline: the prose of pinned Python sources.

  python -m lingshard.data.lm_prepare --out data/lm_en
  python -m lingshard.data.lm_prepare --sources=large --out data/lm_en_large

Reads the docstrings (`ast`) and comments (`tokenize`) of every module of
this interpreter's standard library (never importing or running them;
test packages and demo/fixture trees skipped), keeps prose sentences,
deduplicates them (first occurrence, modules in path order), splits
train/dev/test by module (sha256 of the module path: 90/5/5, so no module
is in two splits) and writes a word vocabulary of the most frequent train
words. Same interpreter, same bytes: a re-run writes identical files.

--sources (the larger corpus): reads pinned sources instead, comma-
separated names of lingshard/data/lm_sources.py PINS, of the wheels of
lingshard/data/lm_wheel_sources.py, or the set `large` (all: the stdlib,
47 permissively licensed distributions of the venv, e.g. tensorflow, jax,
scipy, numpy, matplotlib, and 12 sha256-pinned PyPI wheels of the MT
corpus, e.g. django, wagtail, sphinx, read from the wheel file; missing
ones are downloaded into --wheel_cache as by prepare, unless --offline).
Each is checked against its pin (exact version, licence, sha256
fingerprint of the files read, or of the wheel) before anything is read;
a missing or changed source is a one-line error. Sources are read in pin
order (installed ones, then wheels), modules in path order within each;
the module path hashed for the split is `<name>/<path>` (e.g.
`tensorflow/tensorflow/python/ops/math_ops.py`,
`django/django/db/models/query.py`); docstring markup is stripped first
(StripMarkup: reST sections, numpydoc / Google parameter lists,
backquotes), since package docstrings are mostly structured; the output
adds ATTRIBUTION.txt and licenses/ (each source's licence files), and the
manifest lists the sources (pin, modules, sentences, words).

Sentences: paragraphs (blank-line separated; doctest `>>>`/`...` lines
dropped) split after `.`, `!` or `?` followed by a capital letter; words
are lower-cased runs of letters (with an apostrophe part), numbers, or
single punctuation marks; a sentence is kept with 3..60 words of which at
least 70% are alphabetic and none longer than 30 characters.

A .py file that is not a regular file (a FIFO or device: never opened),
is over lm_sources.MAX_SOURCE_BYTES, unreadable, not UTF-8, or beyond the
parser's limits (RecursionError / MemoryError from `ast`) is skipped; the
count is printed and recorded in manifest.json (`skipped_files`, when > 0).

Output (built in a temporary directory beside --out, renamed into place):
train.txt, dev.txt, test.txt (one sentence per line, words joined by
single spaces), vocab.txt (one word per line; line i is id i: <pad>, <s>,
</s>, <unk>, then words by descending train count, ties by word) and
manifest.json (interpreter version, counts).
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import ast
import collections
import hashlib
import io
import json
import os
import re
import sys
import sysconfig
import tempfile
import time
import tokenize

from absl import app
from absl import flags

from lingshard.data import corpus_io
from lingshard.data import lm_sources
from lingshard.data import lm_wheel_sources
from lingshard.data import wheels
from lingshard import cli

SPECIALS = ('<pad>', '<s>', '</s>', '<unk>')
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
SPLITS = ('train', 'dev', 'test')
# The directory name of `--sources=large`'s output by convention
# (data/lm_en_large): PrepareArgs gives such a directory's command.
LARGE_NAME = 'lm_en_large'
_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+|[^\sa-z0-9]")
_SENT_END_RE = re.compile(r'(?<=[.!?])\s+(?=[A-Z])')
_ABBREVIATIONS = ('e.g.', 'i.e.', 'etc.', 'vs.', 'cf.', 'Mr.', 'Dr.')
# --sources only (StripMarkup): reST/numpydoc/Google docstring structure.
_UNDERLINE_RE = re.compile(r'^\s*([-=~^*#+])\1{2,}\s*$')
_HEADER_RE = re.compile(r'^\s*[A-Z][A-Za-z ]{0,30}:\s*$')
_NUMPY_PARAM_RE = re.compile(r'^\s*\**[A-Za-z_][\w, *]*\s+:(\s.*)?$')
_PARAM_RE = re.compile(  # Google `x:` / `x (int):`, Sphinx `:param x:`.
    r'^(\s*)(?:\**[A-Za-z_]\w*(?: \([^)]*\))?|:[a-z]+(?: [^:`]*)?):\s+(?=\S)')
_ROLE_RE = re.compile(r':[a-z]+(?::[a-z]+)?:(?=`)')
_LINK_RE = re.compile(r'`([^`<]*?)\s*<[^>]*>`_+')
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_STMT_NODES = (ast.stmt, ast.excepthandler, ast.match_case)
# A comment or a string literal (tokenize's patterns; a prefix is skipped).
_SCAN_RE = re.compile(
    r"#[^\r\n]*"
    r"|'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
    r'|"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'
    r"|'[^\n'\\]*(?:\\.[^\n'\\]*)*'"
    r'|"[^\n"\\]*(?:\\.[^\n"\\]*)*"', re.S)

FLAGS = flags.FlagValues()
flags.DEFINE_string('out', None, 'Output directory (new or empty).',
                    flag_values=FLAGS)
flags.DEFINE_integer('vocab_size', 10000, 'Words in the vocabulary '
                     '(besides the 4 specials).', flag_values=FLAGS)
flags.DEFINE_string('source_root', None, 'Python sources to read; default '
                    "this interpreter's standard library.", flag_values=FLAGS)
flags.DEFINE_integer('max_modules', 0, 'Read only the first N modules (0 = '
                     'all; with --sources, of each source).',
                     flag_values=FLAGS)
flags.DEFINE_string('sources', None, 'Pinned sources to read instead of '
                    '--source_root, comma-separated: names of '
                    'lingshard/data/lm_sources.py PINS (stdlib, tensorflow, '
                    '...), of lingshard/data/lm_wheel_sources.py (django, '
                    '...) or "large" (all of them).', flag_values=FLAGS)
flags.DEFINE_string('wheel_cache', None, 'With --sources: where the pinned '
                    'wheels are cached (default $LINGSHARD_WHEEL_CACHE or '
                    '~/.cache/lingshard/wheels, as for prepare).',
                    flag_values=FLAGS)
flags.DEFINE_bool('offline', False, 'With --sources: fail instead of '
                  'downloading missing wheels.', flag_values=FLAGS)


Modules = lm_sources.Modules  # The stdlib walk (test packages skipped).


class LmCorpusError(ValueError):
  """A corpus that cannot be built (one line)."""



def PrepareArgs(data_dir):
  """`python -m` arguments of the command that writes `data_dir`
  (`--sources=large` for a directory named LARGE_NAME)."""
  return corpus_io.BuilderArgs('lingshard.data.lm_prepare', data_dir,
                               LARGE_NAME, '--sources=large')

def _Docstrings(tree):
  """Docstrings of a module's module / class / function nodes, in
  ast.walk's breadth-first order. Only statements can hold a def, so the
  walk skips expressions (most of the tree): same nodes, same order."""
  blocks, queue = [], [tree]
  for node in queue:
    if isinstance(node, _DOC_NODES):
      doc = ast.get_docstring(node)
      if doc:
        blocks.append(doc)
    queue.extend(c for c in ast.iter_child_nodes(node)
                 if isinstance(c, _STMT_NODES))
  return blocks


def _Comments(source):
  """(row, text) of the comment tokens of valid Python source. Before 3.12
  tokenize is pure Python (most of the corpus build): a '#' outside a
  string literal starts a comment, so one regex scan over strings and
  comments finds the same tokens. 3.12's f-strings nest quotes and its
  tokenize is C, and a lone CR splits rows differently: tokenize."""
  if sys.version_info >= (3, 12) or '\r' in source:
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
      if tok.type == tokenize.COMMENT:
        yield tok.start[0], tok.string
    return
  row, pos = 1, 0
  for m in _SCAN_RE.finditer(source):
    if source[m.start()] == '#':
      row += source.count('\n', pos, m.start())
      pos = m.start()
      yield row, m.group()


def ProseBlocks(source):
  """Docstrings and comment blocks of one module's source text."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return []
  blocks = _Docstrings(tree)
  comments, last_row = [], None
  try:
    for row, string in _Comments(source):
      text = string.lstrip('#').strip()
      if last_row is not None and row != last_row + 1:
        blocks.append('\n'.join(comments))
        comments = []
      comments.append(text)
      last_row = row
  except (tokenize.TokenError, SyntaxError):
    pass
  if comments:
    blocks.append('\n'.join(comments))
  return blocks


def Sentences(block):
  """Tokenised prose sentences (lists of words) of one text block."""
  out = []
  for para in re.split(r'\n\s*\n', block):
    lines = [ln.strip() for ln in para.splitlines()
             if not ln.strip().startswith(('>>>', '...'))]
    text = ' '.join(ln for ln in lines if ln)
    for abbr in _ABBREVIATIONS:
      text = text.replace(abbr, abbr.replace('.', '\0'))
    for sent in _SENT_END_RE.split(text):
      words = _WORD_RE.findall(sent.replace('\0', '.').lower())
      alpha = sum(w[0].isalpha() for w in words)
      if (3 <= len(words) <= 60 and alpha >= 0.7 * len(words) and
          max(len(w) for w in words) <= 30):
        out.append(words)
  return out


def StripMarkup(block):
  """A docstring's prose without its reST / numpydoc / Google structure.

  Section underlines (and the heading above), `Args:`-style headers and
  numpydoc `name : type` lines become paragraph breaks; a Google `name:`
  / `name (type):` or Sphinx `:param name:` prefix starts a paragraph;
  `text <url>`_ links keep their text, :role:`x` becomes x and
  backquotes are dropped.
  """
  out = []
  for line in block.splitlines():
    if _UNDERLINE_RE.match(line):
      out[-1:] = ['', '']
      continue
    if _HEADER_RE.match(line) or _NUMPY_PARAM_RE.match(line):
      out.append('')
      continue
    m = _PARAM_RE.match(line)
    if m:
      out.append('')
      line = m.group(1) + line[m.end():]
    line = _ROLE_RE.sub('', _LINK_RE.sub(r'\1', line))
    out.append(line.replace('`', ''))
  return '\n'.join(out)


def SplitOf(module):
  """train / dev / test of a module path (sha256: 90 / 5 / 5)."""
  bucket = int(hashlib.sha256(module.encode('utf-8')).hexdigest(), 16) % 100
  return 'train' if bucket < 90 else 'dev' if bucket < 95 else 'test'


def _Collect(modules, strip_markup=False):
  """Deduplicated sentences of (module key, bytes or None if unreadable,
  source) triples, in order. A module that is unreadable (None), not
  UTF-8, or beyond the parser's limits (a RecursionError or MemoryError
  from `ast`: e.g. a 100k-term sum, 100k nested unary minuses) is skipped
  and counted.

  Returns:
    {split: [sentence text]}, {split: modules with a kept sentence},
    {source: [modules read, sentences, words]}, modules skipped.
  """
  seen, data = set(), {s: [] for s in SPLITS}
  counts = {s: 0 for s in SPLITS}
  per_source = collections.defaultdict(lambda: [0, 0, 0])
  skipped = 0
  for module, raw, source in modules:
    try:
      blocks = ProseBlocks(raw.decode('utf-8')) if raw is not None else None
    except (UnicodeDecodeError, RecursionError, MemoryError):
      blocks = None
    if blocks is None:
      skipped += 1
      continue
    split = SplitOf(module)
    kept, tally = 0, per_source[source]
    tally[0] += 1
    for block in blocks:
      for words in Sentences(StripMarkup(block) if strip_markup else block):
        line = ' '.join(words)
        if line not in seen:
          seen.add(line)
          data[split].append(line)
          kept += 1
          tally[1] += 1
          tally[2] += len(words)
    counts[split] += bool(kept)
  return data, counts, per_source, skipped


def _Vocabulary(data, vocab_size, modules, skipped):
  """Vocabulary words and the stats shared by both builds (`skipped_files`
  only when some were: earlier outputs stay byte-identical)."""
  counts = collections.Counter(w for ln in data['train'] for w in ln.split())
  words = [w for w, _ in sorted(counts.items(),
                                key=lambda kv: (-kv[1], kv[0]))][:vocab_size]
  known = set(words)
  dev_words = [w for ln in data['dev'] for w in ln.split()]
  stats = dict(
      python=sys.version.split()[0],
      vocab_size=len(SPECIALS) + len(words),
      dev_oov_rate=round(sum(w not in known for w in dev_words) /
                         max(len(dev_words), 1), 4),
      splits={s: dict(sentences=len(data[s]), modules=modules[s],
                      words=sum(len(ln.split()) for ln in data[s]))
              for s in SPLITS})
  if skipped:
    stats['skipped_files'] = skipped
  return words, stats


def _Read(archive, file):
  try:
    return lm_sources.ReadFile(archive, file)
  except OSError:
    return None


def _SourceModules(sources, max_modules):
  """(`<name>/<path>`, bytes, name) of the sources' modules, in order."""
  for s in sources:
    with lm_sources.Opened(s) as archive:
      for rel, file in s.modules[:max_modules or None]:
        yield f'{s.pin.name}/{rel}', _Read(archive, file), s.pin.name


def Build(root, vocab_size, max_modules=0):
  """{split: [sentence text]}, vocabulary words, stats of the .py files
  under root (module paths relative to root)."""
  data, modules, _, skipped = _Collect(
      (m, _Read(None, os.path.join(root, m)), '')
      for m in Modules(root, max_modules))
  if not data['train']:
    raise LmCorpusError(f'--source_root {root}: no English prose found in '
                        'its .py files; pass a directory of Python sources')
  words, stats = _Vocabulary(data, vocab_size, modules, skipped)
  stats['source_root'] = root
  return data, words, stats


def BuildSources(sources, vocab_size, max_modules=0):
  """Build over verified lm_sources.Sources (module key `<name>/<path>`,
  docstring markup stripped); stats list each source and its words."""
  data, modules, per_source, skipped = _Collect(
      _SourceModules(sources, max_modules), strip_markup=True)
  if not data['train']:
    raise LmCorpusError('--sources ' + ','.join(s.pin.name for s in sources) +
                        ': no English prose found in their .py files')
  words, stats = _Vocabulary(data, vocab_size, modules, skipped)
  stats['markup'] = 'stripped'
  stats['sources'] = [
      dict(zip(('modules', 'sentences', 'words'), per_source[s.pin.name]),
           **s.pin._asdict()) for s in sources]
  return data, words, stats


def Describe(source):
  """`name version` (the stdlib as `stdlib (Python 3.11.7)`, a wheel's with
  its file name)."""
  pin = source.pin
  if pin.name == lm_sources.STDLIB:
    return f'{pin.name} (Python {pin.version})'
  return f'{pin.name} {pin.version}' + (
      f' ({os.path.basename(source.archive)})' if source.archive else '')


def WriteAttribution(out_dir, sources):
  """ATTRIBUTION.txt and licenses/<source>-<file> of the sources read."""
  entries = []
  for source in sources:
    pin = source.pin
    kind = 'wheel' if source.archive else 'sources'
    with lm_sources.Opened(source) as archive:
      files = [(f'{pin.name}-{name}', lm_sources.ReadFile(archive, file))
               for name, file in source.licence_files]
    entries.append((
        f'- {Describe(source)}, licence: {pin.licence}, {kind} sha256: '
        f'{pin.sha256}', files, '(no licence file in the ' + (
            'wheel)' if source.archive else 'installed distribution)')))
  corpus_io.WriteAttribution(
      out_dir, ['English sentences extracted from the docstrings and '
                'comments of the Python', 'sources of these packages '
                '(installed, or pinned wheels), read, never imported or run:'],
      entries)


def Write(out, data, words, stats, sources=None):
  """Writes the corpus beside `out` and renames it into place (with
  ATTRIBUTION.txt and licenses/ of `sources`, lm_sources.Sources, if any)."""
  out = os.path.abspath(out)
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise LmCorpusError(f'--out {out} exists and is not empty; pass a new '
                        'or empty directory')
  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix='.lm_prepare_', dir=parent)
  for split in SPLITS:
    with open(os.path.join(tmp, f'{split}.txt'), 'w', encoding='utf-8',
              newline='\n') as f:
      f.writelines(ln + '\n' for ln in data[split])
  with open(os.path.join(tmp, 'vocab.txt'), 'w', encoding='utf-8',
            newline='\n') as f:
    f.writelines(w + '\n' for w in list(SPECIALS) + words)
  with open(os.path.join(tmp, 'manifest.json'), 'w', encoding='utf-8') as f:
    json.dump(stats, f, indent=1, sort_keys=True)
    f.write('\n')
  if sources:
    WriteAttribution(tmp, sources)
  if os.path.isdir(out):
    os.rmdir(out)  # Empty (checked above).
  os.rename(tmp, out)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not FLAGS.out:
    raise app.UsageError('--out is required')
  if FLAGS.sources is not None and FLAGS.source_root:
    raise app.UsageError('--sources and --source_root exclude each other')
  start, sources = time.monotonic(), None
  try:
    if FLAGS.sources is not None:
      sources = lm_wheel_sources.Resolve(
          lm_wheel_sources.Select(FLAGS.sources),
          FLAGS.wheel_cache or wheels.DefaultCacheDir(),
          allow_download=not FLAGS.offline)
      data, words, stats = BuildSources(sources, FLAGS.vocab_size,
                                        FLAGS.max_modules)
    else:
      root = FLAGS.source_root or sysconfig.get_paths()['stdlib']
      data, words, stats = Build(root, FLAGS.vocab_size, FLAGS.max_modules)
    Write(FLAGS.out, data, words, stats, sources)
  except (LmCorpusError, lm_sources.SourceError, wheels.WheelError,
          corpus_io.CorpusError) as e:
    sys.exit(f'lm_prepare: error: {e}')
  for s in stats.get('sources', ()):
    print(f'{s["name"]:20s} {s["version"]:9s} {s["licence"][:28]:28s} '
          f'{s["modules"]:5,d} modules {s["words"]:9,d} words')
  for split, s in stats['splits'].items():
    print(f'{split:5s} {s["sentences"]:7,d} sentences {s["words"]:9,d} words '
          f'{s["modules"]:5,d} modules')
  if stats.get('skipped_files'):
    print(f'skipped {stats["skipped_files"]:,d} .py files: not regular '
          f'files, over {lm_sources.MAX_SOURCE_BYTES:,d} bytes, unreadable, '
          "not UTF-8 or beyond the parser's limits")
  print(f'vocab {stats["vocab_size"]:,d} words; dev OOV rate '
        f'{stats["dev_oov_rate"]:.2%}; wrote {FLAGS.out}'
        + (f' in {time.monotonic() - start:.0f}s' if sources else ''))


if __name__ == '__main__':
  cli.RunMain(main, FLAGS)
