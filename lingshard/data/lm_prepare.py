"""An English LM corpus, offline: the standard library's prose.

  python -m lingshard.data.lm_prepare --out data/lm_en

Reads the docstrings (`ast`) and comments (`tokenize`) of every module of
this interpreter's standard library (never importing or running them;
test packages and demo/fixture trees skipped), keeps prose sentences,
deduplicates them (first occurrence, modules in path order), splits
train/dev/test by module (sha256 of the module path: 90/5/5, so no module
is in two splits) and writes a word vocabulary of the most frequent train
words. Same interpreter, same bytes: a re-run writes identical files.

Sentences: paragraphs (blank-line separated; doctest `>>>`/`...` lines
dropped) split after `.`, `!` or `?` followed by a capital letter; words
are lower-cased runs of letters (with an apostrophe part), numbers, or
single punctuation marks; a sentence is kept with 3..60 words of which at
least 70% are alphabetic and none longer than 30 characters.

Output (built in a temporary directory beside --out, renamed into place):
train.txt, dev.txt, test.txt (one sentence per line, words joined by
single spaces), vocab.txt (one word per line; line i is id i: <pad>, <s>,
</s>, <unk>, then words by descending train count, ties by word) and
manifest.json (interpreter version, counts).
"""

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
import tokenize

from absl import app
from absl import flags

from lingshard.tools import cli

SPECIALS = ('<pad>', '<s>', '</s>', '<unk>')
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
SPLITS = ('train', 'dev', 'test')
_SKIP_DIRS = {'test', 'tests', 'idlelib', 'turtledemo', 'lib2to3',
              'site-packages', 'dist-packages', '__pycache__', 'ensurepip',
              'tkinter', 'pydoc_data'}
_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+|[^\sa-z0-9]")
_SENT_END_RE = re.compile(r'(?<=[.!?])\s+(?=[A-Z])')
_ABBREVIATIONS = ('e.g.', 'i.e.', 'etc.', 'vs.', 'cf.', 'Mr.', 'Dr.')

FLAGS = flags.FlagValues()
flags.DEFINE_string('out', None, 'Output directory (new or empty).',
                    flag_values=FLAGS)
flags.DEFINE_integer('vocab_size', 10000, 'Words in the vocabulary '
                     '(besides the 4 specials).', flag_values=FLAGS)
flags.DEFINE_string('source_root', None, 'Python sources to read; default '
                    "this interpreter's standard library.", flag_values=FLAGS)
flags.DEFINE_integer('max_modules', 0, 'Read only the first N modules (0 = '
                     'all).', flag_values=FLAGS)


class LmCorpusError(ValueError):
  """A corpus that cannot be built (one line)."""


def Modules(root, max_modules=0):
  """Sorted relative paths of the .py files under root (skips _SKIP_DIRS)."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and
                         not d.startswith(('test_', '.')))
    for name in sorted(filenames):
      if name.endswith('.py') and not name.startswith('test_'):
        out.append(os.path.relpath(os.path.join(dirpath, name), root))
  out.sort()
  return out[:max_modules] if max_modules else out


def ProseBlocks(source):
  """Docstrings and comment blocks of one module's source text."""
  blocks = []
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return blocks
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc:
        blocks.append(doc)
  comments, last_row = [], None
  try:
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
      if tok.type != tokenize.COMMENT:
        continue
      text = tok.string.lstrip('#').strip()
      if last_row is not None and tok.start[0] != last_row + 1:
        blocks.append('\n'.join(comments))
        comments = []
      comments.append(text)
      last_row = tok.start[0]
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


def SplitOf(module):
  """train / dev / test of a module path (sha256: 90 / 5 / 5)."""
  bucket = int(hashlib.sha256(module.encode('utf-8')).hexdigest(), 16) % 100
  return 'train' if bucket < 90 else 'dev' if bucket < 95 else 'test'


def Build(root, vocab_size, max_modules=0):
  """{split: [sentence text]}, vocabulary words, stats."""
  seen, data = set(), {s: [] for s in SPLITS}
  modules = {s: 0 for s in SPLITS}
  for module in Modules(root, max_modules):
    try:
      with open(os.path.join(root, module), 'rb') as f:
        source = f.read().decode('utf-8')
    except (OSError, UnicodeDecodeError):
      continue
    split = SplitOf(module)
    kept = 0
    for block in ProseBlocks(source):
      for words in Sentences(block):
        line = ' '.join(words)
        if line not in seen:
          seen.add(line)
          data[split].append(line)
          kept += 1
    modules[split] += bool(kept)
  if not data['train']:
    raise LmCorpusError(f'--source_root {root}: no English prose found in '
                        'its .py files; pass a directory of Python sources')
  counts = collections.Counter(w for ln in data['train'] for w in ln.split())
  words = [w for w, _ in sorted(counts.items(),
                                key=lambda kv: (-kv[1], kv[0]))][:vocab_size]
  known = set(words)
  dev_words = [w for ln in data['dev'] for w in ln.split()]
  stats = dict(
      python=sys.version.split()[0], source_root=root,
      vocab_size=len(SPECIALS) + len(words),
      dev_oov_rate=round(sum(w not in known for w in dev_words) /
                         max(len(dev_words), 1), 4),
      splits={s: dict(sentences=len(data[s]), modules=modules[s],
                      words=sum(len(ln.split()) for ln in data[s]))
              for s in SPLITS})
  return data, words, stats


def Write(out, data, words, stats):
  """Writes the corpus beside `out` and renames it into place."""
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
  if os.path.isdir(out):
    os.rmdir(out)  # Empty (checked above).
  os.rename(tmp, out)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not FLAGS.out:
    raise app.UsageError('--out is required')
  root = FLAGS.source_root or sysconfig.get_paths()['stdlib']
  try:
    data, words, stats = Build(root, FLAGS.vocab_size, FLAGS.max_modules)
    Write(FLAGS.out, data, words, stats)
  except LmCorpusError as e:
    sys.exit(f'lm_prepare: error: {e}')
  for split, s in stats['splits'].items():
    print(f'{split:5s} {s["sentences"]:7,d} sentences {s["words"]:9,d} words '
          f'{s["modules"]:5,d} modules')
  print(f'vocab {stats["vocab_size"]:,d} words; dev OOV rate '
        f'{stats["dev_oov_rate"]:.2%}; wrote {FLAGS.out}')


if __name__ == '__main__':
  cli.Run(main, FLAGS)
