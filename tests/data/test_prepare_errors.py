"""Preparation errors name the wheel file and member in one line, and
catalogs are parsed from their bytes only."""

import collections
import errno
import os
import re
import zipfile

import pytest

from lingshard.data import corpus_io
from lingshard.data import po_extract
from lingshard.data import prepare

MEMBER = 'pkg/locale/de/LC_MESSAGES/django.po'
HEADER = ('msgid ""\nmsgstr ""\n'
          '"Content-Type: text/plain; charset=UTF-8\\n"\n'
          '"Plural-Forms: {plural}\\n"\n\n')


def _Wheel(path, members):
  with zipfile.ZipFile(path, 'w') as zf:
    for name, data in members.items():
      zf.writestr(name, data)
  return str(path)


def _MainError(wheel, tmp_path, capsys):
  """(exit code, stderr) of `prepare --wheels wheel`."""
  code = prepare.main(['--wheels', wheel, '--out', str(tmp_path / 'out'),
                       '--no_vocab'])
  return code, capsys.readouterr().err


def test_malformed_catalog_names_wheel_and_member(tmp_path, capsys):
  wheel = _Wheel(tmp_path / 'bad-1.0-py3-none-any.whl', {
      MEMBER: 'msgid "Save"\nmsgstr "Speichern"\nthis is not po\n'})
  message = (f'{wheel}:{MEMBER}: not a valid .po catalog: Syntax error in '
             f'po file (line 3)')
  with pytest.raises(corpus_io.CorpusError) as e:
    po_extract.ExtractWheel(wheel, 100, collections.Counter())
  assert str(e.value) == message
  assert _MainError(wheel, tmp_path, capsys) == (1, f'error: {message}\n')


def test_non_zip_or_missing_wheel_is_a_one_line_error(tmp_path, capsys):
  not_zip = tmp_path / 'text-1.0-py3-none-any.whl'
  not_zip.write_bytes(b'this is not a zip file\n')
  message = (f'{not_zip}: not a wheel (zip) file (File is not a zip file); '
             f'pass .whl files to --wheels')
  with pytest.raises(corpus_io.CorpusError, match=re.escape(message)):
    prepare.Prepare([str(not_zip)], str(tmp_path / 'o1'))
  assert _MainError(str(not_zip), tmp_path, capsys) == (
      1, f'error: {message}\n')
  missing = str(tmp_path / 'missing-1.0-py3-none-any.whl')
  message = (f'wheel file not found: {missing}; pass existing .whl files to '
             f'--wheels')
  with pytest.raises(corpus_io.CorpusError, match=re.escape(message)):
    po_extract.ExtractWheel(missing, 100, collections.Counter())
  assert _MainError(missing, tmp_path, capsys) == (1, f'error: {message}\n')


def test_undecodable_catalog_is_a_corpus_error(tmp_path):
  wheel = _Wheel(tmp_path / 'enc-1.0-py3-none-any.whl', {
      MEMBER: b'msgid "Save"\nmsgstr "\xff"\n'})
  with pytest.raises(corpus_io.CorpusError,
                     match=re.escape(f"{wheel}:{MEMBER}: cannot decode as "
                                     f"utf-8: 'utf-8' codec can't decode")):
    po_extract.ExtractWheel(wheel, 100, collections.Counter())


def test_deeply_nested_plural_forms_drop_plurals_without_recursion_error(
    tmp_path):
  plural = 'nplurals=2; plural=' + '(' * 5000 + 'n != 1' + ')' * 5000 + ';'
  catalog = (HEADER.format(plural=plural) +
             'msgid "Save"\nmsgstr "Speichern"\n\n'
             'msgid "%(n)d file"\nmsgid_plural "%(n)d files"\n'
             'msgstr[0] "%(n)d Datei"\nmsgstr[1] "%(n)d Dateien"\n')
  wheel = _Wheel(tmp_path / 'deep-1.0-py3-none-any.whl', {MEMBER: catalog})
  counts = collections.Counter()
  pairs = po_extract.ExtractWheel(wheel, 100, counts)
  assert pairs == [po_extract.Pair('de', 'Speichern', 'Save')]
  assert counts[po_extract.DROP_PLURAL_UNPARSED] == 1


def test_catalog_whose_content_is_a_local_path_is_never_read(tmp_path,
                                                             capsys):
  secret = tmp_path / 'secret.po'
  secret.write_text(HEADER.format(plural='nplurals=2; plural=(n != 1);') +
                    'msgid "Top secret"\nmsgstr "Streng geheim"\n',
                    encoding='utf-8')
  wheel = _Wheel(tmp_path / 'path-1.0-py3-none-any.whl',
                 {MEMBER: str(secret)})
  message = (f'{wheel}:{MEMBER}: not a valid .po catalog: Syntax error in '
             f'po file (line 1)')
  with pytest.raises(corpus_io.CorpusError) as e:
    po_extract.ExtractWheel(wheel, 100, collections.Counter())
  assert str(e.value) == message
  assert _MainError(wheel, tmp_path, capsys) == (1, f'error: {message}\n')
  assert 'geheim' not in str(e.value)


def _Tree(root):
  return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
          for p in sorted(root.rglob('*'))}


def test_out_is_a_user_directory_or_file_or_unwritable(fixture_wheel,
                                                       tmp_path, capsys):
  """prepare refuses a non-empty --out as lm_prepare does (it replaced a
  user's train.tsv), and a file or unwritable --out is one line."""
  mine = tmp_path / 'mine'
  mine.mkdir()
  (mine / 'train.tsv').write_text('de\tmeine\tmine\n')
  (tmp_path / 'file').write_text('x')
  before = _Tree(tmp_path)
  cases = [
      (mine, f'--out {mine} exists and is not empty; pass a new or empty '
       'directory'),
      (tmp_path / 'file', f'--out {tmp_path / "file"} exists and is not a '
       'directory; pass a new or empty directory'),
      ('/proc/x', 'cannot write --out /proc/x: No such file or directory; '
       'nothing was written there'),
  ]
  for out, message in cases:
    with pytest.raises(corpus_io.CorpusError) as e:
      prepare.Prepare([fixture_wheel], str(out), max_chars=150)
    assert str(e.value) == message
    assert prepare.main(['--wheels', fixture_wheel, '--out', str(out),
                         '--no_vocab']) == 1
    assert capsys.readouterr().err == f'error: {message}\n'
  assert _Tree(tmp_path) == before


def test_failed_write_leaves_out_as_it_was(fixture_wheel, tmp_path,
                                           monkeypatch):
  """A disk that fills while the TSV files are written (ENOSPC from the
  writer): one line, the empty --out stays empty, no temporary left."""
  out = tmp_path / 'out'
  out.mkdir()
  real = corpus_io.WriteTsv
  written = []

  def FullAfterOne(path, rows):
    if written:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    written.append(path)
    return real(path, rows)

  monkeypatch.setattr(corpus_io, 'WriteTsv', FullAfterOne)
  with pytest.raises(corpus_io.CorpusError) as e:
    prepare.Prepare([fixture_wheel], str(out), max_chars=150)
  assert str(e.value) == (f'cannot write --out {out}: No space left on '
                          'device; nothing was written there')
  assert len(written) == 1
  assert _Tree(tmp_path) == {'out': None}
