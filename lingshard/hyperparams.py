"""Lingvo-style hyper-parameters: `Params`, `InstantiableParams`, text round trip.

A `Params` is an ordered set of named, documented values. Values may be nested
`Params`, lists/tuples of `Params`, or plain values (None, bool, int, float,
str, list/tuple/dict of literals, TF dtypes, classes, numpy arrays and
`WeightInit`). `ToText()` writes one sorted `dotted.key : value` line per leaf;
`FromText()` applies such lines back, converting each value to the type of the
current value. Parsing never evaluates code: literals go through
`ast.literal_eval`, everything else through small explicit grammars.
"""

import ast
import copy
import difflib
import importlib
import re
import warnings

import numpy as np

from lingshard.weight_init import WeightInit

_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
# `name` or `name[3]` in a dotted key.
_KEY_PART_RE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?$')

# Modules outside lingshard whose classes may be named in params text.
CLASS_ALLOW_LIST = ('tensorflow', 'keras', 'numpy')


class ParamsTextError(ValueError):
  """The one error type `FromText` raises for bad text (with line number)."""


class UnknownParamError(AttributeError, KeyError):
  """A key that was never `Define`d; the message suggests close matches."""

  def __str__(self):
    # KeyError would quote the message; keep it readable.
    return str(self.args[0]) if self.args else ''


class FrozenParamsError(TypeError):
  """Mutation of a `Freeze()`d Params."""


class _Param:
  """One defined value with its description."""

  __slots__ = ('name', 'value', 'description')

  def __init__(self, name, value, description):
    self.name = name
    self.value = value
    self.description = description


def _ValuesEqual(a, b):
  if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and
            a.dtype == b.dtype and a.shape == b.shape and
            bool(np.array_equal(a, b)))
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return (type(a) is type(b) and len(a) == len(b) and
            all(_ValuesEqual(x, y) for x, y in zip(a, b)))
  if isinstance(a, dict) and isinstance(b, dict):
    return (a.keys() == b.keys() and
            all(_ValuesEqual(a[k], b[k]) for k in a))
  if type(a) is not type(b) and not (
      isinstance(a, (int, float)) and isinstance(b, (int, float)) and
      not isinstance(a, bool) and not isinstance(b, bool)):
    return False
  return a == b


