"""Tests of corpus preparation on the handcrafted fixture wheel (offline)."""

import collections
import json
import os
import zipfile

import pytest

from lingshard.data import corpus_io
from lingshard.data import pair_filters
from lingshard.data import po_extract
from lingshard.data import prepare
from lingshard.data import splits
from lingshard.data import wheels

from .conftest import PREPARE_KWARGS, VOCAB_KWARGS


def _AllRows(data_dir):
  rows = {}
  for name in splits.ALL_SPLITS:
    path = corpus_io.SplitPath(data_dir, name)
    rows[name] = corpus_io.ReadTsv(path) if os.path.getsize(path) else []
  return rows


def _Union(data_dir):
  return [r for rows in _AllRows(data_dir).values() for r in rows]


def _Files(root):
  out = {}
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, root)] = f.read()
  return out


def test_prepare_is_byte_for_byte_reproducible(fixture_wheel, prepared_dir,
                                         tmp_path):
  again = str(tmp_path / 'again')
  prepare.Prepare([fixture_wheel], again, vocab_kwargs=VOCAB_KWARGS,
                  **PREPARE_KWARGS)
  first, second = _Files(prepared_dir), _Files(again)
  assert sorted(first) == sorted(second)
  assert 'vocab/spm_multi.model' in first and 'train.tsv' in first
  for name in first:
    assert first[name] == second[name], name


def test_filters_on_fixture(prepared_dir):
  rows = _Union(prepared_dir)
  langs = {r[0] for r in rows}
  assert langs == {'de', 'de_CH', 'es', 'fr', 'ja', 'ru'}  # No en, en_GB.
  by_key = collections.Counter(rows)
  targets = {r[2] for r in rows}
  # Fuzzy in de but translated in fr; empty in de; obsolete; identical;
  # placeholder renamed; over the 150-character cap.
  assert ('fr', 'Créer un compte', 'Sign up') in by_key
  assert not [r for r in rows if r[0] == 'de' and r[2] == 'Sign up']
  assert 'Forgot your password?' not in targets
  assert 'Old string' not in targets
  assert 'Status' not in targets
  assert ('fr', 'documentation', 'Documentation') not in by_key
  assert 'Hello, %(name)s' not in targets
  assert not [r for r in rows if r[2].startswith('This paragraph')]
  # de "Save" is in django.po and djangojs.po: de-duplicated.
  assert by_key[('de', 'Speichern', 'Save')] == 1
  # Whitespace and line breaks collapse; contexts give distinct pairs.
  assert ('de', 'Ihre Sitzung ist abgelaufen. Bitte melden Sie sich erneut '
          'an.', 'Your session has expired. Please log in again.') in by_key
  assert ('de', 'Mai', 'May') in by_key and ('de', 'Darf', 'May') in by_key


def test_plural_forms(prepared_dir):
  rows = set(_Union(prepared_dir))
  one, many = '%(count)d item', '%(count)d items'
  assert {r for r in rows if r[0] == 'ru' and r[2] in (one, many)} == {
      ('ru', '%(count)d элемент', one),
      ('ru', '%(count)d элемента', many),
      ('ru', '%(count)d элементов', many)}
  # Japanese has one form, selected for n == 1: it pairs with the singular.
  assert {r for r in rows if r[0] == 'ja' and r[2] in (one, many)} == {
      ('ja', '%(count)d 個の項目', one)}
  assert ('fr', '%(count)d éléments', many) in rows
  # ru's empty third form of "pages were deleted" is dropped, not paired.
  ru_pages = {r for r in rows if r[0] == 'ru' and '%(num)s' in r[2]}
  assert ru_pages == {
      ('ru', '%(num)s страница удалена.', '%(num)s page was deleted.'),
      ('ru', '%(num)s страницы удалены.', '%(num)s pages were deleted.')}


def test_placeholders_preserved_and_matched(prepared_dir):
  rows = _Union(prepared_dir)
  with_placeholders = [r for r in rows if pair_filters.Placeholders(r[2])]
  assert len(with_placeholders) >= 10
  for _, source, target in rows:
    assert pair_filters.Placeholders(source) == pair_filters.Placeholders(
        target)
  assert ('de', 'Willkommen, {name}!', 'Welcome, {name}!') in rows
  assert ('de', '100%% abgeschlossen', '100%% complete') in rows


def test_held_out_splits_do_not_leak(prepared_dir):
  rows = _AllRows(prepared_dir)
  for name in splits.ALL_SPLITS:
    assert rows[name], f'{name} is empty on the fixture'
  train_keys = {(lg, s) for lg, s, _ in rows[splits.TRAIN]}
  train_english = {t for _, _, t in rows[splits.TRAIN]}
  for name in splits.HELDOUT:
    assert not {(lg, s) for lg, s, _ in rows[name]} & train_keys, name
  for name in (splits.DEV_UNSEEN, splits.TEST_UNSEEN):
    assert not {t for _, _, t in rows[name]} & train_english, name
  for name in (splits.DEV_SEEN, splits.TEST_SEEN):
    for lang, _, target in rows[name]:
      assert target in train_english
      assert lang not in {lg for lg, _, t in rows[splits.TRAIN] if t == target}


