"""Helpers of tests/test_readme_commands.py: README.md's code blocks as
commands, the environment they run in, and the lines a process printed on
stderr itself (without TF's C++ start-up log)."""

import dataclasses
import json
import os
import re
import shlex
import sys

from lingshard.data import wheels
from tests.data import conftest as data_conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, 'README.md')
SETUP_SECTION = 'Set-up'
PINS_ENV = 'LINGSHARD_WHEEL_PINS'  # = wheels.PINS_ENV (tested)

# TF / absl log records on stderr: 'I1122 15:12:27.763592 1396 file.py:440] ...'
# (C++ and Python absl), and the C++ notice printed before absl logging is
# initialised. Neither can be switched off from Python before TF loads.
_LOG_RECORD_RE = re.compile(r'^[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ')
_LOG_NOTICE = 'WARNING: All log messages before absl::InitializeLog()'


@dataclasses.dataclass
class Block:
  """A fenced code block of the README: language, section, text."""
  lang: str
  section: str
  text: str


@dataclasses.dataclass
class Command:
  """One README shell command: the line as written, its words, its key."""
  line: str
  argv: list
  section: str

  @property
  def key(self):
    return CommandKey(self.argv)


def Blocks(path=README):
  """Every fenced code block of a markdown file, in order."""
  blocks, section, lang, lines = [], '', None, []
  with open(path, encoding='utf-8') as f:
    for line in f.read().splitlines():
      if lang is None:
        if line.startswith('## '):
          section = line[3:].strip()
        elif line.startswith('```'):
          lang, lines = line[3:].strip(), []
      elif line.startswith('```'):
        blocks.append(Block(lang, section, '\n'.join(lines) + '\n'))
        lang = None
      else:
        lines.append(line)
  return blocks


def ShellCommands(text, section=''):
  """The commands of a shell block: backslash continuations joined, blank
  lines and comments dropped."""
  commands, pending = [], ''
  for raw in text.splitlines():
    if raw.rstrip().endswith('\\'):
      pending += raw.rstrip()[:-1].rstrip() + ' '
      continue
    line = (pending + raw.strip()).strip()
    pending = ''
    argv = shlex.split(line, comments=True)
    if argv:
      commands.append(Command(line, argv, section))
  if pending:
    raise ValueError(f'shell block ends with a continuation: {pending!r}')
  return commands


def ReadmeCommands(path=README):
  """(set-up commands, other shell commands, python snippets) of the README,
  in README order."""
  setup, commands, snippets = [], [], []
  for block in Blocks(path):
    if block.lang == 'sh':
      (setup if block.section.startswith(SETUP_SECTION) else commands).extend(
          ShellCommands(block.text, block.section))
    elif block.lang == 'python':
      snippets.append(block.text)
  return setup, commands, snippets


def Flag(argv, name, default=None):
  """The value of `--name=value` / `--name value` in argv (last wins)."""
  value = default
  for i, word in enumerate(argv):
    if word.startswith(f'--{name}='):
      value = word.split('=', 1)[1]
    elif word == f'--{name}' and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def CommandKey(argv):
  """What a command runs: 'trainer --mode=<mode>', 'trainer --list_models',
  the module of `python -m <module>`, or the script of `python <script>`."""
  if len(argv) < 2 or argv[0] != 'python':
    return shlex.join(argv[:1])
  if argv[1] != '-m':
    return argv[1]
  module = argv[2] if len(argv) > 2 else ''
  if module == 'lingshard.trainer':
    if '--list_models' in argv:
      return 'trainer --list_models'
    return f'trainer --mode={Flag(argv, "mode", "train")}'
  return module


def Executable(argv):
  """argv with `python` replaced by this interpreter."""
  return [sys.executable] + list(argv[1:]) if argv[0] == 'python' else argv


def OwnStderrLines(stderr):
  """stderr's lines without TF / absl log records and blank lines."""
  return [line for line in stderr.splitlines()
          if line.strip() and not _LOG_RECORD_RE.match(line)
          and not line.startswith(_LOG_NOTICE)]


def BuildWheelCache(cache_dir):
  """The tests' handcrafted wheel (tests/data/testdata/polyui) in a wheel
  cache, and a pins file for it; returns (pins file, pin)."""
  os.makedirs(cache_dir, exist_ok=True)
  path = data_conftest.BuildWheel(
      os.path.join(cache_dir, data_conftest.WHEEL_NAME))
  pin = wheels.WheelPin('polyui', '1.0', data_conftest.WHEEL_NAME,
                        wheels.Sha256(path), 'MIT')
  pins_file = os.path.join(cache_dir, 'pins.json')
  with open(pins_file, 'w', encoding='utf-8') as f:
    json.dump([pin._asdict()], f, indent=1)
  return pins_file, pin


def Env(wheel_cache=None, pins_file=None):
  """The environment of a README command: this checkout first on the path,
  no test-process XLA flags or cluster spec, the wheel cache and pins."""
  env = dict(os.environ)
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  for name in ('XLA_FLAGS', 'TF_CONFIG', PINS_ENV,
               'LINGSHARD_WHEEL_CACHE'):
    env.pop(name, None)
  if wheel_cache:
    env['LINGSHARD_WHEEL_CACHE'] = wheel_cache
  if pins_file:
    env[PINS_ENV] = pins_file
  return env
