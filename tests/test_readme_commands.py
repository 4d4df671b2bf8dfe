"""README.md's commands are tests: every shell command of the README (but
the set-up block) and its python snippet, run as written, in README order
within its group (tests/readme_checks.py: the groups, the runner and the
checks; each group's module runs on its own pytest-xdist worker).

This module: the README's python snippet and the MT tour (prepare, stats,
train, eval, decode, export, print_params, list_models); that every README
command has a check and a group; in an empty directory, the README's
trainer and spmd_check commands say in one line that the corpus is missing
and how to prepare it; the pins file format (`LINGSHARD_WHEEL_PINS`) that
points `prepare` at the test wheel.

The set-up block (`make demo`, `make test`) is not run: it builds the
environment this test runs in, and the demo trains for minutes.
"""

import json
import os
import re
import subprocess

import pytest

from lingshard.data import wheels
from tests import readme_checks as rc
from tests import readme_testlib as lib

COMMANDS = rc.COMMANDS
GROUP = 'mt'


ran, test_readme_command = rc.GroupTests(GROUP, snippets=True)


def test_readme_has_every_checked_command():
  assert [c.argv for c in rc.SETUP] == [['make', 'demo'], ['make', 'test']]
  keys = [c.key for c in COMMANDS]
  assert sorted(set(keys)) == sorted(rc.CHECKS), (
      'README commands and CHECKS differ: '
      f'{sorted(set(keys) ^ set(rc.CHECKS))}')
  assert keys[0] == rc.PREPARE  # The rest need its output.
  assert len(rc.SNIPPETS) == 1
  # Every group has its module, and every command a group.
  tests_dir = os.path.dirname(os.path.abspath(__file__))
  for group in rc.GROUPS:
    name = ('test_readme_commands.py' if group == GROUP else
            f'test_readme_{group}.py')
    assert os.path.isfile(os.path.join(tests_dir, name)), name
    assert rc.GroupCommands(group), group
  assert sum(len(rc.GroupCommands(g)) for g in rc.GROUPS) == len(COMMANDS)


def test_readme_python_snippet(ran):
  (r,) = [r for r in ran.values() if r.command.section == rc.SNIPPET_KEY]
  assert r.proc.returncode == 0, r.Why()
  rc.CheckSnippet(r)


# --------------------------------------------------------- no prepared data
@pytest.mark.parametrize('key,prog,model,prepare,train_file', [
    ('trainer --mode=train', 'lingshard.trainer', 'm4.', 'lingshard.data.prepare',
     'data/ui_m4/train.tsv'),
    ('lingshard.tools.spmd_check', 'spmd_check', 'm4.', 'lingshard.data.prepare',
     'data/ui_m4/train.tsv'),
    ('trainer --mode=train', 'lingshard.trainer', 'lm1b.',
     'lingshard.data.lm_prepare', 'data/lm_en/train.txt'),
    ('lingshard.tools.spmd_check', 'spmd_check', 'lm1b.',
     'lingshard.data.lm_prepare', 'data/lm_en/train.txt'),
])
def test_readme_command_without_data_says_how_to_prepare(
    tmp_path, key, prog, model, prepare, train_file):
  command = next(c for c in COMMANDS if c.key == key and
                 lib.Flag(c.argv, 'model').startswith(model))
  proc = subprocess.run(lib.Executable(command.argv), cwd=str(tmp_path),
                        env=lib.Env(), capture_output=True, text=True,
                        timeout=rc.TIMEOUT, check=False)
  prepare = rc.First(prepare).line
  lines = lib.OwnStderrLines(proc.stderr)
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert len(lines) == 1, proc.stderr[-3000:]
  assert re.fullmatch(
      rf'{prog}: error: (no corpus file matches|corpus file not found:) '
      rf'{re.escape(train_file)}; prepare the corpus with: '
      rf'{re.escape(prepare)}', lines[0]), lines[0]
  assert sorted(os.listdir(tmp_path)) == []  # Nothing written.


# ------------------------------------ $LINGSHARD_WHEEL_PINS (used above)
def test_pins_file_replaces_the_builtin_pins(tmp_path, monkeypatch, capsys):
  cache = str(tmp_path / 'cache')
  pins_file, pin = lib.BuildWheelCache(cache)
  assert lib.PINS_ENV == wheels.PINS_ENV
  monkeypatch.delenv(lib.PINS_ENV, raising=False)
  assert wheels.Pins() == wheels.PINS
  monkeypatch.setenv(lib.PINS_ENV, pins_file)
  assert wheels.Pins() == (pin,)
  assert wheels.EnsureWheels(cache, allow_download=False) == [
      os.path.join(cache, pin.filename)]
  assert capsys.readouterr().err == (
      f'wheels ({lib.PINS_ENV}={pins_file}): polyui 1.0\n')


_SHA = 'ab' * 32
_PIN = dict(name='p', version='1', filename='p-1-py3-none-any.whl',
            sha256=_SHA, licence='MIT')


@pytest.mark.parametrize('content,message', [
    ('[', 'not a JSON file: Expecting value: line 1 column 2 (char 1)'),
    ('[]', 'expected a non-empty JSON list of pins (objects with the keys '
     'name, version, filename, sha256, licence)'),
    (json.dumps(_PIN), 'expected a non-empty JSON list of pins (objects with '
     'the keys name, version, filename, sha256, licence)'),
    ('[1]', 'pin 0: expected an object with the keys name, version, filename, '
     'sha256, licence, got int'),
    (json.dumps([_PIN, {k: v for k, v in _PIN.items() if k != 'sha256'}]),
     'pin 1: missing key(s) sha256; a pin has exactly the keys name, version, '
     'filename, sha256, licence'),
    (json.dumps([dict(_PIN, url='x')]),
     'pin 0: unknown key(s) url; a pin has exactly the keys name, version, '
     'filename, sha256, licence'),
    (json.dumps([dict(_PIN, version=1)]),
     'pin 0: version must be a non-empty string, got 1'),
    (json.dumps([dict(_PIN, filename='../p-1-py3-none-any.whl')]),
     "pin 0: filename must be a plain *.whl file name, got "
     "'../p-1-py3-none-any.whl'"),
    (json.dumps([dict(_PIN, sha256='AB' * 32)]),
     f"pin 0: sha256 must be 64 lower-case hex digits, got '{'AB' * 32}'"),
])
def test_pins_file_errors_are_one_line(tmp_path, monkeypatch, content,
                                       message):
  path = tmp_path / 'pins.json'
  path.write_text(content)
  monkeypatch.setenv(lib.PINS_ENV, str(path))
  with pytest.raises(wheels.WheelError) as e:
    wheels.EnsureWheels(str(tmp_path / 'cache'), allow_download=False)
  assert str(e.value) == f'{lib.PINS_ENV}={path}: {message}'


def test_missing_pins_file(tmp_path, monkeypatch):
  path = tmp_path / 'nope.json'
  monkeypatch.setenv(lib.PINS_ENV, str(path))
  with pytest.raises(wheels.WheelError) as e:
    wheels.Pins()
  assert str(e.value) == (f'{lib.PINS_ENV}={path}: cannot read the pins '
                          'file: No such file or directory')
