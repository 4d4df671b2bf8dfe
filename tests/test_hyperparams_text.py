"""ToText/FromText: exact round trips, typed parsing, errors, no eval, no
imports, bounded messages."""

import os
import random
import sys

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

from lingshard import hyperparams
from lingshard import model_registry
from lingshard.hyperparams import Params
from lingshard.hyperparams import ParamsTextError
from lingshard.layers import linear
from lingshard.weight_init import WeightInit


def _AllTypes():
  p = Params()
  p.Define('b', True, '')
  p.Define('i', 3, '')
  p.Define('f', 0.1, '')
  p.Define('s', 'hello world', '')
  p.Define('n', None, '')
  p.Define('lst', [1, 2.5, 'x'], '')
  p.Define('tup', (1, (2, 3)), '')
  p.Define('d', {'a': 1, 'b': [2, 3]}, '')
  p.Define('dt', tf.bfloat16, '')
  p.Define('klass', linear.LinearLayer, '')
  p.Define('arr', np.arange(6, dtype=np.int32).reshape(2, 3), '')
  p.Define('init', WeightInit.Gaussian(0.02, seed=7), '')
  sub = linear.LinearLayer.Params().Set(input_dim=4, output_dim=8)
  p.Define('sub', sub, '')
  p.Define('stack', [sub.Copy(), sub.Copy().Set(output_dim=2)], '')
  return p


def _AssertTyped(value, default, key):
  """`value` is None or of the type of `default` (recursing into Params)."""
  if value is None or default is None:
    return
  if isinstance(default, type):
    assert isinstance(value, type), key
    return
  assert type(value) is type(default), (key, value)
  if isinstance(default, Params):
    for name, v in value:
      _AssertTyped(v, default.Get(name), f'{key}.{name}')
  elif isinstance(default, list) and all(isinstance(d, Params)
                                         for d in default):
    for i, (v, d) in enumerate(zip(value, default)):
      _AssertTyped(v, d, f'{key}[{i}]')


def _AssertRoundTripsTyped(p):
  """`p` (parsed into `_AllTypes()`) writes text that reads back as `p`, and
  each value has its default's type."""
  text = p.ToText()
  q = _AllTypes()
  q.FromText(text)
  assert q == p, text
  assert q.ToText() == text
  _AssertTyped(p, _AllTypes(), 'p')


def test_to_text_is_sorted_dotted_lines():
  p = _AllTypes()
  text = p.ToText()
  keys = [line.split(' : ')[0] for line in text.splitlines()]
  assert keys == sorted(keys)
  assert 'dt : tf.bfloat16' in text.splitlines()
  assert 'klass : type/lingshard.layers.linear/LinearLayer' in text
  assert "arr : ndarray/int32/[[0, 1, 2], [3, 4, 5]]" in text
  assert 'sub.cls : type/lingshard.layers.linear/LinearLayer' in text
  assert 'stack[1].output_dim : 2' in text


def test_round_trip_all_types_exact():
  p = _AllTypes()
  q = _AllTypes()
  # Scramble q, then restore it from p's text.
  q.Set(b=False, i=0, f=9.0, s='', n=5, lst=[], tup=(), d={}, dt=tf.float32,
        arr=np.zeros([2, 3], np.int32), init=WeightInit.Xavier(),
        **{'sub.input_dim': 1, 'stack[1].output_dim': 9})
  q.FromText(p.ToText())
  assert q == p
  assert q.ToText() == p.ToText()
  assert isinstance(q.tup, tuple) and q.dt == tf.bfloat16


def test_every_registered_model_round_trips():
  keys = model_registry.ListModels()
  assert 'toy.FFRegression' in keys
  for key in keys:
    for dataset in ('Train', 'Dev', 'Test'):
      p = model_registry.GetParams(key, dataset)
      text = p.ToText()
      q = model_registry.GetParams(key, dataset)
      q.FromText(text)
      assert q == p, key
      assert q.ToText() == text, key


def test_type_conversion_follows_current_value():
  p = _AllTypes()
  p.FromText('i : 7\nf : 2\nb : false\ns : plain text\nn : [1, 2]')
  assert p.i == 7 and p.f == 2.0 and isinstance(p.f, float)
  assert p.b is False and p.s == 'plain text' and p.n == [1, 2]
  p.FromText("s : 'quoted # not a comment'")
  assert p.s == 'quoted # not a comment'
  p.FromText('n : None\ndt : None')
  assert p.n is None and p.dt is None
  p.FromText('dt : tf.float16')  # None accepts any form.
  assert p.dt == tf.float16


