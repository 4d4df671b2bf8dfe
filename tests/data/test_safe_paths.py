"""Language codes and package names from data never make a path leave its
directory: readers reject them, decode refuses to write them."""

import collections
import os
import re
import zipfile

import pytest

from lingshard.data import corpus_io
from lingshard.data import inputs
from lingshard.data import po_extract
from lingshard.data import prepare
from lingshard.models import mt_decoder

RULE = "letters, digits, '_', '@', '.', '-' only, no '..'"


def _AllFiles(root):
  return sorted(os.path.relpath(os.path.join(d, f), root)
                for d, _, files in os.walk(root) for f in files)


def _RewrittenWheel(src, dst, replace):
  """Copies a zip, replacing the content of the members named in `replace`
  and adding the ones it does not have."""
  with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, 'w') as zout:
    for name in zin.namelist():
      zout.writestr(name, replace.pop(name, None) or zin.read(name))
    for name, data in replace.items():
      zout.writestr(name, data)
  return dst


@pytest.mark.parametrize('lang', ['../../X', '..', 'de/x', 'de x', 'de\x00'])
def test_tsv_language_code_that_is_not_a_file_name_is_an_error(tmp_path,
                                                                lang):
  path = tmp_path / 'train.tsv'
  path.write_text(f'de\tJa\tYes\n{lang}\tNein\tNo\n', encoding='utf-8')
  with pytest.raises(corpus_io.CorpusError) as e:
    corpus_io.ReadTsv(str(path))
  assert str(e.value) == (f'{path}:2: bad language code {lang!r}: use '
                          f'{RULE}')


def test_input_rejects_escaping_language_before_any_batch(prepared_dir,
                                                          tmp_path):
  path = tmp_path / 'dev.tsv'
  path.write_text('../../X\tJa\tYes\n', encoding='utf-8')
  p = inputs.MtInput.ParamsForCorpus(prepared_dir, 'dev_seen_en')
  p.file_pattern = str(path)
  with pytest.raises(corpus_io.CorpusError,
                     match=re.escape(f"{path}:1: bad language code "
                                     f"'../../X': use {RULE}")):
    p.Instantiate().GetDataset()


def test_wheel_whose_name_escapes_out_is_an_error_and_writes_nothing_outside(
    fixture_wheel, tmp_path, capsys):
  meta = 'polyui-1.0.dist-info/METADATA'
  wheel = _RewrittenWheel(
      fixture_wheel, str(tmp_path / 'evil-1.0-py3-none-any.whl'),
      {meta: b'Metadata-Version: 2.1\nName: ../../X\nVersion: 1.0\n'
             b'License-Expression: MIT\n'})
  out = tmp_path / 'a' / 'b' / 'out'
  before = _AllFiles(tmp_path)
  message = (f"{wheel}:{meta}: bad package Name '../../X': use {RULE}")
  with pytest.raises(corpus_io.CorpusError) as e:
    prepare.Prepare([wheel], str(out), max_chars=150)
  assert str(e.value) == message
  assert prepare.main(['--wheels', wheel, '--out', str(out), '--no_vocab',
                       '--max_chars', '150']) == 1
  assert capsys.readouterr().err == f'error: {message}\n'
  assert [f for f in _AllFiles(tmp_path)
          if not f.startswith(os.path.join('a', 'b', 'out') + os.sep)
          ] == before


def test_catalog_directory_that_is_not_a_language_code_is_an_error(tmp_path):
  member = 'pkg/locale/../LC_MESSAGES/django.po'
  wheel = str(tmp_path / 'dots-1.0-py3-none-any.whl')
  with zipfile.ZipFile(wheel, 'w') as zf:
    zf.writestr(member, 'msgid "Save"\nmsgstr "Speichern"\n')
  with pytest.raises(corpus_io.CorpusError) as e:
    po_extract.ExtractWheel(wheel, 100, collections.Counter())
  assert str(e.value) == (f"{wheel}:{member}: bad language code '..' in the "
                          f"catalog path: use {RULE}")


def test_decode_outputs_never_leave_their_directory(tmp_path):
  out = tmp_path / 'logdir' / 'decode_dev'
  records = [mt_decoder.Record('de', 'Ja', 'Yes', 'Yes'),
             mt_decoder.Record('../../X', 'a', 'b', 'c')]
  scores = mt_decoder.ScoreByLanguage(records)
  with pytest.raises(ValueError) as e:
    mt_decoder.WriteOutputs(str(out), records, scores)
  assert str(e.value) == (f"cannot write decode output for language "
                          f"'../../X' in {out}: language codes must use "
                          f"{RULE}")
  assert _AllFiles(tmp_path) == []
  mt_decoder.WriteOutputs(str(out), records[:1], scores)
  assert _AllFiles(tmp_path) == [
      os.path.join('logdir', 'decode_dev', f) for f in
      ('de.hyp.txt', 'de.ref.txt', 'de.src.txt', 'scores.json',
       'scores.txt')]