class Params:
  """A set of named hyper-parameters with attribute access.

  `p.Define(name, default, description)` adds one; `p.name` reads it and
  `p.name = v` sets it. Unknown names raise `UnknownParamError` with
  suggestions. `Freeze()` makes every later mutation raise.
  """

  def __init__(self):
    self.__dict__['_params'] = {}
    self.__dict__['_frozen'] = False

  # ---------------------------------------------------------------- basics
  def Define(self, name, default, description):
    """Defines `name` with a default value and a description."""
    self._CheckMutable()
    if not isinstance(name, str) or not _NAME_RE.match(name):
      raise ValueError(f'Param name {name!r} is not a valid identifier.')
    if name in self._params:
      raise AttributeError(f'Param {name!r} is already defined.')
    if name in ('cls',) or name.startswith('_') or hasattr(Params, name):
      raise AttributeError(f'Param name {name!r} is reserved.')
    self._params[name] = _Param(name, default, description)

  def _UnknownKey(self, name, full_key=None):
    keys = sorted(self._params)
    close = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
    key = full_key or name
    if close:
      hint = 'did you mean ' + ' or '.join(repr(c) for c in close) + '?'
    else:
      hint = 'known keys: ' + (', '.join(keys) if keys else '(none)')
    return UnknownParamError(f'Unknown param {key!r}; {hint}')

  def __getattr__(self, name):
    params = self.__dict__['_params']
    if name in params:
      return params[name].value
    if name.startswith('__'):
      raise AttributeError(name)
    raise self._UnknownKey(name)

  def __setattr__(self, name, value):
    self._CheckMutable()
    if name not in self._params:
      raise self._UnknownKey(name)
    self._params[name].value = value

  def __contains__(self, name):
    return name in self._params

  def __iter__(self):
    """Iterates over (name, value) in definition order."""
    for name, param in self._params.items():
      yield name, param.value

  def __len__(self):
    return len(self._params)

  def __eq__(self, other):
    if not isinstance(other, Params) or type(self) is not type(other):
      return False
    if getattr(self, '_cls', None) is not getattr(other, '_cls', None):
      return False
    if self._params.keys() != other._params.keys():
      return False
    return all(_ValuesEqual(self._params[k].value, other._params[k].value)
               for k in self._params)

  def __ne__(self, other):
    return not self == other

  __hash__ = None

  def __repr__(self):
    return self.ToText()

  def Description(self, name):
    """The description given to `Define` for `name`."""
    if name not in self._params:
      raise self._UnknownKey(name)
    return self._params[name].description

  # --------------------------------------------------------- freeze / copy
  def Freeze(self):
    """Makes this Params and every nested one immutable. Returns self."""
    self.__dict__['_frozen'] = True
    for _, v in self:
      for sub in _NestedParams(v):
        sub.Freeze()
    return self

  @property
  def frozen(self):
    return self.__dict__['_frozen']

  def _CheckMutable(self):
    if self.__dict__['_frozen']:
      raise FrozenParamsError('This Params is frozen; Copy() it to change it.')

  def Copy(self):
    """A deep, mutable copy (the class of InstantiableParams is kept)."""
    return copy.deepcopy(self, memo={})

  def __deepcopy__(self, memo):
    new = object.__new__(type(self))
    new.__dict__['_params'] = {}
    new.__dict__['_frozen'] = False
    for k, v in self.__dict__.items():
      if k not in ('_params', '_frozen'):
        new.__dict__[k] = v  # e.g. _cls: classes are shared, not copied.
    for name, param in self._params.items():
      new._params[name] = _Param(name, _DeepCopyValue(param.value, memo),
                                 param.description)
    return new

  # ------------------------------------------------------------ dotted keys
  def _Walk(self, parts, dotted):
    """Follows `name` / `name[i]` parts from self; returns the value."""
    node = self
    for i, part in enumerate(parts):
      m = _KEY_PART_RE.match(part)
      if not isinstance(node, Params):
        raise UnknownParamError(f'Unknown param {dotted!r}: '
                                f'{".".join(parts[:i])} is not a Params')
      if not m or m.group(1) not in node._params:
        raise node._UnknownKey(m.group(1) if m else part, dotted)
      node = node._params[m.group(1)].value
      if m.group(2) is not None:
        index = int(m.group(2))
        if not isinstance(node, (list, tuple)) or index >= len(node):
          raise UnknownParamError(f'Unknown param {dotted!r}: no element '
                                  f'{index} in {".".join(parts[:i + 1])}')
        node = node[index]
    return node

  def _Resolve(self, dotted):
    """Returns (parent Params, last name) for a dotted key."""
    parts = dotted.split('.')
    node = self._Walk(parts[:-1], dotted)
    if not isinstance(node, Params):
      raise UnknownParamError(f'Unknown param {dotted!r}: '
                              f'{".".join(parts[:-1])} is not a Params')
    last = parts[-1]
    if not _NAME_RE.match(last) or last not in node._params:
      raise node._UnknownKey(last, dotted)
    return node, last

  def Get(self, dotted):
    """Value at a dotted key, e.g. `p.Get('encoder.num_layers')`."""
    node, name = self._Resolve(dotted)
    return node._params[name].value

  def Set(self, **kwargs):
    """Sets values by (dotted) name; returns self for chaining."""
    self._CheckMutable()
    for key, value in kwargs.items():
      node, name = self._Resolve(key)
      setattr(node, name, value)
    return self

  def Delete(self, *names):
    """Removes defined (dotted) names; returns self."""
    self._CheckMutable()
    for key in names:
      node, name = self._Resolve(key)
      node._CheckMutable()
      del node._params[name]
    return self

  # ------------------------------------------------------------------ text
  def _Leaves(self, prefix=''):
    for name in sorted(self._params):
      value = self._params[name].value
      key = prefix + name
      if isinstance(value, Params):
        yield key + '.cls', _ClsOf(value)
        yield from value._Leaves(key + '.')
      elif _IsParamsList(value):
        for i, sub in enumerate(value):
          yield f'{key}[{i}].cls', _ClsOf(sub)
          yield from sub._Leaves(f'{key}[{i}].')
      else:
        yield key, value

  def ToText(self):
    """Sorted `dotted.key : value` lines, one per leaf value."""
    lines = []
    for key, value in self._Leaves():
      if key.endswith('.cls'):
        if value is None:
          continue
      lines.append(f'{key} : {ValueToText(value)}')
    lines.sort(key=lambda line: line.split(' : ', 1)[0])
    return '\n'.join(lines) + ('\n' if lines else '')

  def FromText(self, text):
    """Applies `key : value` lines (or `key = value`) to this Params.

    Each value is converted to the type of the current value. Blank lines
    and lines starting with `#` are skipped. Raises ParamsTextError (with
    the line number and text) for any bad line. Returns self.
    """
    self._CheckMutable()
    if not isinstance(text, str):
      raise ParamsTextError(f'Params text must be a str, got {type(text)}')
    for lineno, raw in enumerate(text.splitlines(), 1):
      line = raw.strip()
      if not line or line.startswith('#'):
        continue
      try:
        key, value_text = _SplitLine(line)
        if key.endswith('.cls'):
          _CheckClassText(self, key, value_text)
          continue
        node, name = self._Resolve(key)
        current = node._params[name].value
        node._CheckMutable()
        node._params[name].value = TextToValue(value_text, current)
      except ParamsTextError as e:
        raise ParamsTextError(f'line {lineno}: {raw!r}: {e}') from None
      except (UnknownParamError, FrozenParamsError, ValueError,
              TypeError) as e:
        raise ParamsTextError(f'line {lineno}: {raw!r}: {e}') from None
    return self