def test_noph_subsets_and_stats_table(prepared_dir):
  stats_path = os.path.join(prepared_dir, corpus_io.STATS_FILE)
  with open(stats_path, encoding='utf-8') as f:
    table = [line.split('\t') for line in f.read().splitlines()]
  header = table[0]
  assert header == ['lang'] + list(splits.ALL_SPLITS) + ['total']
  stats = {row[0]: [int(x) for x in row[1:]] for row in table[1:]}
  rows = _AllRows(prepared_dir)
  for i, name in enumerate(splits.ALL_SPLITS):
    counts = collections.Counter(r[0] for r in rows[name])
    for lang in stats:
      expected = len(rows[name]) if lang == 'ALL' else counts[lang]
      assert stats[lang][i] == expected, (name, lang)
    noph_path = corpus_io.SplitPath(prepared_dir, name, noph=True)
    noph = corpus_io.ReadTsv(noph_path) if os.path.getsize(noph_path) else []
    assert noph == [r for r in rows[name] if pair_filters.IsPlain(r[1], r[2])]
    assert len(noph) < len(rows[name]) or name != splits.TRAIN
  manifest = json.load(open(os.path.join(prepared_dir, 'manifest.json'),
                            encoding='utf-8'))
  assert manifest['splits']['train']['pairs'] == len(rows[splits.TRAIN])
  counts = manifest['extraction_counts']['polyui-1.0-py3-none-any.whl']
  assert counts['fuzzy'] == 1 and counts['obsolete'] == 1
  assert counts['english_locale_catalogs'] == 2
  assert manifest['sources'][0]['licence'] == 'MIT'
  assert os.path.exists(os.path.join(prepared_dir, 'licenses',
                                     'polyui-LICENSE'))


def test_cli_runs_offline_from_wheel_files(fixture_wheel, tmp_path, capsys):
  out = str(tmp_path / 'cli')
  code = prepare.main(['--wheels', fixture_wheel, '--out', out, '--no_vocab',
                       '--max_chars', '150'])
  assert code == 0
  assert 'languages' in capsys.readouterr().out
  assert corpus_io.ReadTsv(corpus_io.SplitPath(out, 'train'))
  assert not os.path.exists(os.path.join(out, 'vocab'))


def test_wheel_without_catalogs_is_a_clear_error(tmp_path, capsys):
  empty = str(tmp_path / 'empty-1.0-py3-none-any.whl')
  with zipfile.ZipFile(empty, 'w') as zf:
    zf.writestr('empty/__init__.py', '')
  with pytest.raises(corpus_io.CorpusError, match='no translation pairs'):
    prepare.Prepare([empty], str(tmp_path / 'out'))
  assert prepare.main(['--wheels', empty, '--out', str(tmp_path / 'o2')]) == 1
  assert 'no translation pairs' in capsys.readouterr().err


def test_cached_wheels_are_used_without_network_and_verified(tmp_path):
  cache = tmp_path / 'cache'
  cache.mkdir()
  (cache / 'fake-1.0-py3-none-any.whl').write_bytes(b'wheel bytes')
  digest = wheels.Sha256(str(cache / 'fake-1.0-py3-none-any.whl'))
  pin = wheels.WheelPin('fake', '1.0', 'fake-1.0-py3-none-any.whl', digest,
                        'MIT')
  # allow_download=False: would raise if it needed the network.
  assert wheels.EnsureWheels(str(cache), [pin], allow_download=False) == [
      str(cache / 'fake-1.0-py3-none-any.whl')]
  bad = pin._replace(sha256='0' * 64)
  with pytest.raises(wheels.WheelError, match='does not match the pin'):
    wheels.EnsureWheels(str(cache), [bad], allow_download=False)
  missing = pin._replace(filename='other-1.0-py3-none-any.whl')
  with pytest.raises(wheels.WheelError, match='downloads are off'):
    wheels.EnsureWheels(str(cache), [missing], allow_download=False)


def test_pins_are_the_issue_pins():
  assert [(p.name, p.version) for p in wheels.PINS] == [
      ('django', '5.2.19'), ('wagtail', '8.0.1'),
      ('django-allauth', '65.21.1'), ('sphinx', '9.0.4')]


def test_latin1_catalog_without_plural_forms_header(tmp_path):
  catalog = ('msgid ""\nmsgstr ""\n'
             '"Content-Type: text/plain; charset=ISO-8859-1\\n"\n\n'
             'msgid "Delete"\nmsgstr "Löschen"\n\n'
             'msgid "%(n)d file"\nmsgid_plural "%(n)d files"\n'
             'msgstr[0] "%(n)d Datei"\nmsgstr[1] "%(n)d Dateien"\n')
  path = str(tmp_path / 'latin-1.0-py3-none-any.whl')
  with zipfile.ZipFile(path, 'w') as zf:
    zf.writestr('latin/locale/de/LC_MESSAGES/django.po',
                catalog.encode('latin-1'))
  counts = collections.Counter()
  pairs = po_extract.ExtractWheel(path, 100, counts)
  assert pairs == [po_extract.Pair('de', 'Löschen', 'Delete')]
  # Without a Plural-Forms header the forms cannot be paired safely.
  assert counts[po_extract.DROP_PLURAL_UNPARSED] == 1
