"""Params: Define/Set/Get/dotted/nested/Copy/Freeze/Delete/equality."""

import numpy as np
import pytest

from lingshard import hyperparams
from lingshard.hyperparams import FrozenParamsError
from lingshard.hyperparams import Params
from lingshard.hyperparams import UnknownParamError


def _Nested():
  p = Params()
  p.Define('num_layers', 2, 'Layers.')
  p.Define('dim', 16, 'Model dim.')
  enc = Params()
  enc.Define('num_layers', 6, 'Encoder layers.')
  enc.Define('dropout', 0.1, 'Dropout.')
  p.Define('encoder', enc, 'Encoder params.')
  return p


def test_define_and_access():
  p = _Nested()
  assert p.num_layers == 2
  p.num_layers = 4
  assert p.num_layers == 4
  assert 'dim' in p and 'nope' not in p
  assert dict(p)['dim'] == 16
  assert [k for k, _ in p] == ['num_layers', 'dim', 'encoder']
  assert p.Description('dim') == 'Model dim.'


def test_define_rejects_bad_and_duplicate_names():
  p = Params()
  with pytest.raises(ValueError, match=r"Param name '1x' is not a valid"):
    p.Define('1x', 0, '')
  p.Define('x', 0, '')
  with pytest.raises(AttributeError, match=r"Param 'x' is already defined"):
    p.Define('x', 1, '')
  with pytest.raises(AttributeError, match='reserved'):
    p.Define('Set', 1, '')


def test_set_dotted_returns_self_and_get():
  p = _Nested()
  q = p.Set(dim=32, **{'encoder.num_layers': 12})
  assert q is p
  assert p.encoder.num_layers == 12
  assert p.Get('encoder.num_layers') == 12
  assert p.Get('dim') == 32


def test_params_list_dotted_index():
  p = Params()
  a, b = Params(), Params()
  a.Define('x', 1, '')
  b.Define('x', 2, '')
  p.Define('stack', [a, b], '')
  p.Set(**{'stack[1].x': 5})
  assert p.Get('stack[1].x') == 5 and p.stack[0].x == 1
  with pytest.raises(UnknownParamError, match=r'no element 7 in stack'):
    p.Get('stack[7].x')


def test_unknown_key_suggests_close_matches():
  p = _Nested()
  with pytest.raises(UnknownParamError) as e:
    _ = p.num_layer
  assert str(e.value) == ("Unknown param 'num_layer'; did you mean "
                          "'num_layers'?")
  with pytest.raises(UnknownParamError) as e:
    p.Set(**{'encoder.dropuot': 0.2})
  assert str(e.value) == ("Unknown param 'encoder.dropuot'; did you mean "
                          "'dropout'?")
  with pytest.raises(UnknownParamError) as e:
    p.Set(zzz=1)
  assert str(e.value) == ("Unknown param 'zzz'; known keys: dim, encoder, "
                          'num_layers')
  # Unknown keys are AttributeErrors, so hasattr() works.
  assert not hasattr(p, 'zzz')


def test_copy_is_deep_and_keeps_cls():
  class Foo:
    def __init__(self, params, extra=0):
      self.params = params
      self.extra = extra

  p = hyperparams.InstantiableParams(Foo)
  p.Define('sub', _Nested(), '')
  p.Define('mesh', np.arange(4).reshape(2, 2), '')
  q = p.Copy()
  assert q.cls is Foo and q == p
  q.sub.encoder.num_layers = 99
  q.mesh[0, 0] = 7
  assert p.sub.encoder.num_layers == 6 and p.mesh[0, 0] == 0
  assert q != p
  obj = q.Instantiate(extra=3)
  assert isinstance(obj, Foo) and obj.params is q and obj.extra == 3


def test_freeze_blocks_every_mutation():
  p = _Nested().Freeze()
  assert p.frozen and p.encoder.frozen
  for mutate in (lambda: setattr(p, 'dim', 1),
                 lambda: p.Set(dim=1),
                 lambda: p.Set(**{'encoder.dropout': 0.0}),
                 lambda: setattr(p.encoder, 'dropout', 0.0),
                 lambda: p.Define('new', 1, ''),
                 lambda: p.Delete('dim'),
                 lambda: p.FromText('dim : 3')):
    with pytest.raises(FrozenParamsError, match='frozen'):
      mutate()
  q = p.Copy()
  q.dim = 1  # A copy is mutable again.
  assert q.dim == 1 and p.dim == 16


def test_delete():
  p = _Nested()
  p.Delete('dim', 'encoder.dropout')
  assert 'dim' not in p and 'dropout' not in p.encoder
  with pytest.raises(UnknownParamError) as e:
    p.Delete('dim')
  assert str(e.value) == "Unknown param 'dim'; known keys: encoder, num_layers"


def test_equality():
  a, b = _Nested(), _Nested()
  assert a == b
  b.encoder.dropout = 0.2
  assert a != b
  c = _Nested()
  c.Define('mesh', np.arange(2), '')
  d = _Nested()
  d.Define('mesh', np.arange(2), '')
  assert c == d
  d.mesh = np.arange(2).astype(np.int32)
  assert c != d  # Same numbers, different dtype.
  assert _Nested() != hyperparams.InstantiableParams(dict)


def test_text_diff():
  a = _Nested()
  b = a.Copy().Set(dim=64, **{'encoder.dropout': 0.3})
  assert hyperparams.TextDiff(a, b) == (
      '-dim : 16\n+dim : 64\n-encoder.dropout : 0.1\n'
      '+encoder.dropout : 0.3\n')
  assert hyperparams.TextDiff(a, a.Copy()) == ''
