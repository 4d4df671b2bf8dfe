"""lm_prepare (English prose of Python sources) and LmInput batches."""

import ast
import hashlib
import io
import json
import os
import platform
import tokenize

import numpy as np
import pytest

from lingshard import base_input
from lingshard.data import lm_inputs
from lingshard.data import lm_prepare
from lingshard.data import lm_sources
from lingshard.data import lm_wheel_sources
from lingshard.data import wheels

from .test_prepare_large import _Wheel

_MODULE = '''"""The frobnicator module. It frobnicates widgets quickly.

>>> frob(1)
2
"""

# Compute the answer to everything.
# It is forty two, as everybody knows.
def frob(x):
  """Return the frobnicated value of x. The value is never negative."""
  return x + 1  # not prose: too short
'''


def _Root(tmp_path, n=12):
  root = tmp_path / 'src'
  for i in range(n):
    (root / f'pkg{i % 3}').mkdir(parents=True, exist_ok=True)
    text = _MODULE.replace('widgets', f'widgets number {i}')
    (root / f'pkg{i % 3}' / f'mod{i}.py').write_text(text)
  (root / 'test').mkdir()
  (root / 'test' / 'mod.py').write_text('"""Skipped test module prose here."""')
  return str(root)


# '#' and quotes inside strings, escaped quotes, implicit concatenation
# with a comment between its parts, f-strings, a backslash continuation,
# docstrings of nested and compound-statement defs.
_TRICKY = '\n'.join([
    r'"""Module doc. It has a # sign and a \""" quote."""',
    r"""x = 'a # b' "c 'd' # e" + f"{1 + 1:#x} # f"  # First comment block.""",
    '# Still the first block.',
    'y = ("""multi',
    '# not a comment',
    'line""" # Second block.',
    '     "z")  # Third block, in a parenthesis.',
    '',
    'if x:',
    '  class A:',
    '    """Class doc in an if. It is nested."""',
    r"    def f(self, s='\\'):  # Fourth block.",
    r"      '''Method doc with an escaped \''' quote.",
    "      # Not a comment either.'''",
    '      return s + \\',
    "          '#'",
    'try:',
    '  pass',
    'except ValueError:',
    '  async def g():',
    '    """Doc of a def in a handler."""',
    '# Last block',
    ''])


def test_prose_blocks_equal_the_ast_walk_and_tokenize_definition():
  """ProseBlocks (which skips expressions and scans comments with a regex)
  gives the docstrings of ast.walk's nodes and the tokenize COMMENT runs."""
  want = [ast.get_docstring(n) for n in ast.walk(ast.parse(_TRICKY))
          if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                            ast.AsyncFunctionDef))]
  want = [d for d in want if d]
  runs = []
  for tok in tokenize.generate_tokens(io.StringIO(_TRICKY).readline):
    if tok.type == tokenize.COMMENT:
      text = tok.string.lstrip('#').strip()
      if runs and runs[-1][0] == tok.start[0] - 1:
        runs[-1] = (tok.start[0], runs[-1][1] + '\n' + text)
      else:
        runs.append((tok.start[0], text))
  want += [text for _, text in runs]
  assert len(want) == 8  # 4 docstrings, 4 comment blocks.
  assert lm_prepare.ProseBlocks(_TRICKY) == want


def test_sentences_split_dedup_and_byte_identical_rerun(tmp_path):
  root = _Root(tmp_path)
  data, words, stats = lm_prepare.Build(root, vocab_size=50)
  lines = [ln for s in lm_prepare.SPLITS for ln in data[s]]
  assert lines.count('the frobnicator module .') == 1  # Deduplicated.
  assert 'compute the answer to everything .' in lines
  assert 'return the frobnicated value of x .' in lines
  assert not any('>>>' in ln or 'skipped' in ln for ln in lines)
  # Shared sentences appear once (deduplicated across modules).
  assert lines.count('it is forty two , as everybody knows .') == 1
  # By module: a module's own sentence lands in its module's split only.
  for i in range(12):
    own = f'it frobnicates widgets number {i} quickly .'
    split = lm_prepare.SplitOf(os.path.join(f'pkg{i % 3}', f'mod{i}.py'))
    assert [s for s in lm_prepare.SPLITS if own in data[s]] == [split]
  assert stats['vocab_size'] == 4 + len(words)
  a, b = tmp_path / 'a', tmp_path / 'b'
  for out in (a, b):
    lm_prepare.Write(str(out), data, words, stats)
  for name in ('train.txt', 'dev.txt', 'test.txt', 'vocab.txt',
               'manifest.json'):
    assert (a / name).read_bytes() == (b / name).read_bytes()
  vocab = (a / 'vocab.txt').read_text().splitlines()
  assert vocab[:4] == ['<pad>', '<s>', '</s>', '<unk>']
  with pytest.raises(lm_prepare.LmCorpusError, match=(
      r'^--out .*/a exists and is not empty; pass a new or empty '
      r'directory$')):
    lm_prepare.Write(str(a), data, words, stats)


