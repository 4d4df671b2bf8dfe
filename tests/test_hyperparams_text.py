"""ToText/FromText: exact round trips, typed parsing, errors, no eval."""

import os
import random

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
  text = 'i : 4\n\n# comment\n' + line + '\n'
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
      ok += 1
    except ParamsTextError:
      failed += 1
  # Both outcomes occur, so the generator exercises the parser.
  assert ok > 20 and failed > 500


def test_text_to_value_unparseable_forms():
  with pytest.raises(ParamsTextError):
    hyperparams.TextToValue('ndarray/notadtype/[1]', None)
  assert hyperparams.TextToValue('ndarray/float32/[1, 2]', None).dtype == (
      np.float32)
  with pytest.raises(TypeError, match='has no text form'):
    hyperparams.ValueToText(object())


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(st.text(max_size=80))
def test_arbitrary_text_raises_only_params_text_error(text):
  p = _AllTypes()
  try:
    p.FromText(text)
  except ParamsTextError:
    pass