class InstantiableParams(Params):
  """Params that know the class they configure: `p.cls`, `p.Instantiate()`."""

  def __init__(self, cls=None):
    super().__init__()
    self.__dict__['_cls'] = cls

  @property
  def cls(self):
    return self.__dict__['_cls']

  def Instantiate(self, **kwargs):
    """Returns `self.cls(self, **kwargs)`."""
    if self.cls is None:
      raise TypeError('InstantiableParams has no cls to instantiate.')
    return self.cls(self, **kwargs)


def _ClsOf(p):
  return p.cls if isinstance(p, InstantiableParams) else None


def _IsParamsList(value):
  return (isinstance(value, (list, tuple)) and value and
          all(isinstance(v, Params) for v in value))


def _NestedParams(value):
  if isinstance(value, Params):
    return [value]
  if isinstance(value, (list, tuple)):
    return [v for v in value if isinstance(v, Params)]
  return []


def _DeepCopyValue(value, memo):
  if isinstance(value, type):
    return value
  if _IsDType(value):
    return value
  return copy.deepcopy(value, memo)


def _IsDType(value):
  tf = _TF()
  return tf is not None and isinstance(value, tf.dtypes.DType)


def _TF():
  """TensorFlow if it is imported already (text handling never imports it)."""
  import sys  # pylint: disable=g-import-not-at-top
  return sys.modules.get('tensorflow')


def _SplitLine(line):
  """`key : value` or `key = value` (first separator) -> (key, value)."""
  m = re.match(r'^([A-Za-z_][A-Za-z0-9_.\[\]]*)\s*[:=]\s*(.*)$', line)
  if not m:
    raise ParamsTextError('expected "dotted.key : value"')
  return m.group(1), m.group(2).strip()


def _CheckClassText(root, key, value_text):
  """`x.cls : type/...` lines must name the class the code already has."""
  node = root._Walk(key[:-len('.cls')].split('.'), key)  # pylint: disable=protected-access
  want = _ParseClass(value_text)
  if not isinstance(node, InstantiableParams) or node.cls is not want:
    raise ParamsTextError(f'{key} is {ValueToText(_ClsOf(node))}, text says '
                          f'{value_text}; change the class in code, not text')


# ------------------------------------------------------------ value <-> text
def ValueToText(value):
  """Text form of one leaf value (inverse of `TextToValue`)."""
  if isinstance(value, type):
    return f'type/{value.__module__}/{value.__qualname__}'
  if _IsDType(value):
    return f'tf.{value.name}'
  if isinstance(value, np.ndarray):
    return f'ndarray/{value.dtype.name}/{value.tolist()!r}'
  if isinstance(value, WeightInit):
    return repr(value)
  if isinstance(value, Params):
    raise TypeError('nested Params are written key by key')
  _CheckLiteral(value)
  return repr(value)


def _CheckLiteral(value):
  """Raises TypeError unless `value` round-trips through literal_eval."""
  if value is None or isinstance(value, (bool, int, float, str, bytes)):
    if isinstance(value, float) and not np.isfinite(value):
      raise TypeError(f'non-finite float {value!r} has no literal text form')
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


def _ParseClass(text):
  m = re.match(r'^type/([A-Za-z_][\w.]*)/([A-Za-z_][\w.]*)$', text)
  if not m:
    raise ParamsTextError(f'bad class text {text!r}')
  module_name, qualname = m.groups()
  root = module_name.split('.')[0]
  if root != 'lingshard' and root not in CLASS_ALLOW_LIST:
    raise ParamsTextError(f'class module {module_name!r} is not in lingshard '
                          'or the allow-list')
  try:
    obj = importlib.import_module(module_name)
    for part in qualname.split('.'):
      obj = getattr(obj, part)
  except (ImportError, AttributeError) as e:
    raise ParamsTextError(f'cannot resolve class {text!r}: {e}') from None
  if not isinstance(obj, type):
    raise ParamsTextError(f'{text!r} is not a class')
  return obj