def test_source_root_skips_and_counts_files_no_parser_survives(
    tmp_path, monkeypatch, capsys):
  """A 100k-term sum (RecursionError in ast), 100k nested minuses
  (MemoryError), a FIFO named b.py (opening it would block forever), a
  file over MAX_SOURCE_BYTES and one not UTF-8: skipped, counted in the
  report and manifest, the corpus that of the other modules."""
  clean = lm_prepare.Build(_Root(tmp_path / 'clean'), vocab_size=50)
  root = _Root(tmp_path)
  bad = os.path.join(root, 'pkg0')
  with open(os.path.join(bad, 'sum.py'), 'w') as f:
    f.write('"""A module docstring of real prose here."""\nx = ' +
            '+'.join(['1'] * 100000) + '\n')
  with open(os.path.join(bad, 'neg.py'), 'w') as f:
    f.write('"""Another docstring of real prose here."""\nx = ' +
            '-' * 100000 + '1\n')
  os.mkfifo(os.path.join(bad, 'b.py'))
  with open(os.path.join(bad, 'big.py'), 'w') as f:
    f.write('"""' + 'The big module is full of prose. ' *
            (lm_sources.MAX_SOURCE_BYTES // 30) + '"""\n')
  with open(os.path.join(bad, 'latin.py'), 'wb') as f:
    f.write(b'"""Ein M\xfcll module docstring here."""\n')
  data, words, stats = lm_prepare.Build(root, vocab_size=50)
  assert stats.pop('skipped_files') == 5
  stats['source_root'] = clean[2]['source_root']
  assert (data, words, stats) == clean
  out = tmp_path / 'out'
  try:
    lm_prepare.FLAGS(['lm_prepare', f'--source_root={root}', f'--out={out}',
                      '--vocab_size=50'])
    lm_prepare.main(['lm_prepare'])
  finally:
    lm_prepare.FLAGS.unparse_flags()
  assert 'skipped 5 .py files: not regular files, over 4,194,304 bytes, ' \
      "unreadable, not UTF-8 or beyond the parser's limits\n" in (
          capsys.readouterr().out)
  assert json.loads((out / 'manifest.json').read_text())[
      'skipped_files'] == 5


def test_input_batches_equal_a_python_tokenisation(tmp_path):
  root = _Root(tmp_path)
  data, words, stats = lm_prepare.Build(root, vocab_size=20)
  out = tmp_path / 'corpus'
  lm_prepare.Write(str(out), data, words, stats)
  vocab = {w: i for i, w in enumerate(
      (out / 'vocab.txt').read_text().splitlines())}
  p = lm_inputs.LmInput.ParamsForCorpus(str(out), 'train').Set(
      eval_batch_size=4, is_inference=True, bucket_upper_bounds=[8, 12])
  got = []
  for b in p.Instantiate().GetDataset():
    assert b.ids.shape[1] == 12
    got.extend(zip(b.ids.numpy(), b.labels.numpy(), b.paddings.numpy()))
  lines = (out / 'train.txt').read_text().splitlines()
  assert len(got) == len(lines)
  for (ids, labels, pad), line in zip(got, lines):
    w = [vocab.get(x, 3) for x in line.split()][:11]
    n = len(w) + 1
    assert list(ids[:n]) == [1] + w and list(labels[:n]) == w + [2]
    assert not pad[:n].any() and pad[n:].all()
  # Training: static bucket shapes, only sentences that fit.
  train = p.Copy().Set(is_inference=False, bucket_batch_limits=[4, 2])
  for b in train.Instantiate().GetDataset().take(6):
    assert tuple(b.ids.shape) in ((4, 8), (2, 12))
    assert np.all(b.paddings.numpy()[:, 0] == 0)


def test_missing_corpus_and_vocabulary_are_one_line(tmp_path):
  p = lm_inputs.LmInput.ParamsForCorpus(str(tmp_path / 'none'), 'train')
  with pytest.raises(base_input.InputError, match=(
      r'^no corpus file matches .*none/train.txt; prepare the corpus with: '
      r'python -m lingshard.data.lm_prepare --out .*none$')):
    p.Instantiate().GetDataset()
  (tmp_path / 'none').mkdir()
  (tmp_path / 'none' / 'train.txt').write_text('a b c\n')
  with pytest.raises(base_input.InputError, match=(
      r'^vocabulary not found: .*none/vocab.txt; prepare the corpus with: '
      r'python -m lingshard.data.lm_prepare --out .*none$')):
    p.Instantiate().GetDataset()
  with pytest.raises(lm_prepare.LmCorpusError, match=(
      r'^--source_root .*: no English prose found in its .py files; pass a '
      r'directory of Python sources$')):
    lm_prepare.Build(str(tmp_path), vocab_size=10)


# ------------------------------------------------ --sources (lm_sources pins)
_NUMPYDOC = '''"""Scale the widgets of a `Frame`.

Parameters
----------
factor : float, optional
    The factor to scale by. It must be a :class:`float` value.

Returns
-------
out : Frame
    The scaled frame, see `the guide <https://example.org>`_.
"""

def scale(factor):
  """Scale every widget.

  Args:
    factor: The factor to scale by; larger values grow them.

  :raises ValueError: If the factor is not a positive number.
  """
'''
# Read for the fingerprint only (skipped) or not read at all: never prose.
_SKIPPED = {
    'tests/test_a.py': '"""Skipped test module prose here."""',
    'core_test.py': '"""Skipped test module prose here."""',
    '_vendor/six.py': '"""Skipped vendored module prose here."""',
    'api_pb2.py': '"""Skipped generated protobuf prose here."""',
    'gen/__init__.py': ('# This file is MACHINE GENERATED! Do not edit.\n'
                        '"""Skipped generated public API prose here."""'),
}


def _Dist(site, name, version, licence_header, n=8):
  """A fake installed distribution: package `name`, dist-info, RECORD."""
  files = {f'{name}/mod{i}.py': _MODULE.replace(
      'widgets', f'widgets number {i} of {name.replace("_", " ")}')
           for i in range(n)}
  files[f'{name}/scale.py'] = _NUMPYDOC
  files.update({f'{name}/{k}': v for k, v in _SKIPPED.items()})
  info = f'{name}-{version}.dist-info'
  files[f'{info}/METADATA'] = (f'Metadata-Version: 2.4\nName: {name}\n'
                               f'Version: {version}\n{licence_header}\n')
  files[f'{info}/licenses/LICENSE'] = f'The licence of {name}.\n'
  for rel, text in files.items():
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_text(text)
  records = sorted(files) + [f'{info}/RECORD', f'../../bin/{name}']
  (site / info / 'RECORD').write_text(''.join(f'{r},,\n' for r in records))


def _Tree(tmp_path):
  """A fake site-packages (two distributions) and stdlib, and their pins."""
  site, stdlib = tmp_path / 'site', tmp_path / 'stdlib'
  _Dist(site, 'fakepkg', '1.0', 'License-Expression: MIT')
  _Dist(site, 'other_pkg', '2.5', 'Classifier: License :: OSI Approved :: '
        'BSD License')
  for i in range(3):
    (stdlib / 'lib').mkdir(parents=True, exist_ok=True)
    (stdlib / 'lib' / f'mod{i}.py').write_text(
        _MODULE.replace('widgets', f'widgets number {i} of the stdlib'))
  (stdlib / 'test').mkdir()
  (stdlib / 'test' / 'mod.py').write_text('"""Skipped test module prose."""')
  (stdlib / 'LICENSE.txt').write_text('The PSF licence.\n')
  where = dict(site_packages=[str(site)], stdlib_root=str(stdlib))
  pins = lm_sources.CurrentPins(['stdlib', 'fakepkg', 'other-pkg'], **where)
  return site, pins, where


def _Files(out):
  return {str(p.relative_to(out)): p.read_bytes()
          for p in sorted(out.rglob('*')) if p.is_file()}


def test_sources_byte_identical_rerun_attribution_and_skips(tmp_path):
  _, pins, where = _Tree(tmp_path)
  assert [p[:3] for p in pins] == [
      ('stdlib', platform.python_version(), 'PSF-2.0'),
      ('fakepkg', '1.0', 'MIT'), ('other-pkg', '2.5', 'BSD')]
  outs = [tmp_path / 'a', tmp_path / 'b']
  for out in outs:  # Two whole builds, from the pins on.
    sources = lm_sources.Resolve(lm_sources.Select('large', pins), **where)
    data, words, stats = lm_prepare.BuildSources(sources, vocab_size=40)
    lm_prepare.Write(str(out), data, words, stats, sources)
  a, b = (_Files(out) for out in outs)
  assert a == b
  assert sorted(a) == [
      'ATTRIBUTION.txt', 'dev.txt', 'licenses/fakepkg-LICENSE',
      'licenses/other-pkg-LICENSE', 'licenses/stdlib-LICENSE.txt',
      'manifest.json', 'test.txt', 'train.txt', 'vocab.txt']
  assert a['ATTRIBUTION.txt'].decode().splitlines()[3:] == [
      f'- stdlib (Python {pins[0].version}), licence: PSF-2.0, sources '
      f'sha256: {pins[0].sha256}', '    licenses/stdlib-LICENSE.txt',
      f'- fakepkg 1.0, licence: MIT, sources sha256: {pins[1].sha256}',
      '    licenses/fakepkg-LICENSE',
      f'- other-pkg 2.5, licence: BSD, sources sha256: {pins[2].sha256}',
      '    licenses/other-pkg-LICENSE']
  manifest = json.loads(a['manifest.json'])
  assert [(s['name'], s['version'], s['licence'], s['sha256'], s['modules'])
          for s in manifest['sources']] == [
              (p.name, p.version, p.licence, p.sha256, n)
              for p, n in zip(pins, (3, 9, 9))]
  assert sum(s['words'] for s in manifest['sources']) == sum(
      manifest['splits'][s]['words'] for s in lm_prepare.SPLITS)
  lines = [ln for s in lm_prepare.SPLITS for ln in data[s]]
  assert not any('skipped' in ln or '`' in ln for ln in lines)
  # Docstring markup stripped: numpydoc / Google parameter descriptions.
  for sentence in ('scale the widgets of a frame .',
                   'the factor to scale by .', 'it must be a float value .',
                   'the scaled frame , see the guide .',
                   'the factor to scale by ; larger values grow them .',
                   'if the factor is not a positive number .'):
    assert sentence in lines


def test_sources_split_by_package_and_module(tmp_path):
  _, pins, where = _Tree(tmp_path)
  sources = lm_sources.Resolve(pins, **where)
  data, _, _ = lm_prepare.BuildSources(sources, vocab_size=40)
  splits = {}
  for name, top, n in (('stdlib', 'lib', 3), ('fakepkg', 'fakepkg', 8),
                       ('other-pkg', 'other_pkg', 8)):
    owner = 'the stdlib' if name == 'stdlib' else top.replace('_', ' ')
    for i in range(n):
      rel = f'{top}/mod{i}.py'
      own = f'it frobnicates widgets number {i} of {owner} quickly .'
      splits[name, rel] = lm_prepare.SplitOf(f'{name}/{rel}')
      assert [s for s in lm_prepare.SPLITS if own in data[s]] == [
          splits[name, rel]]
  # The key is `<name>/<path>`, not the path alone: with these 19 modules,
  # some land in another split than their bare path would.
  assert any(s != lm_prepare.SplitOf(rel) for (_, rel), s in splits.items())


def test_sources_fingerprint_is_the_documented_digest(tmp_path):
  site, pins, _ = _Tree(tmp_path)
  lines = ''.join(
      f'{rel}\t{hashlib.sha256((site / rel).read_bytes()).hexdigest()}\n'
      for rel in sorted(['fakepkg/gen/__init__.py', 'fakepkg/scale.py'] +
                        [f'fakepkg/mod{i}.py' for i in range(8)]))
  assert pins[1].sha256 == hashlib.sha256(lines.encode()).hexdigest()


def test_sources_errors_are_one_line(tmp_path):
  site, pins, where = _Tree(tmp_path)
  stdlib, fake, other = pins
  hint = ('or re-pin (python -m lingshard.data.lm_sources) in '
          'lingshard/data/lm_sources.py')
  cases = [
      (fake._replace(name='nopkg'),
       f'pinned source nopkg==1.0 is not installed in {site}; install it or '
       'leave it out of --sources'),
      (fake._replace(version='1.1'),
       f'pinned source fakepkg==1.1 is not installed (found 1.0 in {site}); '
       f'install fakepkg==1.1, {hint}'),
      (stdlib._replace(version='2.7.18'),
       'pinned source stdlib==2.7.18 is not installed (found '
       f'{stdlib.version} in {where["stdlib_root"]}); run Python 2.7.18, '
       f'{hint}'),
      (other._replace(licence='MIT'),
       "pinned source other-pkg==2.5: its licence changed (metadata 'BSD' != "
       f"pinned 'MIT'); check it, {hint}"),
      (other._replace(licence='GPL-3.0'),
       "pinned source other-pkg==2.5: licence 'GPL-3.0' is not one of the "
       'permissive licences ' + ', '.join(sorted(lm_sources.PERMISSIVE))),
  ]
  (site / 'fakepkg' / 'mod3.py').write_text('"""Changed."""')
  got = lm_sources.Fingerprint(
      [(rel, str(site / rel)) for rel in sorted(
          ['fakepkg/gen/__init__.py', 'fakepkg/scale.py'] +
          [f'fakepkg/mod{i}.py' for i in range(8)])])
  cases.append((fake, 'pinned source fakepkg==1.0: its sources changed '
                f'(fingerprint {got[:12]}… != pinned {fake.sha256[:12]}…); '
                f'reinstall it, {hint}'))
  for pin, message in cases:
    with pytest.raises(lm_sources.SourceError) as e:
      lm_sources.Resolve([pin], **where)
    assert str(e.value) == message
  with pytest.raises(lm_sources.SourceError) as e:
    lm_sources.Select('fakepkg, Other_Pkg,nope', pins)
  assert str(e.value) == ("--sources: unknown source 'nope'; choose from "
                          'large, stdlib, fakepkg, other-pkg')
  assert lm_sources.Select('Other_Pkg,stdlib', pins) == (stdlib, other)


def test_sources_cli_exits_with_one_line(tmp_path, monkeypatch):
  site, pins, _ = _Tree(tmp_path)
  monkeypatch.setattr(lm_sources, 'PINS', (pins[1]._replace(version='1.1'),))
  monkeypatch.setattr(lm_sources, 'DefaultSitePackages', lambda: [str(site)])
  out = tmp_path / 'out'
  try:
    lm_prepare.FLAGS(['lm_prepare', '--sources=large', f'--out={out}'])
    with pytest.raises(SystemExit) as e:
      lm_prepare.main(['lm_prepare'])
  finally:
    lm_prepare.FLAGS.unparse_flags()
  assert e.value.code == (
      'lm_prepare: error: pinned source fakepkg==1.1 is not installed (found '
      f'1.0 in {site}); install fakepkg==1.1, or re-pin (python -m '
      'lingshard.data.lm_sources) in lingshard/data/lm_sources.py')
  assert not out.exists()


# ------------------------------------- --sources: pinned wheels (lm_wheel_sources)
_WHEEL = 'polyprose-1.0-py3-none-any.whl'


def _WheelMembers(licence='License-Expression: MIT'):
  """A toy wheel's members: prose modules, skipped ones, dist-info."""
  files = {f'polyprose/mod{i}.py': _MODULE.replace(
      'widgets', f'widgets number {i} of polyprose') for i in range(8)}
  files.update({f'polyprose/{k}': v for k, v in _SKIPPED.items()})
  files.update({
      # Migration and locale code is read; generated migrations and
      # per-language locale data are not.
      'polyprose/db/migrations/executor.py':
          '"""Apply the migrations of polyprose in dependency order."""',
      'polyprose/locale/__init__.py':
          '# Metadata about the languages polyprose can translate to.',
      'polyprose/app/migrations/0001_initial.py':
          '# Skipped generated migration prose here.',
      'polyprose/migrations/versions/20200101_add_table.py':
          '"""Skipped generated alembic revision prose here."""',
      'polyprose/locale/fr/formats.py': '# Skipped locale data prose here.',
      'polyprose/templates/page.html': 'Skipped template prose here.',
      'polyprose-1.0.dist-info/METADATA':
          f'Metadata-Version: 2.4\nName: polyprose\nVersion: 1.0\n{licence}\n',
      'polyprose-1.0.dist-info/licenses/LICENSE': 'The polyprose licence.\n',
  })
  return {k: v.encode() for k, v in files.items()}


def _WheelSetup(tmp_path, monkeypatch, **pin):
  """Fake installed sources (fakepkg, other-pkg) as lm_sources.PINS and the
  toy wheel, cached, as $LINGSHARD_WHEEL_PINS; returns (cache, wheel pin)."""
  site, pins, _ = _Tree(tmp_path)
  monkeypatch.setattr(lm_sources, 'PINS', pins[1:])
  monkeypatch.setattr(lm_sources, 'DefaultSitePackages', lambda: [str(site)])
  cache = tmp_path / 'cache'
  cache.mkdir()
  wheel = _Wheel(cache / _WHEEL, _WheelMembers())
  pin = dict(dict(name='polyprose', version='1.0', filename=_WHEEL,
                  sha256=wheels.Sha256(wheel), licence='MIT'), **pin)
  (tmp_path / 'pins.json').write_text(json.dumps([pin]))
  monkeypatch.setenv(wheels.PINS_ENV, str(tmp_path / 'pins.json'))
  return cache, wheels.WheelPin(**pin)


def _Cli(cache, out, *extra):
  """lm_prepare --sources=large --offline; its exit message (None: ok)."""
  try:
    lm_prepare.FLAGS(['lm_prepare', '--sources=large', '--offline',
                      f'--wheel_cache={cache}', f'--out={out}',
                      '--vocab_size=40', *extra])
    lm_prepare.main(['lm_prepare'])
  except SystemExit as e:
    return e.code
  finally:
    lm_prepare.FLAGS.unparse_flags()
  return None


def test_wheel_source_prose_skips_attribution_and_rerun(tmp_path, monkeypatch):
  cache, pin = _WheelSetup(tmp_path, monkeypatch)
  outs = [tmp_path / 'a', tmp_path / 'b']
  for out in outs:  # Two whole builds, from the pins on.
    assert _Cli(cache, out) is None
  a, b = (_Files(out) for out in outs)
  assert a == b
  assert 'licenses/polyprose-LICENSE' in a
  assert a['ATTRIBUTION.txt'].decode().splitlines()[-2:] == [
      f'- polyprose 1.0 ({_WHEEL}), licence: MIT, wheel sha256: '
      f'{pin.sha256}', '    licenses/polyprose-LICENSE']
  manifest = json.loads(a['manifest.json'])
  assert [s['name'] for s in manifest['sources']] == [
      'fakepkg', 'other-pkg', 'polyprose']  # Pin order: installed, wheels.
  # Its own sentences only (the shared ones are fakepkg's): one (9 words)
  # of each mod*.py, executor.py and locale/__init__.py.
  assert manifest['sources'][-1] == dict(pin._asdict(), modules=10,
                                         sentences=10, words=90)
  lines = [ln for s in lm_prepare.SPLITS
           for ln in a[f'{s}.txt'].decode().splitlines()]
  assert not any('skipped' in ln for ln in lines)
  assert lines.count('the frobnicator module .') == 1  # Deduplicated.
  for sentence in ('apply the migrations of polyprose in dependency order .',
                   'metadata about the languages polyprose can translate to .'):
    assert sentence in lines
  for i in range(8):  # Split by `<source name>/<member path>`.
    own = f'it frobnicates widgets number {i} of polyprose quickly .'
    split = lm_prepare.SplitOf(f'polyprose/polyprose/mod{i}.py')
    assert own in a[f'{split}.txt'].decode().splitlines()


def test_wheel_source_errors_are_one_line(tmp_path, monkeypatch, capsys):
  cache, pin = _WheelSetup(tmp_path, monkeypatch)
  out = tmp_path / 'out'
  empty = tmp_path / 'empty'
  assert _Cli(empty, out) == (
      f'lm_prepare: error: wheels not in {empty} and downloads are off: '
      f"['{_WHEEL}']")
  (cache / _WHEEL).write_bytes(b'changed')
  digest = hashlib.sha256(b'changed').hexdigest()
  assert _Cli(cache, out) == (
      f'lm_prepare: error: {cache / _WHEEL}: sha256 {digest} does not match '
      f'the pin {pin.sha256}; delete the file to re-download it')
  cache, pin = _WheelSetup(tmp_path / 'l', monkeypatch, licence='Apache-2.0')
  assert _Cli(cache, out) == (
      f'lm_prepare: error: pinned wheel {_WHEEL}: its METADATA licence '
      "'MIT' does not match the pinned 'Apache-2.0'; check it, or fix the pin "
      '(lingshard/data/wheels.py or $LINGSHARD_WHEEL_PINS)')
  cache, pin = _WheelSetup(tmp_path / 'g', monkeypatch, licence='GPL-3.0')
  assert _Cli(cache, out) == (
      f"lm_prepare: error: pinned wheel {_WHEEL}: licence 'GPL-3.0' is not "
      'one of the permissive licences ' +
      ', '.join(sorted(lm_sources.PERMISSIVE)))
  cache, pin = _WheelSetup(tmp_path / 'n', monkeypatch, name='FakePkg')
  assert _Cli(cache, out) == (
      'lm_prepare: error: two pinned sources are named fakepkg '
      f'(lingshard/data/lm_sources.py PINS and the wheel {_WHEEL}); read a '
      'package once: leave one of them out')
  assert not out.exists() and capsys.readouterr().err == ''


def test_wheel_licence_family_agrees_with_the_pin(tmp_path):
  wheel = _Wheel(tmp_path / _WHEEL, _WheelMembers('License: BSD'))
  pin = wheels.WheelPin('polyprose', '1.0', _WHEEL, wheels.Sha256(wheel),
                        'BSD-3-Clause')
  source = lm_wheel_sources.WheelSource(pin, wheel)
  assert source.archive == wheel and source.licence_files == (
      ('LICENSE', b'The polyprose licence.\n'),)
  with pytest.raises(lm_sources.SourceError, match="METADATA licence 'BSD'"):
    lm_wheel_sources.WheelSource(pin._replace(licence='MIT'), wheel)


def test_builtin_wheel_sources(monkeypatch):
  monkeypatch.delenv(wheels.PINS_ENV, raising=False)
  builtin = lm_wheel_sources.BUILTIN
  assert builtin == tuple(p for p in wheels.LARGE_PINS if p in builtin)
  assert [p.name for p in builtin[:4]] == [p.name for p in wheels.PINS]
  assert len(builtin) == 12 and not any('jupyterlab' in p.name
                                        for p in builtin)
  pins = lm_wheel_sources.AllPins()  # No name is also an installed pin.
  assert pins == lm_sources.PINS + builtin
  assert lm_wheel_sources.Select('large') == pins
  assert lm_wheel_sources.Select('Django,stdlib') == (lm_sources.PINS[0],
                                                      wheels.PINS[0])


@pytest.mark.parametrize('path, read', [
    ('django/db/migrations/executor.py', True),
    ('django/db/migrations/operations/models.py', True),
    ('django/contrib/auth/migrations/0001_initial.py', False),
    ('django/contrib/auth/migrations/__init__.py', True),
    ('indico/migrations/versions/20170101_0000_add_table.py', False),
    ('indico/migrations/env.py', True),
    ('django/conf/locale/__init__.py', True),
    ('django/conf/locale/fr/formats.py', False),
    ('django/conf/locale/en_GB/__init__.py', False),
    ('sphinx/locale/__init__.py', True),
])
def test_generated_migrations_and_locale_data_are_skipped(path, read):
  assert lm_sources.IsPackageModule(path) is read
