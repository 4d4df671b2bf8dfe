"""Text form of one params value: `ValueToText`, `TextToValue`, `ValuesEqual`.

A value's text is a Python literal (`ast.literal_eval`) or one of the tagged
forms `type/<module>/<qualname>` (a class), `tf.<dtype>`,
`ndarray/<dtype>/<nested list>`, `WeightInit(...)` and `float('inf')`,
`float('-inf')`, `float('nan')`. `TextToValue` converts text to the type of
the param's current value and returns only values that `ValueToText` writes
back as text that reads as the same value. Parsing never evaluates code and
never imports a module: a class is looked up in modules already in
`sys.modules`.
"""

import ast
import functools
import math
import re
import sys
import types
import warnings

import numpy as np

from lingshard.weight_init import WeightInit

# Modules outside lingshard whose classes may be named in params text.
CLASS_ALLOW_LIST = ('tensorflow', 'keras', 'numpy')

# Texts quoted in messages are cut to this many characters.
QUOTE_CHARS = 80

_NONFINITE_TEXT = {"float('inf')": math.inf, "float('-inf')": -math.inf,
                   "float('nan')": math.nan}


class ParamsTextError(ValueError):
  """The one error type params text parsing raises.

  `detail` is the message without the `line N: '...': ` prefix that
  `Params.FromText` adds.
  """

  def __init__(self, message, detail=None):
    super().__init__(message)
    self.detail = message if detail is None else detail


def Quote(text):
  """`repr(text)`, cut to its first QUOTE_CHARS characters when longer."""
  if len(text) <= QUOTE_CHARS:
    return repr(text)
  return f'{text[:QUOTE_CHARS]!r}... ({len(text)} chars)'


def SplitLine(line):
  """`key : value` or `key = value` (first separator) -> (key, value)."""
  m = re.match(r'^([A-Za-z_][A-Za-z0-9_.\[\]]*)\s*[:=]\s*(.*)$', line)
  if not m:
    raise ParamsTextError('expected "dotted.key : value"')
  return m.group(1), m.group(2).strip()


def ValuesEqual(a, b):
  """Equality of two values: same types (int/float mix allowed), NaN == NaN."""
  if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and
            a.dtype == b.dtype and a.shape == b.shape and
            bool(np.array_equal(a, b)))
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return (type(a) is type(b) and len(a) == len(b) and
            all(ValuesEqual(x, y) for x, y in zip(a, b)))
  if isinstance(a, dict) and isinstance(b, dict):
    return (a.keys() == b.keys() and
            all(ValuesEqual(a[k], b[k]) for k in a))
  if type(a) is not type(b) and not (
      isinstance(a, (int, float)) and isinstance(b, (int, float)) and
      not isinstance(a, bool) and not isinstance(b, bool)):
    return False
  if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
    return True
  return a == b


def IsDType(value):
  tf = sys.modules.get('tensorflow')  # Text handling never imports it.
  return tf is not None and isinstance(value, tf.dtypes.DType)


def IsNonFiniteFloat(value):
  return isinstance(value, float) and not math.isfinite(value)


def _MaxIntDigits():
  return sys.get_int_max_str_digits() or 4300


@functools.lru_cache(maxsize=4)
def _IntBound(digits):
  return 10 ** digits


def _IsHugeInt(value):
  """An int with more decimal digits than int->str conversion allows."""
  return (isinstance(value, int) and not isinstance(value, bool) and
          abs(value) >= _IntBound(_MaxIntDigits()))


# ------------------------------------------------------------ value -> text
def ValueToText(value):
  """Text form of one leaf value (inverse of `TextToValue`)."""
  if isinstance(value, type):
    return f'type/{value.__module__}/{value.__qualname__}'
  if IsDType(value):
    return f'tf.{value.name}'
  if isinstance(value, np.ndarray):
    return f'ndarray/{value.dtype.name}/{value.tolist()!r}'
  if isinstance(value, WeightInit):
    _CheckLiteral(tuple(value))
    return repr(value)
  if IsNonFiniteFloat(value) and type(value) is float:
    return next(t for t, v in _NONFINITE_TEXT.items() if ValuesEqual(v, value))
  _CheckLiteral(value)
  return repr(value)


