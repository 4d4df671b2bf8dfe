"""`--params_override` / `--params_file` (lingshard/train/overrides.py): no
imports, no comments, no duplicates, a BOM, bounded messages."""

import sys

import pytest

from lingshard import model_registry
from lingshard.train import overrides

_NOT_IMPORTED = 'numpy.lib.recfunctions'  # Importable, harmless, unused.


def _Params():
  return model_registry.GetParams('toy.FFRegression', 'Train')


def _OverrideError(text, flag='--params_override'):
  with pytest.raises(overrides.OverrideError) as e:
    overrides.ApplyOverrides(_Params(), text, flag)
  return str(e.value)


def test_class_override_never_imports_a_module(monkeypatch):
  monkeypatch.delitem(sys.modules, _NOT_IMPORTED, raising=False)
  text = f'type/{_NOT_IMPORTED}/X'
  assert _OverrideError(f'task.dtype={text}') == (
      f"--params_override 'task.dtype={text}': class module "
      f"'{_NOT_IMPORTED}' is not imported; params text never imports a "
      'module, so name a class of a module the code already imports')
  p = overrides.ApplyOverrides(_Params(), f'task.name={text}')
  assert p.task.name == text  # A str param keeps the text.
  assert _NOT_IMPORTED not in sys.modules


@pytest.mark.parametrize('text,message', [
    ('#task.train.learning_rate=5',
     "--params_override '#task.train.learning_rate=5': starts with '#', "
     "which would make it a comment; remove the '#' or the assignment"),
    ('input.batch_size=4; # input.seed=3',
     "--params_override '# input.seed=3': starts with '#', which would make "
     "it a comment; remove the '#' or the assignment"),
    ('input.batch_size=4;input.batch_size = 8',
     "--params_override 'input.batch_size = 8': 'input.batch_size' is "
     "already set by 'input.batch_size=4'; keep one of the two"),
    ('input.batch_size=4\ninput.seed=3',
     "--params_override 'input.batch_size=4\\ninput.seed=3': holds a line "
     "break; separate assignments with ';'"),
    ('task.train=None',
     "--params_override 'task.train=None': cannot assign a value to nested "
     'Params'),
    ('task.train.learning_rate=1e999',
     "--params_override 'task.train.learning_rate=1e999': '1e999' gives a "
     'non-finite float (inf); use a finite number (only a param whose '
     'default is inf or nan takes one)'),
    ('input.seed=0x' + 'f' * 4000,
     "--params_override 'input.seed=0x" + 'f' * 67 + "'... (4013 chars): '0x"
     + 'f' * 78 + "'... (4002 chars) gives an int of more than 4300 digits; "
     'use a smaller number'),
])
def test_override_errors(text, message):
  assert _OverrideError(text) == message


def test_eval_override_may_override_the_train_override():
  p = overrides.ApplyOverrides(_Params(), 'input.batch_size=4')
  overrides.ApplyOverrides(p, 'input.batch_size=8', '--eval_params_override')
  assert p.input.batch_size == 8


def test_long_override_gives_a_bounded_message():
  value = 'x' * 1_000_000
  assert _OverrideError(f'input.batch_size={value}') == (
      f"--params_override 'input.batch_size={'x' * 63}'... (1000017 chars): "
      f"not a literal: '{'x' * 80}'... (1000000 chars) (ValueError)")
  for text in (f'{value}=1', f"input.seed='{value}", f'#{value}'):
    assert len(_OverrideError(text)) < 1200


def test_params_file_bom_and_duplicates(tmp_path):
  path = tmp_path / 'params.txt'
  path.write_bytes('\ufeffinput.batch_size : 8\ninput.seed : 3\n'
                   .encode('utf-8'))
  p = overrides.ApplyParamsFile(_Params(), str(path))
  assert (p.input.batch_size, p.input.seed) == (8, 3)
  path.write_text('input.batch_size : 8\n# a comment\ninput.batch_size : 4\n')
  with pytest.raises(overrides.OverrideError) as e:
    overrides.ApplyParamsFile(_Params(), str(path))
  assert str(e.value) == (
      f"--params_file {path}: line 3: 'input.batch_size : 4': "
      "'input.batch_size' is already set on line 1; keep one of the two")