def _ParseDType(text):
  name = text[len('tf.'):]
  tf = _TF()
  if tf is None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not re.match(r'^[a-z0-9_]+$', name):
    raise ParamsTextError(f'bad dtype {text!r}')
  try:
    return tf.as_dtype(name)
  except TypeError:
    raise ParamsTextError(f'unknown dtype {text!r}') from None


def _ParseNdarray(text):
  m = re.match(r'^ndarray/([a-z0-9_]+)/(.*)$', text, re.S)
  if not m:
    raise ParamsTextError(f'bad ndarray text {text!r}')
  try:
    dtype = np.dtype(m.group(1))
    data = _LiteralEval(m.group(2))
    return np.array(data, dtype=dtype)
  except (TypeError, ValueError) as e:
    raise ParamsTextError(f'bad ndarray text {text!r}: {e}') from None


def _LiteralEval(text):
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', SyntaxWarning)  # e.g. '0x1g' in text.
      return ast.literal_eval(text)
  except (ValueError, SyntaxError, TypeError, MemoryError,
          RecursionError) as e:
    raise ParamsTextError(f'not a literal: {text!r} '
                          f'({type(e).__name__})') from None


def _ParseTagged(text):
  """Parses the non-literal forms; returns (True, value) or (False, None)."""
  if text.startswith('type/'):
    return True, _ParseClass(text)
  if text.startswith('tf.'):
    return True, _ParseDType(text)
  if text.startswith('ndarray/'):
    return True, _ParseNdarray(text)
  if text.startswith('WeightInit('):
    try:
      return True, WeightInit.FromText(text)
    except ValueError as e:
      raise ParamsTextError(str(e)) from None
  return False, None


def TextToValue(text, current):
  """Parses `text` into a value of the same type as `current`.

  A `current` of None accepts any form. A str `current` keeps unquoted text
  as the string itself (so `a.b=hello` works); quoted text is unquoted.
  """
  tagged, value = _ParseTagged(text)
  if tagged:
    if text == 'None':
      return None
    return _Coerce(value, current, text)
  if text == 'None':
    return None
  if isinstance(current, str) and not isinstance(current, bool):
    if text[:1] in ('"', "'"):
      value = _LiteralEval(text)
      if not isinstance(value, str):
        raise ParamsTextError(f'expected a string, got {text!r}')
      return value
    return text
  if isinstance(current, bool):
    low = text.lower()
    if low in ('true', 'false'):
      return low == 'true'
    raise ParamsTextError(f'expected a bool (True/False), got {text!r}')
  value = _LiteralEval(text)
  return _Coerce(value, current, text)


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
      return float(value)
  elif isinstance(current, (list, tuple)):
    if isinstance(value, (list, tuple)):
      return type(current)(value)
  elif isinstance(current, dict):
    if isinstance(value, dict):
      return value
  elif isinstance(current, type):
    if isinstance(value, type):
      return value
  elif _IsDType(current):
    if _IsDType(value):
      return value
  elif isinstance(current, np.ndarray):
    if isinstance(value, np.ndarray):
      return value
    if isinstance(value, (list, tuple)):
      try:
        return np.array(value, dtype=current.dtype)
      except (TypeError, ValueError, OverflowError) as e:
        raise ParamsTextError(f'bad array {text!r}: {e}') from None
  elif isinstance(current, Params):
    raise ParamsTextError('cannot assign a value to nested Params')
  else:
    if type(value) is type(current):
      return value
  raise ParamsTextError(f'expected {type(current).__name__}, got {text!r}')


def TextDiff(a, b):
  """Lines that differ between two Params' texts: `-key : old` / `+key : new`.

  Used to log what an override changed.
  """
  ta = dict(_TextItems(a))
  tb = dict(_TextItems(b))
  out = []
  for key in sorted(set(ta) | set(tb)):
    if ta.get(key) != tb.get(key):
      if key in ta:
        out.append(f'-{key} : {ta[key]}')
      if key in tb:
        out.append(f'+{key} : {tb[key]}')
  return '\n'.join(out) + ('\n' if out else '')


def _TextItems(p):
  for line in p.ToText().splitlines():
    key, _, value = line.partition(' : ')
    yield key, value
