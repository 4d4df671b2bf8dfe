"""Safe evaluation of gettext `Plural-Forms` headers.

A catalog's header says, as a C expression of `n`, which `msgstr[i]` form
a count selects, e.g. `nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : ...)`.
We need it to pair each translated plural form with the right English
string (singular `msgid` or `msgid_plural`). The expression is parsed by a
small precedence-climbing parser into closures; nothing is ever passed to
the Python evaluator.
"""

import re

# Ordered longest-first so that `<=` is not read as `<` then `=`.
_TOKEN_RE = re.compile(r'\s*(\d+|n|\|\||&&|==|!=|<=|>=|[-+*/%<>!?:()])')

# Binary operators by C precedence (higher binds tighter).
_BINARY = {
    '||': 1, '&&': 2, '==': 3, '!=': 3,
    '<': 4, '>': 4, '<=': 4, '>=': 4,
    '+': 5, '-': 5, '*': 6, '/': 6, '%': 6,
}


class PluralFormsError(ValueError):
  """The Plural-Forms header is missing or not a valid C expression."""


def _CDiv(a, b):
  # C integer division truncates toward zero; a zero divisor selects form 0
  # rather than crashing (gettext would be undefined here anyway).
  if b == 0:
    return 0
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b >= 0) else -q


def _CMod(a, b):
  if b == 0:
    return 0
  return a - b * _CDiv(a, b)


_OPS = {
    '||': lambda a, b: int(bool(a) or bool(b)),
    '&&': lambda a, b: int(bool(a) and bool(b)),
    '==': lambda a, b: int(a == b),
    '!=': lambda a, b: int(a != b),
    '<': lambda a, b: int(a < b),
    '>': lambda a, b: int(a > b),
    '<=': lambda a, b: int(a <= b),
    '>=': lambda a, b: int(a >= b),
    '+': lambda a, b: a + b,
    '-': lambda a, b: a - b,
    '*': lambda a, b: a * b,
    '/': _CDiv,
    '%': _CMod,
}


def _Tokenize(text):
  tokens, pos = [], 0
  text = text.rstrip()
  while pos < len(text):
    m = _TOKEN_RE.match(text, pos)
    if not m:
      raise PluralFormsError(f'bad plural expression at {text[pos:]!r}')
    tokens.append(m.group(1))
    pos = m.end()
  return tokens


# The deepest expression tree accepted. Real headers nest under ~10 levels;
# the bound keeps parsing and evaluation (both recursive) far from Python's
# recursion limit.
MAX_DEPTH = 50


class _Parser:
  """Recursive-descent parser producing a closure `f(n) -> int`.

  Each method takes the depth of the node it parses (root = 1) and returns
  (closure, height of its subtree); either above MAX_DEPTH is an error.
  """

  def __init__(self, tokens):
    self._tokens = tokens
    self._i = 0

  def _Peek(self):
    return self._tokens[self._i] if self._i < len(self._tokens) else None

  def _Next(self):
    tok = self._Peek()
    if tok is None:
      raise PluralFormsError('plural expression ends early')
    self._i += 1
    return tok

  @staticmethod
  def _Check(depth):
    if depth > MAX_DEPTH:
      raise PluralFormsError(
          f'plural expression nests deeper than {MAX_DEPTH} levels')
    return depth

  def Parse(self):
    fn, _ = self._Ternary(1)
    if self._Peek() is not None:
      raise PluralFormsError(f'trailing tokens: {self._tokens[self._i:]}')
    return fn

  def _Ternary(self, depth):
    cond, height = self._Binary(1, depth)
    if self._Peek() != '?':
      return cond, height
    self._Next()
    then, then_height = self._Ternary(self._Check(depth + 1))
    if self._Next() != ':':
      raise PluralFormsError('expected ":" in conditional')
    other, other_height = self._Ternary(depth + 1)
    return (lambda n: then(n) if cond(n) else other(n),
            self._Check(1 + max(height, then_height, other_height)))

  def _Binary(self, min_prec, depth):
    lhs, height = self._Unary(depth)
    while True:
      op = self._Peek()
      prec = _BINARY.get(op)
      if prec is None or prec < min_prec:
        return lhs, height
      self._Next()
      # All C binary operators are left-assoc.
      rhs, rhs_height = self._Binary(prec + 1, self._Check(depth + 1))
      lhs = (lambda f, a, b: lambda n: f(a(n), b(n)))(_OPS[op], lhs, rhs)
      height = self._Check(1 + max(height, rhs_height))

  def _Unary(self, depth):
    self._Check(depth)
    tok = self._Next()
    if tok == '!':
      inner, height = self._Unary(depth + 1)
      return lambda n: int(not inner(n)), self._Check(height + 1)
    if tok == '-':
      inner, height = self._Unary(depth + 1)
      return lambda n: -inner(n), self._Check(height + 1)
    if tok == '(':
      inner, height = self._Ternary(depth + 1)
      if self._Next() != ')':
        raise PluralFormsError('expected ")"')
      return inner, height
    if tok == 'n':
      return lambda n: n, 1
    if tok.isdigit():
      value = int(tok)
      return lambda n: value, 1
    raise PluralFormsError(f'unexpected token {tok!r}')


def ParsePluralForms(header):
  """Parses a Plural-Forms header value.

  Args:
    header: e.g. 'nplurals=2; plural=(n != 1);'.

  Returns:
    (nplurals, fn) where fn(n) -> index of the msgstr form for count n.

  Raises:
    PluralFormsError: if the header is missing or malformed.
  """
  m = re.match(r'\s*nplurals\s*=\s*(\d+)\s*;\s*plural\s*=(.*?);?\s*$',
               header or '', re.S)
  if not m:
    raise PluralFormsError(f'bad Plural-Forms header {header!r}')
  nplurals = int(m.group(1))
  if nplurals < 1:
    raise PluralFormsError(f'nplurals must be >= 1 in {header!r}')
  return nplurals, _Parser(_Tokenize(m.group(2))).Parse()


# Counts probed to find which forms are used for one vs. more than one.
_PROBE_COUNTS = range(0, 1001)


def FormRoles(header):
  """Maps each used plural form index to 'singular' or 'plural'.

  The form selected for n == 1 pairs with English `msgid`; every other form
  selected by some count in 0..1000 pairs with `msgid_plural`. Forms no
  integer count selects (e.g. fractional-only forms) are left out.

  Args:
    header: the catalog's Plural-Forms header value.

  Returns:
    dict {form index: 'singular' | 'plural'}.

  Raises:
    PluralFormsError: on a bad header or a form index outside nplurals.
  """
  nplurals, fn = ParsePluralForms(header)
  roles = {}
  for n in _PROBE_COUNTS:
    form = fn(n)
    if not 0 <= form < nplurals:
      raise PluralFormsError(
          f'plural({n}) = {form} is outside nplurals={nplurals}')
    if n == 1:
      roles[form] = 'singular'
    else:
      roles.setdefault(form, 'plural')
  return roles