def _CheckLiteral(value):
  """Raises TypeError unless `value` round-trips through literal_eval."""
  if value is None or isinstance(value, (bool, int, float, str, bytes)):
    if IsNonFiniteFloat(value):
      raise TypeError(f'non-finite float {value!r} has no literal text form')
    if _IsHugeInt(value):
      raise TypeError(f'an int of more than {_MaxIntDigits()} digits has no '
                      'text form')
    return
  if isinstance(value, (list, tuple, set)):
    for v in value:
      _CheckLiteral(v)
    return
  if isinstance(value, dict):
    for k, v in value.items():
      _CheckLiteral(k)
      _CheckLiteral(v)
    return
  raise TypeError(f'value {value!r} of type {type(value).__name__} has no '
                  'text form')


# ------------------------------------------------------------ text -> value
def _ParseClass(text):
  """A class from an imported lingshard / allow-listed module, by name only."""
  m = re.match(r'^type/([A-Za-z_][\w.]*)/([A-Za-z_][\w.]*)$', text)
  if not m:
    raise ParamsTextError(f'bad class text {Quote(text)}')
  module_name, qualname = m.groups()
  root = module_name.split('.')[0]
  if root != 'lingshard' and root not in CLASS_ALLOW_LIST:
    raise ParamsTextError(f'class module {Quote(module_name)} is not in '
                          'lingshard or the allow-list '
                          f'({", ".join(CLASS_ALLOW_LIST)})')
  module = sys.modules.get(module_name)
  if not isinstance(module, types.ModuleType):
    raise ParamsTextError(f'class module {Quote(module_name)} is not imported;'
                          ' params text never imports a module, so name a '
                          'class of a module the code already imports')
  # vars() lookups only: getattr on a module may import (module __getattr__).
  obj = module
  for part in qualname.split('.'):
    if obj is not module and not isinstance(obj, type):
      break
    obj = vars(obj).get(part)
  if not isinstance(obj, type):
    raise ParamsTextError(f'module {Quote(module_name)} has no class '
                          f'{Quote(qualname)}')
  return obj


def _ParseDType(text):
  name = text[len('tf.'):]
  if not re.match(r'^[a-z0-9_]+$', name):
    raise ParamsTextError(f'bad dtype {Quote(text)}')
  tf = sys.modules.get('tensorflow')
  if tf is None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    return tf.as_dtype(name)
  except (TypeError, ValueError, KeyError):
    raise ParamsTextError(f'unknown dtype {Quote(text)}') from None


def _ParseNdarray(text):
  m = re.match(r'^ndarray/([a-z0-9_]+)/(.*)$', text, re.S)
  if not m:
    raise ParamsTextError(f'bad ndarray text {Quote(text)}')
  try:
    dtype = np.dtype(m.group(1))
    data = _LiteralEval(m.group(2))
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', RuntimeWarning)  # Overflow to inf.
      return np.array(data, dtype=dtype)
  except (TypeError, ValueError, OverflowError) as e:
    raise ParamsTextError(f'bad ndarray text {Quote(text)}: {e}') from None


def _ParseWeightInit(text):
  try:
    return WeightInit.FromText(text)
  except ValueError as e:
    msg = str(e)
    prefix = f'bad WeightInit text {text!r}'
    if msg.startswith(prefix):
      msg = f'bad WeightInit text {Quote(text)}' + msg[len(prefix):]
    raise ParamsTextError(msg) from None


def _ParseNonFinite(text):
  if text not in _NONFINITE_TEXT:
    raise ParamsTextError(f'bad float text {Quote(text)}; the float(...) forms'
                          ' are ' + ', '.join(_NONFINITE_TEXT))
  return _NONFINITE_TEXT[text]


def _LiteralEval(text):
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', SyntaxWarning)  # e.g. '0x1g' in text.
      return ast.literal_eval(text)
  except (ValueError, SyntaxError, TypeError, MemoryError,
          RecursionError) as e:
    raise ParamsTextError(f'not a literal: {Quote(text)} '
                          f'({type(e).__name__})') from None


# (prefix, parser, whether a current value takes this form).
_TAGGED = (
    ('type/', _ParseClass, lambda c: isinstance(c, type)),
    ('tf.', _ParseDType, IsDType),
    ('ndarray/', _ParseNdarray, lambda c: isinstance(c, np.ndarray)),
    ('WeightInit(', _ParseWeightInit, lambda c: isinstance(c, WeightInit)),
    ('float(', _ParseNonFinite, lambda c: isinstance(c, float)),
)


