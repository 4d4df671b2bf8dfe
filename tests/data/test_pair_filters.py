"""Tests of the pair cleaning rules."""

from lingshard.data import pair_filters as pf


def test_placeholders_finds_printf_and_brace_forms():
  text = ('%(name)s has %d new %s in {folder} ({0}, {obj.attr}, {}), '
          '100%% done, {{literal}}, %.2f%%')
  assert pf.Placeholders(text) == sorted(
      ['%(name)s', '%d', '%s', '{folder}', '{0}', '{obj.attr}', '{}',
       '%.2f'])


def test_percent_signs_in_prose_are_not_placeholders():
  assert pf.Placeholders('100% of users, 5 % of the pages') == []
  assert pf.Placeholders('50%% off') == []


def test_placeholders_match_is_a_multiset_comparison():
  assert pf.PlaceholdersMatch('%(a)s then %(b)s', '%(b)s, avant %(a)s')
  assert not pf.PlaceholdersMatch('%(name)s', '%(nom)s')
  assert not pf.PlaceholdersMatch('%s and %s', '%s')
  assert not pf.PlaceholdersMatch('{count} items', 'items')


def test_normalize_collapses_whitespace_and_composes():
  assert pf.Normalize('  two\nlines\tand  tabs ') == 'two lines and tabs'
  assert pf.Normalize('Cafe\u0301') == 'Caf\u00e9'


def test_html_and_plain_flags():
  assert pf.HasHtml('<strong>Warning:</strong> careful')
  assert pf.HasHtml('Tom &amp; Jerry')
  assert not pf.HasHtml('a < b and c > d')
  assert pf.IsPlain('Speichern', 'Save')
  assert not pf.IsPlain('%s gespeichert', '%s saved')
  assert not pf.IsPlain('<b>Ja</b>', '<b>Yes</b>')


def test_check_pair_reasons():
  assert pf.CheckPair('Speichern', 'Save', 50) is None
  assert pf.CheckPair('', 'Save', 50) == pf.DROP_EMPTY
  assert pf.CheckPair('x' * 51, 'Save', 50) == pf.DROP_TOO_LONG
  assert pf.CheckPair('Save', 'Save', 50) == pf.DROP_IDENTICAL
  assert pf.CheckPair('documentation', 'Documentation', 50) == (
      pf.DROP_IDENTICAL)
  assert pf.CheckPair('Bonjour %(nom)s', 'Hello %(name)s', 50) == (
      pf.DROP_PLACEHOLDER_MISMATCH)