@pytest.mark.parametrize('line,message', [
    ('i : 1.5', "expected int, got '1.5'"),
    ('i : hello', "not a literal: 'hello'"),
    ('b : 1', "expected a bool (True/False), got '1'"),
    ('lst : 3', "expected list, got '3'"),
    ('dt : tf.nonsense', "unknown dtype 'tf.nonsense'"),
    ('klass : type/os/system', "class module 'os' is not in lingshard"),
    ('sub : 3', 'cannot assign a value to nested Params'),
    ('sub.cls : type/lingshard.layers.base_layer/BaseLayer',
     'change the class in code, not text'),
    ('no_such_key : 1', "Unknown param 'no_such_key'"),
    ('just words', 'expected "dotted.key : value"'),
])
def test_malformed_line_error_quotes_line_number_and_text(line, message):
  p = _AllTypes()
  text = 's : four\n\n# comment\n' + line + '\n'
  with pytest.raises(ParamsTextError) as e:
    p.FromText(text)
  assert str(e.value).startswith(f'line 4: {line!r}: ')
  assert message in str(e.value)


def test_from_text_never_runs_code(tmp_path):
  marker = tmp_path / 'pwned'
  payload = f"__import__('os').system('touch {marker}')"
  p = _AllTypes()
  # A str param keeps it as text; any other type rejects it.
  p.FromText(f's : {payload}')
  assert p.s == payload
  for key in ('i', 'f', 'lst', 'd', 'n', 'arr', 'klass', 'dt', 'init'):
    with pytest.raises(ParamsTextError):
      p.FromText(f'{key} : {payload}')
  for payload2 in (f'WeightInit(method={payload})',
                   f'ndarray/int32/{payload}',
                   f'type/lingshard/{payload}',
                   "(lambda: __import__('os'))()"):
    with pytest.raises(ParamsTextError):
      p.FromText(f'init : {payload2}')
  assert not marker.exists()
  assert not os.path.exists(str(marker))


_NOT_IMPORTED = 'numpy.lib.recfunctions'  # Importable, harmless, unused.


def test_class_text_never_imports_a_module(monkeypatch):
  monkeypatch.delitem(sys.modules, _NOT_IMPORTED, raising=False)
  text = f'type/{_NOT_IMPORTED}/X'
  not_imported = (f"class module '{_NOT_IMPORTED}' is not imported; params "
                  'text never imports a module, so name a class of a module '
                  'the code already imports')
  p = _AllTypes()
  for key in ('klass', 'n'):  # Class-valued, and None (takes any form).
    with pytest.raises(ParamsTextError) as e:
      p.FromText(f'{key} : {text}')
    assert str(e.value) == f"line 1: '{key} : {text}': {not_imported}"
  with pytest.raises(ParamsTextError) as e:
    p.FromText(f'i : {text}')
  assert str(e.value) == f"line 1: 'i : {text}': expected int, got '{text}'"
  p.FromText(f's : {text}')  # A str param keeps unquoted text as text.
  assert p.s == text
  assert _NOT_IMPORTED not in sys.modules
  # Module attributes are not followed: numpy's __getattr__ imports.
  monkeypatch.delitem(sys.modules, 'numpy.matlib', raising=False)
  if 'matlib' in vars(np):  # hasattr() would import it.
    monkeypatch.delattr(np, 'matlib')
  with pytest.raises(ParamsTextError) as e:
    p.FromText('klass : type/numpy/matlib.matrix')
  assert str(e.value) == ("line 1: 'klass : type/numpy/matlib.matrix': "
                          "module 'numpy' has no class 'matlib.matrix'")
  assert 'numpy.matlib' not in sys.modules
  p.FromText('klass : type/lingshard.layers.base_layer/BaseLayer\n'
             'n : type/numpy/ndarray')
  assert p.klass.__name__ == 'BaseLayer' and p.n is np.ndarray


_NONFINITE = ('use a finite number (only a param whose default is inf or nan '
              'takes one)')


