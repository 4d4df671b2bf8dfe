"""Tests of the safe Plural-Forms parser against hand-written rules."""

import pytest

from lingshard.data import plural_forms

RU = ('nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && '
      'n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);')
AR = ('nplurals=6; plural=n==0 ? 0 : n==1 ? 1 : n==2 ? 2 : '
      'n%100>=3 && n%100<=10 ? 3 : n%100>=11 && n%100<=99 ? 4 : 5;')


def _RussianReference(n):
  if n % 10 == 1 and n % 100 != 11:
    return 0
  if 2 <= n % 10 <= 4 and not 10 <= n % 100 < 20:
    return 1
  return 2


def _ArabicReference(n):
  if n in (0, 1, 2):
    return n
  if 3 <= n % 100 <= 10:
    return 3
  if 11 <= n % 100 <= 99:
    return 4
  return 5


@pytest.mark.parametrize('header,reference', [
    (RU, _RussianReference),
    (AR, _ArabicReference),
    ('nplurals=2; plural=(n != 1);', lambda n: int(n != 1)),
    ('nplurals=2; plural=n > 1;', lambda n: int(n > 1)),
    ('nplurals=1; plural=0;', lambda n: 0),
])
def test_evaluation_matches_reference(header, reference):
  nplurals, fn = plural_forms.ParsePluralForms(header)
  for n in range(0, 300):
    assert fn(n) == reference(n), n
    assert 0 <= fn(n) < nplurals


def test_c_precedence_and_ternary_associativity():
  _, fn = plural_forms.ParsePluralForms(
      'nplurals=4; plural=n==1 ? 0 : n==2 ? 1 : 2 + 3 * (n % 2) - 2 * 1;')
  # The ternary nests to the right; * binds tighter than + and -.
  assert [fn(n) for n in (1, 2, 3, 4)] == [0, 1, 3, 0]
  _, fn = plural_forms.ParsePluralForms('nplurals=2; plural=!(n==1) && 1;')
  assert [fn(n) for n in (0, 1, 2)] == [1, 0, 1]


def test_form_roles():
  assert plural_forms.FormRoles('nplurals=2; plural=(n != 1);') == {
      0: 'singular', 1: 'plural'}
  # French uses form 0 for 0 and 1: it pairs with the singular English.
  assert plural_forms.FormRoles('nplurals=2; plural=(n > 1);') == {
      0: 'singular', 1: 'plural'}
  assert plural_forms.FormRoles('nplurals=1; plural=0;') == {0: 'singular'}
  assert plural_forms.FormRoles(RU) == {0: 'singular', 1: 'plural',
                                        2: 'plural'}
  # Arabic's zero form (index 0) is a plural; n == 1 selects form 1.
  assert plural_forms.FormRoles(AR) == {0: 'plural', 1: 'singular',
                                        2: 'plural', 3: 'plural', 4: 'plural',
                                        5: 'plural'}
  # A form only fractional counts select is left out.
  assert plural_forms.FormRoles(
      'nplurals=3; plural=(n % 1 != 0) ? 2 : n == 1 ? 0 : 1;') == {
          0: 'singular', 1: 'plural'}


@pytest.mark.parametrize('header', [
    None, '', 'plural=(n != 1);', 'nplurals=0; plural=0;',
    'nplurals=2; plural=(n != 1;', 'nplurals=2; plural=n !=;',
    'nplurals=2; plural=__import__("os").system("true");',
    'nplurals=2; plural=n ? 1;', 'nplurals=2; plural=x;',
])
def test_malformed_headers_raise(header):
  with pytest.raises(plural_forms.PluralFormsError):
    plural_forms.FormRoles(header)


def test_form_outside_nplurals_raises():
  with pytest.raises(plural_forms.PluralFormsError, match='outside nplurals'):
    plural_forms.FormRoles('nplurals=2; plural=n == 1 ? 0 : 2;')


@pytest.mark.parametrize('expression', [
    '(' * 5000 + 'n' + ')' * 5000,  # Parser recursion.
    '!' * 5000 + 'n',
    ' + '.join(['n'] * 100000),  # A flat chain: evaluation recursion.
    'n == 1 ? 0 : ' * 60 + '1',
])
def test_deep_expression_is_a_plural_forms_error_not_recursion_error(
    expression):
  with pytest.raises(plural_forms.PluralFormsError) as e:
    plural_forms.FormRoles(f'nplurals=2; plural={expression};')
  assert str(e.value) == 'plural expression nests deeper than 50 levels'


def test_expression_at_the_depth_limit_still_parses():
  _, fn = plural_forms.ParsePluralForms(
      'nplurals=2; plural=' + '(' * 48 + 'n != 1' + ')' * 48 + ';')
  assert [fn(n) for n in (0, 1, 2)] == [1, 0, 1]