def TextToValue(text, current, nonfinite_ok=None):
  """Parses `text` into a value of the same type as `current`.

  `None` gives None. A str `current` keeps unquoted text as the string
  itself (so `a.b=hello` works, and `type/...` or `tf.float32` stay text);
  quoted text is unquoted. A tagged form is parsed only when `current` is
  None or of that form's type; a class only for a class-valued `current`
  (or None). Non-finite floats are refused unless `nonfinite_ok` (default:
  `current` is a non-finite float). Raises ParamsTextError unless the value
  reads back as itself from its `ValueToText` form.
  """
  value = _Parse(text, current)
  if nonfinite_ok is None:
    nonfinite_ok = IsNonFiniteFloat(current)
  _CheckNumbers(value, value, text, nonfinite_ok)
  try:
    back = ValueToText(value)
    again = _Parse(back, current)
  except (TypeError, ValueError) as e:
    raise ParamsTextError(f'{Quote(text)} cannot be written back as params '
                          f'text ({e}); use a plain literal') from None
  if not ValuesEqual(again, value):
    raise ParamsTextError(f'{Quote(text)} is written back as {Quote(back)},'
                          ' which reads as a different value; use a plain '
                          'literal')
  return value


def _Parse(text, current):
  if text == 'None':
    return None
  if isinstance(current, str):
    if text[:1] in ('"', "'"):
      value = _LiteralEval(text)
      if not isinstance(value, str):
        raise ParamsTextError(f'expected a string, got {Quote(text)}')
      return value
    return text
  if isinstance(current, bool):
    low = text.lower()
    if low in ('true', 'false'):
      return low == 'true'
    raise ParamsTextError(f'expected a bool (True/False), got {Quote(text)}')
  for prefix, parser, takes in _TAGGED:
    if text.startswith(prefix):
      if current is not None and not takes(current):
        raise ParamsTextError(f'expected {type(current).__name__}, got '
                              f'{Quote(text)}')
      return _Coerce(parser(text), current, text)
  return _Coerce(_LiteralEval(text), current, text)


def _CheckNumbers(value, top, text, nonfinite_ok):
  """Refuses non-finite floats (unless allowed for `top`) and huge ints."""
  if isinstance(value, np.ndarray):
    if (np.issubdtype(value.dtype, np.inexact) and
        not np.all(np.isfinite(value))):
      raise ParamsTextError(f'{Quote(text)} gives a non-finite float; use '
                            'finite numbers')
  elif isinstance(value, float):
    if not math.isfinite(value) and not (nonfinite_ok and value is top):
      raise ParamsTextError(f'{Quote(text)} gives a non-finite float '
                            f'({value!r}); use a finite number (only a param '
                            'whose default is inf or nan takes one)')
  elif _IsHugeInt(value):
    raise ParamsTextError(f'{Quote(text)} gives an int of more than '
                          f'{_MaxIntDigits()} digits; use a smaller number')
  elif isinstance(value, (list, tuple, set)):
    for v in value:
      _CheckNumbers(v, top, text, nonfinite_ok)
  elif isinstance(value, dict):
    for k, v in value.items():
      _CheckNumbers(k, top, text, nonfinite_ok)
      _CheckNumbers(v, top, text, nonfinite_ok)


def _Coerce(value, current, text):
  """Converts a parsed value to the type of `current` or raises."""
  if current is None or value is None:
    return value
  if isinstance(current, WeightInit):  # A namedtuple: before tuple.
    if isinstance(value, WeightInit):
      return value
  elif isinstance(current, bool):
    if isinstance(value, bool):
      return value
  elif isinstance(current, int):
    if isinstance(value, int) and not isinstance(value, bool):
      return value
  elif isinstance(current, float):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      try:
        return float(value)
      except OverflowError:
        raise ParamsTextError(f'{Quote(text)} is out of float range; use a '
                              'smaller number') from None
  elif isinstance(current, (list, tuple)):
    if isinstance(value, (list, tuple)):
      return type(current)(value)
  elif isinstance(current, dict):
    if isinstance(value, dict):
      return value
  elif isinstance(current, type):
    if isinstance(value, type):
      return value
  elif IsDType(current):
    if IsDType(value):
      return value
  elif isinstance(current, np.ndarray):
    if isinstance(value, np.ndarray):
      return value
    if isinstance(value, (list, tuple)):
      try:
        return np.array(value, dtype=current.dtype)
      except (TypeError, ValueError, OverflowError) as e:
        raise ParamsTextError(f'bad array {Quote(text)}: {e}') from None
  else:
    if type(value) is type(current):
      return value
  raise ParamsTextError(f'expected {type(current).__name__}, got '
                        f'{Quote(text)}')
