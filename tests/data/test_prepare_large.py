"""The large corpus's extraction (prepare --corpus=large) on a toy wheel:
compiled .mo catalogs without a .po, `translations/` catalogs and one
code per language; its pins; byte-identical re-runs (offline)."""

import collections
import json
import os
import zipfile

import polib
import pytest

from lingshard.data import corpus_io
from lingshard.data import lang_codes
from lingshard.data import po_extract
from lingshard.data import prepare
from lingshard.data import wheels

from .test_prepare import _Files

PLURAL_FR = 'nplurals=2; plural=(n > 1);'
LICENSE = 'MIT License\n\nCopyright (c) toy contributors.\n'
METADATA = ('Metadata-Version: 2.1\nName: polymo\nVersion: 1.0\n'
            'License-Expression: MIT\n\nA toy wheel of compiled catalogs.\n')


def _Mo(entries, plural='nplurals=2; plural=(n != 1);', charset='UTF-8'):
  """The .mo bytes of [(msgid, msgstr or {index: form}, msgid_plural,
  msgctxt)]."""
  po = polib.POFile(encoding=charset.lower())
  po.metadata = {'Content-Type': f'text/plain; charset={charset}',
                 'Plural-Forms': plural}
  for msgid, msgstr, plural_id, ctxt in entries:
    if plural_id:
      po.append(polib.POEntry(msgid=msgid, msgid_plural=plural_id,
                              msgstr_plural=msgstr, msgctxt=ctxt))
    else:
      po.append(polib.POEntry(msgid=msgid, msgstr=msgstr, msgctxt=ctxt))
  return po.to_binary()


def _Po(msgid, msgstr):
  return ('msgid ""\nmsgstr ""\n'
          '"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
          f'msgid "{msgid}"\nmsgstr "{msgstr}"\n').encode()


MEMBERS = {
    # Only compiled: read with read_mo, as fr (fr_FR names French).
    'polymo/locale/fr_FR/LC_MESSAGES/app.mo': _Mo(
        [('Save', 'Enregistrer', None, None),
         ('%(n)d file', {0: '%(n)d fichier', 1: '%(n)d fichiers'},
          '%(n)d files', None),
         ('May', 'mai', None, 'month')], plural=PLURAL_FR),
    # A .po and its .mo: the .po is read, never the .mo.
    'polymo/locale/fr/LC_MESSAGES/app.po': _Po('Cancel', 'Annuler'),
    'polymo/locale/fr/LC_MESSAGES/app.mo': _Mo(
        [('Cancel', 'Not this one', None, None)], plural=PLURAL_FR),
    # Indico's layout; zh_CN and zh_Hans are one language.
    'polymo/translations/zh_CN/LC_MESSAGES/messages.po': _Po('Save', '保存'),
    'polymo/locale/zh_Hans/LC_MESSAGES/app.mo': _Mo(
        [('Cancel', '取消', None, None)], plural='nplurals=1; plural=0;'),
    'polymo/locale/sr@latin/LC_MESSAGES/app.po': _Po('Save', 'Sačuvaj'),
    'polymo/locale/de/LC_MESSAGES/app.mo': _Mo(
        [('Delete', 'Löschen', None, None)], charset='ISO-8859-1'),
    'polymo/locale/en_GB/LC_MESSAGES/app.mo': _Mo(
        [('Color', 'Colour', None, None)]),
    'polymo-1.0.dist-info/METADATA': METADATA.encode('utf-8'),
    'polymo-1.0.dist-info/licenses/LICENSE': LICENSE.encode('utf-8'),
}
WHEEL = 'polymo-1.0-py3-none-any.whl'


def _Wheel(path, members=None):
  """A zip of `members` with fixed timestamps and order (same bytes)."""
  with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as zf:
    for name, data in sorted((members or MEMBERS).items()):
      info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      zf.writestr(info, data)
  return str(path)


@pytest.mark.parametrize('code, canonical', [
    ('fr', 'fr'), ('fr_FR', 'fr'), ('pt_PT', 'pt'), ('pt_BR', 'pt_BR'),
    ('es_419', 'es_419'), ('de_CH', 'de_CH'), ('ja_JP', 'ja'),
    ('uk_UA', 'uk'), ('ar_SA', 'ar'), ('ar_DZ', 'ar_DZ'), ('bn_IN', 'bn_IN'),
    ('no', 'nb'), ('no_NO', 'nb'), ('nb_NO', 'nb'), ('zh_CN', 'zh_Hans'),
    ('zh-Hans', 'zh_Hans'), ('zh_Hans_CN', 'zh_Hans'), ('zh_TW', 'zh_Hant'),
    ('zh_Hant', 'zh_Hant'), ('zh_HK', 'zh_HK'), ('zh', 'zh'),
    ('sr@latin', 'sr_Latn'), ('sr_Latn', 'sr_Latn'),
    ('sr_Latn_BA', 'sr_Latn_BA'), ('ca@valencia', 'ca@valencia'),
    ('ca_ES', 'ca'), ('fil', 'fil'), ('ku_IQ', 'ku_IQ'),
    ('weird_code_x', 'weird_code_x')])
def test_canonical_lang(code, canonical):
  assert lang_codes.CanonicalLang(code) == canonical


def test_small_corpus_is_the_default_and_untouched():
  assert prepare.CORPORA['small'] == (wheels.PINS, prepare.DEFAULT_OUT,
                                      False, False)
  large = prepare.CORPORA['large']
  assert large.pins[:len(wheels.PINS)] == wheels.PINS
  assert (large.out, large.read_mo, large.canonical_langs) == (
      prepare.LARGE_OUT, True, True)


