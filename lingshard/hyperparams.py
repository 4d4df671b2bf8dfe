"""Lingvo-style hyper-parameters: `Params`, `InstantiableParams`, text round trip.

A `Params` is an ordered set of named, documented values. Values may be nested
`Params`, lists/tuples of `Params`, or plain values (None, bool, int, float,
str, list/tuple/dict of literals, TF dtypes, classes, numpy arrays and
`WeightInit`). `ToText()` writes one sorted `dotted.key : value` line per leaf;
`FromText()` applies such lines back, converting each value to the type of the
current value (the value grammar is in `lingshard/params_text.py`). Parsing
never evaluates code and never imports a module.
"""

import copy
import difflib
import re

from lingshard import params_text
from lingshard.params_text import CLASS_ALLOW_LIST  # noqa: F401 (public API)
from lingshard.params_text import IsDType
from lingshard.params_text import IsNonFiniteFloat
from lingshard.params_text import ParamsTextError
from lingshard.params_text import Quote
from lingshard.params_text import SplitLine
from lingshard.params_text import ValuesEqual

_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
# `name` or `name[3]` in a dotted key.
_KEY_PART_RE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?$')

# Error messages after `line N: '...': ` are cut to this many characters.
_MAX_DETAIL_CHARS = 1000


class UnknownParamError(AttributeError, KeyError):
  """A key that was never `Define`d; the message suggests close matches."""

  def __str__(self):
    # KeyError would quote the message; keep it readable.
    return str(self.args[0]) if self.args else ''


class FrozenParamsError(TypeError):
  """Mutation of a `Freeze()`d Params."""


