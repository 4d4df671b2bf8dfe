"""`NestedMap`: a dict with attribute access, the container for theta and
batches. Works with `tf.nest` (it is a dict, flattened in sorted-key order).
"""

import re

_KEY_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


class NestedMap(dict):
  """A dict whose keys are identifiers, readable as attributes.

  Values may be NestedMaps, lists/tuples or leaves. `Flatten` lists leaves
  in sorted-key order, `Pack` rebuilds the structure from such a list,
  `FlattenItems` pairs each leaf with its dotted key (`a.b[0].c`).
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    for key in self:
      _CheckKey(key)

  def __setitem__(self, key, value):
    _CheckKey(key)
    super().__setitem__(key, value)

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(
          f'{name!r} not in NestedMap; keys: {sorted(self.keys())}') from None

  def __setattr__(self, name, value):
    self[name] = value

  def __delattr__(self, name):
    try:
      del self[name]
    except KeyError:
      raise AttributeError(name) from None

  def copy(self):
    """Shallow copy that stays a NestedMap."""
    return NestedMap(self)

  def DeepCopy(self):
    """Copies the structure (containers), sharing the leaves."""
    return self.Pack(self.Flatten())

  def FlattenItems(self):
    """[(dotted key, leaf)] in sorted-key order."""
    out = []
    _FlattenItems(self, '', out)
    return out

  def Flatten(self):
    """Leaves in sorted-key order."""
    return [v for _, v in self.FlattenItems()]

  def Pack(self, leaves):
    """A structure like self with leaves taken in order from `leaves`."""
    it = iter(leaves)
    result = _Pack(self, it)
    if next(it, _END) is not _END:
      raise ValueError('Pack got more leaves than the structure has.')
    return result

  def Transform(self, fn):
    """A same-structure NestedMap with `fn(leaf)` at every leaf."""
    return self.Pack([fn(v) for v in self.Flatten()])

  def IsCompatible(self, other):
    """True if `other` has the same structure (keys and nesting)."""
    if not isinstance(other, NestedMap):
      return False
    return ([k for k, _ in self.FlattenItems()] ==
            [k for k, _ in other.FlattenItems()])

  def Filter(self, fn):
    """A NestedMap keeping only leaves where `fn(leaf)` is true."""
    out = NestedMap()
    for key in sorted(self):
      v = self[key]
      if isinstance(v, NestedMap):
        sub = v.Filter(fn)
        if sub:
          out[key] = sub
      elif fn(v):
        out[key] = v
    return out

  def DebugString(self):
    return '\n'.join(f'{k}\t{v}' for k, v in self.FlattenItems())


_END = object()


def _CheckKey(key):
  if not isinstance(key, str) or not _KEY_RE.match(key):
    raise ValueError(f'NestedMap keys must be identifiers, got {key!r}')
  if key in dir(NestedMap):
    raise ValueError(f'{key!r} is reserved in NestedMap')


def _FlattenItems(value, prefix, out):
  if isinstance(value, NestedMap):
    for key in sorted(value):
      _FlattenItems(value[key], f'{prefix}.{key}' if prefix else key, out)
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      _FlattenItems(v, f'{prefix}[{i}]', out)
  else:
    out.append((prefix, value))


def _Pack(structure, it):
  if isinstance(structure, NestedMap):
    return NestedMap({k: _Pack(structure[k], it) for k in sorted(structure)})
  if isinstance(structure, (list, tuple)):
    return type(structure)(_Pack(v, it) for v in structure)
  try:
    return next(it)
  except StopIteration:
    raise ValueError('Pack got fewer leaves than the structure has.') from None


def FlattenMetrics(metrics, prefix=''):
  """Sorted [(name, value)] of a (nested) dict/NestedMap, for summaries.

  Nested keys join with '_' (`a.b[0]` -> `a_b_0`), after `prefix_` when a
  prefix is given. Values keep their shape: scalars become scalar
  summaries, per-expert vectors histograms (train/summaries.py).
  """
  out = []
  for key, value in NestedMap(metrics).FlattenItems():
    name = key.replace('.', '_').replace('[', '_').replace(']', '')
    out.append((f'{prefix}_{name}' if prefix else name, value))
  return sorted(out, key=lambda item: item[0])