@pytest.mark.parametrize('line,message', [
    ('f : 1e999', f"'1e999' gives a non-finite float (inf); {_NONFINITE}"),
    ("f : float('nan')",
     f'"float(\'nan\')" gives a non-finite float (nan); {_NONFINITE}'),
    ('n : -1e999', f"'-1e999' gives a non-finite float (-inf); {_NONFINITE}"),
    ('lst : [1, 1e999]',
     f"'[1, 1e999]' gives a non-finite float (inf); {_NONFINITE}"),
    ("init : WeightInit(method='xavier', scale=1e999)",
     '"WeightInit(method=\'xavier\', scale=1e999)" gives a non-finite float '
     f'(inf); {_NONFINITE}'),
    ('arr : ndarray/float32/[1e39]',
     "'ndarray/float32/[1e39]' gives a non-finite float; use finite numbers"),
    ('f : 1' + '0' * 400,
     "'1" + '0' * 79 + "'... (401 chars) is out of float range; use a smaller "
     'number'),
    ('i : 0x' + 'f' * 4000,
     "'0x" + 'f' * 78 + "'... (4002 chars) gives an int of more than 4300 "
     'digits; use a smaller number'),
    ('n : 1j', "'1j' cannot be written back as params text (value 1j of type "
     'complex has no text form); use a plain literal'),
    ("n : ndarray/datetime64/['2020-01-01']",
     "\"ndarray/datetime64/['2020-01-01']\" cannot be written back as params "
     "text (bad ndarray text 'ndarray/datetime64[D]/[datetime.date(2020, 1, "
     "1)]'); use a plain literal"),
    ('sub : None', 'cannot assign a value to nested Params'),
    ('stack : None', 'cannot assign a value to nested Params'),
    ('stack : [1, 2]', 'cannot assign a value to nested Params'),
])
def test_text_that_cannot_be_written_back_is_refused(line, message):
  p = _AllTypes()
  before = p.ToText()
  with pytest.raises(ParamsTextError) as e:
    p.FromText(line)
  quoted = repr(line) if len(line) <= 80 else (
      f'{line[:80]!r}... ({len(line)} chars)')
  assert str(e.value) == f'line 1: {quoted}: {message}'
  assert p.ToText() == before


def test_nonfinite_default_takes_and_writes_nonfinite():
  def Make():
    p = Params()
    p.Define('clip', float('inf'), '')
    p.Define('floor', float('nan'), '')
    return p

  p = Make()
  text = p.ToText()
  assert text == "clip : float('inf')\nfloor : float('nan')\n"
  q = Make().FromText('clip : 5\nfloor : 0.5')
  assert (q.clip, q.floor) == (5.0, 0.5)
  q.FromText(text)
  assert q == p and q.ToText() == text
  q.FromText('clip : 1e999')  # The default is inf, whatever the value now.
  assert q.clip == float('inf')


def test_every_value_parsed_reads_back_as_itself():
  p = _AllTypes()
  p.FromText("f : 1e308\ni : 0x1f\nn : {1: (2, [3.5, 'x'])}\n"
             "init : WeightInit('gaussian', 2, 0x10)\nlst : [-0.0, 1e-320]\n"
             'arr : ndarray/float64/[0.1, 2.5e-300]\ns : type/os/system')
  _AssertRoundTripsTyped(p)
  assert p.i == 31 and p.init == WeightInit.Gaussian(2.0, seed=16)


def test_duplicate_key_is_an_error():
  p = _AllTypes()
  for text, line in [('i : 1\nf : 2.0\ni = 2', "line 3: 'i = 2': 'i'"),
                     ('stack[1].output_dim : 1\nstack[01].output_dim : 2',
                      "line 2: 'stack[01].output_dim : 2': "
                      "'stack[01].output_dim'"),
                     ('sub.cls : type/lingshard.layers.linear/LinearLayer\n\n'
                      'sub.cls : type/lingshard.layers.linear/LinearLayer',
                      "line 3: 'sub.cls : type/lingshard.layers.linear/"
                      "LinearLayer': 'sub.cls'")]:
    with pytest.raises(ParamsTextError) as e:
      p.FromText(text)
    assert str(e.value) == (f'{line} is already set on line 1; keep one '
                            'of the two')


def test_leading_bom_is_skipped():
  p = _AllTypes().FromText('\ufeffi : 5\nf : 0.5\n')
  assert (p.i, p.f) == (5, 0.5)
  with pytest.raises(ParamsTextError, match=r"^line 2: '\\ufeffi : 5': "):
    _AllTypes().FromText('f : 0.5\n\ufeffi : 5')  # Only at the start.


def test_long_bad_line_gives_a_bounded_message():
  value = 'x' * 1_000_000
  with pytest.raises(ParamsTextError) as e:
    _AllTypes().FromText(f'i : {value}')
  assert str(e.value) == (
      f"line 1: 'i : {'x' * 76}'... (1000004 chars): not a literal: "
      f"'{'x' * 80}'... (1000000 chars) (ValueError)")
  for line in (f'{value} : 1', f"init : WeightInit('{value}')",
               f'stack[{"9" * 100_000}].x : 1', f'lst : [{value}]',
               f'klass : type/lingshard/{value}'):
    with pytest.raises(ParamsTextError) as e:
      _AllTypes().FromText(line)
    assert len(str(e.value)) < 1200, str(e.value)[:2000]


