"""Preparation errors name the wheel file and member in one line, and
catalogs are parsed from their bytes only."""

import collections
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