def test_large_pins_are_distinct_and_permissive():
  pins = wheels.LARGE_PINS
  assert len({p.filename for p in pins}) == len({p.name for p in pins}) == (
      len(pins))
  assert {p.licence for p in pins} <= {'BSD-2-Clause', 'BSD-3-Clause', 'MIT',
                                       'Apache-2.0'}
  assert {'horizon', 'indico', 'django-oscar', 'trac',
          'jupyterlab-language-pack-fr-fr'} <= {p.name for p in pins}


def test_mo_catalogs_are_read_only_when_asked(tmp_path):
  wheel = _Wheel(tmp_path / WHEEL)
  counts = collections.Counter()
  small = set(po_extract.ExtractWheel(wheel, 100, counts))
  assert small == {('fr', 'Annuler', 'Cancel'), ('zh_CN', '保存', 'Save'),
                   ('sr@latin', 'Sačuvaj', 'Save')}
  assert counts['catalogs'] == 3 and not counts['mo_catalogs']
  counts = collections.Counter()
  large = set(po_extract.ExtractWheel(wheel, 100, counts, read_mo=True,
                                      canonical_langs=True))
  assert large == {
      ('fr', 'Enregistrer', 'Save'), ('fr', '%(n)d fichier', '%(n)d file'),
      ('fr', '%(n)d fichiers', '%(n)d files'), ('fr', 'mai', 'May'),
      ('fr', 'Annuler', 'Cancel'), ('zh_Hans', '保存', 'Save'),
      ('zh_Hans', '取消', 'Cancel'), ('sr_Latn', 'Sačuvaj', 'Save'),
      ('de', 'Löschen', 'Delete')}
  assert (counts['catalogs'], counts['mo_catalogs']) == (6, 3)
  assert counts[po_extract.DROP_ENGLISH_LOCALE] == 1


@pytest.mark.parametrize('data, reason', [
    (b'not a catalog', 'no .mo header'),
    (b'\0' * 32, 'magic number is incorrect'),
    (_Mo([('Save', 'Enregistrer', None, None)])[:40], 'unpack requires'),
    (None, 'no .mo header')])
def test_bad_mo_is_a_one_line_error(tmp_path, data, reason):
  member = 'pkg/locale/fr/LC_MESSAGES/app.mo'
  if data is None:  # The path of a valid .mo file, which is never opened.
    real = tmp_path / 'real.mo'
    real.write_bytes(_Mo([('Save', 'Enregistrer', None, None)]))
    data = str(real).encode('utf-8')
  wheel = _Wheel(tmp_path / WHEEL, {member: data})
  with pytest.raises(corpus_io.CorpusError) as e:
    po_extract.ExtractWheel(wheel, 100, collections.Counter(), read_mo=True)
  message = str(e.value)
  assert message.startswith(f'{wheel}:{member}: not a valid .mo catalog: ')
  assert reason in message and '\n' not in message


def _PinsFile(tmp_path, wheel):
  pin = {'name': 'polymo', 'version': '1.0', 'filename': WHEEL,
         'sha256': wheels.Sha256(wheel), 'licence': 'MIT'}
  path = tmp_path / 'pins.json'
  path.write_text(json.dumps([pin]), encoding='utf-8')
  return str(path)


def test_large_cli_is_byte_for_byte_reproducible(tmp_path, monkeypatch,
                                                 capsys):
  cache = tmp_path / 'cache'
  cache.mkdir()
  wheel = _Wheel(cache / WHEEL)
  monkeypatch.setenv(wheels.PINS_ENV, _PinsFile(tmp_path, wheel))
  outs = [str(tmp_path / name) for name in ('a', 'b')]
  for out in outs:
    assert prepare.main([
        '--corpus=large', '--offline', '--wheel_cache', str(cache), '--out',
        out, '--dev_unseen_frac=0', '--test_unseen_frac=0',
        '--dev_seen_frac=0', '--test_seen_frac=0', '--multi_vocab_size=300',
        '--en_vocab_size=60', '--shared_vocab_size=330']) == 0, (
            capsys.readouterr().err)
  first, second = _Files(outs[0]), _Files(outs[1])
  assert 'vocab/spm_shared.model' in first and 'licenses/polymo-LICENSE' in (
      first)
  assert sorted(first) == sorted(second)
  for name in first:
    assert first[name] == second[name], name
  manifest = json.loads(first['manifest.json'])
  assert manifest['settings']['read_mo'] is True
  assert manifest['settings']['canonical_langs'] is True
  assert manifest['languages'] == 4  # de, fr, sr_Latn, zh_Hans.
  assert first['train.tsv'].decode('utf-8').count('\n') == 9


def test_missing_large_wheels_are_named_in_one_line(tmp_path, monkeypatch,
                                                    capsys):
  monkeypatch.delenv(wheels.PINS_ENV, raising=False)
  code = prepare.main(['--corpus=large', '--offline', '--wheel_cache',
                       str(tmp_path / 'empty'), '--out', str(tmp_path / 'o'),
                       '--no_vocab'])
  err = capsys.readouterr().err.splitlines()
  assert code == 1 and len(err) == 2
  assert err[0].startswith('wheels (the built-in pins): django 5.2.19, ')
  assert 'indico 3.2.9' in err[0]
  assert err[1].startswith(f'error: wheels not in {tmp_path / "empty"} and '
                           'downloads are off: ')
  for pin in wheels.LARGE_PINS:
    assert repr(pin.filename) in err[1]
  assert not os.path.exists(tmp_path / 'o')