def _RandomText(rng):
  keys = ['b', 'i', 'f', 's', 'n', 'lst', 'tup', 'd', 'dt', 'klass', 'arr',
          'init', 'sub.input_dim', 'sub.cls', 'stack[0].activation',
          'stack[5].x', 'zz', 'sub']
  atoms = ['1', '-2.5', 'True', 'None', "'x'", '[', ']', '(', ')', '{', '}',
           ':', ',', '=', 'tf.', 'float32', 'type/', 'lingshard', '/',
           'ndarray/', 'int32', 'WeightInit(', 'method=', "'gaussian'",
           '__import__', '.', 'os', 'lambda', '1e999', '"', '\\', '#',
           '[[1,2],[3]]', '\x00', 'é', ' ', '*', '**', '0x10', 'scale=']
  lines = []
  for _ in range(rng.randint(1, 4)):
    if rng.random() < 0.1:
      lines.append(''.join(rng.choice(atoms) for _ in range(rng.randint(0, 6))))
      continue
    sep = rng.choice([' : ', '=', ':', ' = '])
    value = ''.join(rng.choice(atoms) for _ in range(rng.randint(0, 6)))
    lines.append(rng.choice(keys) + sep + value)
  return '\n'.join(lines)


def test_fuzz_parser_raises_only_its_own_error():
  rng = random.Random(20261121)
  ok = failed = 0
  for _ in range(1500):
    p = _AllTypes()
    try:
      p.FromText(_RandomText(rng))
    except ParamsTextError:
      failed += 1
      continue
    ok += 1
    _AssertRoundTripsTyped(p)
  # Both outcomes occur, so the generator exercises the parser.
  assert ok > 20 and failed > 500


def test_text_to_value_unparseable_forms():
  with pytest.raises(ParamsTextError):
    hyperparams.TextToValue('ndarray/notadtype/[1]', None)
  assert hyperparams.TextToValue('ndarray/float32/[1, 2]', None).dtype == (
      np.float32)
  with pytest.raises(TypeError, match='has no text form'):
    hyperparams.ValueToText(object())


_FUZZ_KEYS = ('b', 'i', 'f', 's', 'n', 'lst', 'tup', 'd', 'dt', 'klass', 'arr',
              'init', 'sub.input_dim', 'sub.cls', 'stack[1].output_dim', 'sub')
# Whole values (good and bad) and fragments to glue together.
_FUZZ_VALUES = ('1', '-2.5', '1e999', '-1e999', "float('inf')", "float('nan')",
                '0x' + 'f' * 3700, 'True', 'false', 'None', "'x'", 'plain',
                '[1, 2.5]', '[1e999]', '(1, (2, 3))', "{'a': 1}", '{1: 1j}',
                '1j', 'tf.float32', 'tf.bfloat16', 'tf.nope',
                'type/lingshard.layers.linear/LinearLayer',
                'type/lingshard.layers.base_layer/BaseLayer',
                'type/numpy/ndarray', 'type/numpy/matlib.matrix',
                'type/os/system', 'ndarray/float32/[1e39]',
                'ndarray/int32/[[1, 2], [3, 4]]', 'ndarray/int8/[1000]',
                "WeightInit(method='xavier', scale=1e999)",
                "WeightInit('gaussian', 0.5, 3)", '[[1, 2], [3, 4]]')
_FUZZ_ATOMS = ('1', '-2.5', '1e999', 'True', 'None', "'x'", '[', ']', '(',
               ')', '{', '}', ',', ':', '1j', 'tf.', 'float32', 'type/',
               'lingshard.layers.linear', '/', 'LinearLayer', 'ndarray/',
               'WeightInit(', "method='xavier'", 'scale=', ' ')


@st.composite
def _KeyValueLines(draw):
  lines = []
  for _ in range(draw(st.integers(1, 2))):
    whole = st.sampled_from(_FUZZ_VALUES)
    value = draw(st.one_of(
        whole, whole,
        st.lists(st.sampled_from(_FUZZ_ATOMS), max_size=5).map(''.join)))
    lines.append(draw(st.sampled_from(_FUZZ_KEYS)) +
                 draw(st.sampled_from([' : ', '=', ':'])) + value)
  return '\n'.join(lines)


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=80), _KeyValueLines()))
def test_arbitrary_text_raises_only_params_text_error(text):
  p = _AllTypes()
  try:
    p.FromText(text)
  except ParamsTextError:
    return
  _AssertRoundTripsTyped(p)