class _Param:
  """One defined value with its description.

  `nonfinite_default`: the default was inf or nan, so text may set one.
  """

  __slots__ = ('name', 'value', 'description', 'nonfinite_default')

  def __init__(self, name, value, description, nonfinite_default):
    self.name = name
    self.value = value
    self.description = description
    self.nonfinite_default = nonfinite_default


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
    self._params[name] = _Param(name, default, description,
                                IsNonFiniteFloat(default))

  def _UnknownKey(self, name, full_key=None):
    keys = sorted(self._params)
    close = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
    key = full_key or name
    if close:
      hint = 'did you mean ' + ' or '.join(repr(c) for c in close) + '?'
    else:
      hint = 'known keys: ' + (', '.join(keys) if keys else '(none)')
    return UnknownParamError(f'Unknown param {Quote(key)}; {hint}')

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
    return all(ValuesEqual(self._params[k].value, other._params[k].value)
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
                                 param.description, param.nonfinite_default)
    return new

  # ------------------------------------------------------------ dotted keys
  def _Walk(self, parts, dotted):
    """Follows `name` / `name[i]` parts from self; returns the value."""
    node = self
    for i, part in enumerate(parts):
      m = _KEY_PART_RE.match(part)
      if not isinstance(node, Params):
        raise UnknownParamError(f'Unknown param {Quote(dotted)}: '
                                f'{".".join(parts[:i])} is not a Params')
      if not m or m.group(1) not in node._params:
        raise node._UnknownKey(m.group(1) if m else part, dotted)
      node = node._params[m.group(1)].value
      if m.group(2) is not None:
        index = m.group(2)
        if (not isinstance(node, (list, tuple)) or len(index) > 9 or
            int(index) >= len(node)):
          where = '.'.join(parts[:i] + [m.group(1)])
          index = index if len(index) <= 9 else index[:9] + '...'
          raise UnknownParamError(f'Unknown param {Quote(dotted)}: no element '
                                  f'{index} in {where}')
        node = node[int(index)]
    return node

  def _Resolve(self, dotted):
    """Returns (parent Params, last name) for a dotted key."""
    parts = dotted.split('.')
    node = self._Walk(parts[:-1], dotted)
    if not isinstance(node, Params):
      raise UnknownParamError(f'Unknown param {Quote(dotted)}: '
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

  def IterParams(self, prefix=''):
    """Yields (dotted key, Params) for self ('') and every nested Params
    (values and lists of Params), depth first."""
    yield prefix.rstrip('.'), self
    for name in sorted(self._params):
      value = self._params[name].value
      if isinstance(value, Params):
        yield from value.IterParams(f'{prefix}{name}.')
      elif _IsParamsList(value):
        for i, sub in enumerate(value):
          yield from sub.IterParams(f'{prefix}{name}[{i}].')

  # ------------------------------------------------------------------ text
  def _Leaves(self, prefix=''):
    """(dotted key, value, description) per leaf; a nested Params' `.cls`
    leaf carries the description of the param holding it."""
    for name in sorted(self._params):
      param = self._params[name]
      value, key = param.value, prefix + name
      if isinstance(value, Params):
        yield key + '.cls', _ClsOf(value), param.description
        yield from value._Leaves(key + '.')
      elif _IsParamsList(value):
        for i, sub in enumerate(value):
          yield f'{key}[{i}].cls', _ClsOf(sub), param.description
          yield from sub._Leaves(f'{key}[{i}].')
      else:
        yield key, value, param.description

  def ToText(self, docs=False):
    """Sorted `dotted.key : value` lines, one per leaf value; `docs`: each
    preceded by its description as a `# ` comment line (FromText skips
    comments, so the text still reads back as these params)."""
    entries = []
    for key, value, description in self._Leaves():
      if key.endswith('.cls') and value is None:
        continue
      entries.append((key, f'{key} : {ValueToText(value)}', description))
    entries.sort(key=lambda e: e[0])
    lines = []
    for _, line, description in entries:
      if docs:
        lines.append('# ' + ' '.join(str(description).split()))
      lines.append(line)
    return '\n'.join(lines) + ('\n' if lines else '')

  def FromText(self, text):
    """Applies `key : value` lines (or `key = value`) to this Params.

    Each value is converted to the type of the current value and must read
    back as itself from its `ToText` form (see `params_text.TextToValue`);
    None is refused for nested Params. A leading UTF-8 BOM, blank lines and
    lines starting with `#` are skipped; a key set twice is an error. Raises
    ParamsTextError (with the line number and text) for any bad line.
    Returns self.
    """
    self._CheckMutable()
    if not isinstance(text, str):
      raise ParamsTextError('Params text must be a str, got '
                            f'{type(text).__name__}')
    if text.startswith('\ufeff'):
      text = text[1:]
    seen = {}  # (id of the parent Params, name) -> line number.
    for lineno, raw in enumerate(text.splitlines(), 1):
      line = raw.strip()
      if not line or line.startswith('#'):
        continue
      try:
        self._ApplyLine(line, lineno, seen)
      except (ParamsTextError, UnknownParamError, FrozenParamsError,
              ValueError, TypeError, OverflowError, RecursionError) as e:
        detail = str(e)
        if len(detail) > _MAX_DETAIL_CHARS:
          detail = detail[:_MAX_DETAIL_CHARS] + '...'
        raise ParamsTextError(f'line {lineno}: {Quote(raw)}: {detail}',
                              detail) from None
    return self

  def _ApplyLine(self, line, lineno, seen):
    """Applies one `key : value` line; `seen` records the keys set so far."""
    key, value_text = SplitLine(line)
    if key.endswith('.cls'):
      node, name = _CheckClassText(self, key, value_text), 'cls'
    else:
      node, name = self._Resolve(key)
    if (id(node), name) in seen:
      raise ParamsTextError(f'{Quote(key)} is already set on line '
                            f'{seen[id(node), name]}; keep one of the two')
    seen[id(node), name] = lineno
    if name == 'cls':
      return
    param = node._params[name]
    node._CheckMutable()
    param.value = TextToValue(
        value_text, param.value,
        param.nonfinite_default or IsNonFiniteFloat(param.value))


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
  if IsDType(value):
    return value
  return copy.deepcopy(value, memo)


def _CheckClassText(root, key, value_text):
  """`x.cls : type/...` lines must name the class the code already has.

  Returns the Params at `x`.
  """
  node = root._Walk(key[:-len('.cls')].split('.'), key)  # pylint: disable=protected-access
  want = params_text.TextToValue(value_text, type)
  if not isinstance(node, InstantiableParams) or node.cls is not want:
    raise ParamsTextError(f'{key} is {ValueToText(_ClsOf(node))}, text says '
                          f'{Quote(value_text)}; change the class in code, '
                          'not text')
  return node


def ValueToText(value):
  """Text form of one leaf value (inverse of `TextToValue`)."""
  if isinstance(value, Params):
    raise TypeError('nested Params are written key by key')
  return params_text.ValueToText(value)


def TextToValue(text, current, nonfinite_ok=None):
  """`params_text.TextToValue`; refuses any value for nested Params."""
  if isinstance(current, Params) or _IsParamsList(current):
    raise ParamsTextError('cannot assign a value to nested Params')
  return params_text.TextToValue(text, current, nonfinite_ok)


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
