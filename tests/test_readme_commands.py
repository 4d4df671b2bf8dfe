"""README.md's commands are tests: every shell command of the README (but
the set-up block) and its python snippet, run as written, in README order.

The set-up block (`make demo`, `make test`) is not run: it builds the
environment this test runs in, and the demo trains for minutes.

The commands run as subprocesses (`python` is this interpreter) in a fresh
working directory holding a `scripts` symlink to the repository's, with
`LINGSHARD_WHEEL_CACHE` / `LINGSHARD_WHEEL_PINS` pointing `prepare` at the
tests' handcrafted wheel (tests/data/testdata/polyui), so the corpus and
its vocabularies are in the real prepared format, made offline. One
module-scoped fixture runs them all; one test per command checks its exit
status and output against CHECKS, so a failure names the command, and a
README command without a check fails. Also: in an empty directory, the
README's trainer and spmd_check commands say in one line that the corpus is
missing and how to prepare it; and the pins file format
(`LINGSHARD_WHEEL_PINS`) that points `prepare` at the test wheel.
"""

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from lingshard import model_registry
from lingshard import trainer
from lingshard.data import corpus_io
from lingshard.data import wheels
from lingshard import platform as platform_lib
from lingshard.layers import base_layer
from lingshard.models import mt_decoder
from lingshard.tools import count_params
from tests import readme_testlib as lib

SETUP, COMMANDS, SNIPPETS = lib.ReadmeCommands()
SNIPPET_KEY = 'python snippet'
TIMEOUT = 600


class Ran:
  """A finished README command: its process and the working directory."""

  def __init__(self, command, proc, seconds, workdir, pins_file):
    self.command = command
    self.proc = proc
    self.seconds = seconds
    self.workdir = workdir
    self.pins_file = pins_file

  @property
  def argv(self):
    return self.command.argv

  @property
  def stdout(self):
    return self.proc.stdout

  def Path(self, *parts):
    return os.path.join(self.workdir, *parts)

  def Why(self):
    return (f'{self.command.line}\nexit {self.proc.returncode}\n'
            f'stdout:\n{self.proc.stdout[-3000:]}\n'
            f'stderr:\n{self.proc.stderr[-3000:]}')


# --------------------------------------------------------------- checks
def _CheckPrepare(r):
  out = lib.Flag(r.argv, 'out', 'data/ui_m4')
  assert (f'wheels ({lib.PINS_ENV}={r.pins_file}): polyui 1.0'
          in lib.OwnStderrLines(r.proc.stderr)), r.Why()
  assert re.search(r'^\d+ unique pairs, \d+ languages, \d+ English strings',
                   r.stdout, re.M), r.Why()
  assert re.search(rf'^wrote {re.escape(out)} in \d+\.\ds$', r.stdout,
                   re.M), r.Why()
  for name in ('train.tsv', 'dev_unseen_en.tsv', 'manifest.json',
               'vocab/spm_shared.model'):
    assert os.path.isfile(r.Path(out, name)), name
  manifest = json.load(open(r.Path(out, 'manifest.json'), encoding='utf-8'))
  assert [s['file'] for s in manifest['sources']] == [
      'polyui-1.0-py3-none-any.whl']


def _CheckStats(r):
  data_dir = r.argv[3]
  assert r.stdout.startswith(f'corpus: {data_dir}\n'), r.Why()
  train = corpus_io.LanguageCounts(corpus_io.ReadTsv(
      r.Path(data_dir, 'train.tsv')))
  for lang, n in train.items():
    assert re.search(rf'^{re.escape(lang)}\s+{n}\b', r.stdout, re.M), (
        lang, r.Why())
  assert re.search(rf'^ALL\s+{sum(train.values())}\b', r.stdout, re.M)


def _CheckLmPrepare(r):
  out = lib.Flag(r.argv, 'out')
  for split in ('train', 'dev', 'test'):
    m = re.search(rf'^{split}\s+([\d,]+) sentences\s+([\d,]+) words', r.stdout,
                  re.M)
    assert m, r.Why()
    with open(r.Path(out, f'{split}.txt'), encoding='utf-8') as f:
      lines = f.read().splitlines()
    assert int(m.group(1).replace(',', '')) == len(lines) > 0
    assert int(m.group(2).replace(',', '')) == sum(
        len(line.split()) for line in lines)
  with open(r.Path(out, 'vocab.txt'), encoding='utf-8') as f:
    vocab = f.read().splitlines()
  assert vocab[:4] == ['<pad>', '<s>', '</s>', '<unk>']
  assert re.search(rf'^vocab {len(vocab):,d} words; dev OOV rate '
                   rf'\d+\.\d\d%; wrote {re.escape(out)}$', r.stdout, re.M)


def _StepLines(r):
  return re.findall(r'^step (\d+)/(\d+) loss \d+\.\d+', r.stdout, re.M)


def _CheckTrain(r):
  steps = int(lib.Flag(r.argv, 'max_steps'))
  logdir = r.Path(lib.Flag(r.argv, 'logdir'))
  lines = _StepLines(r)
  assert lines and lines[-1] == (str(steps), str(steps)), r.Why()
  assert os.path.isfile(os.path.join(logdir, 'params.txt'))
  assert os.path.isfile(os.path.join(logdir, 'train', f'ckpt-{steps}.index'))


def _TrainedStep(r):
  """max_steps of the README's train command writing to r's logdir."""
  logdir = lib.Flag(r.argv, 'logdir')
  train = next(c for c in COMMANDS if c.key == 'trainer --mode=train' and
               lib.Flag(c.argv, 'logdir') == logdir)
  return int(lib.Flag(train.argv, 'max_steps'))


def _CheckEval(r):
  step = _TrainedStep(r)
  m = re.search(rf'^eval Dev step {step}: (.*)$', r.stdout, re.M)
  assert m, r.Why()
  metrics = dict(zip(m.group(1).split()[::2], m.group(1).split()[1::2]))
  tokens = metrics.get('num_tgt_tokens', metrics.get('num_words'))
  assert float(metrics['loss']) > 0 and float(tokens) > 0, metrics
  logdir = lib.Flag(r.argv, 'logdir')
  path = r.Path(logdir, 'eval_dev', f'metrics-{step:08d}.json')
  with open(path, encoding='utf-8') as f:
    result = json.load(f)
  if 'num_words' in metrics:  # The LM: corpus perplexity over words.
    entry = result['languages']['all']
    assert entry['pplx'] == pytest.approx(math.exp(entry['log_pplx']))
    vocab = r.Path(lib.Flag(_First('lingshard.data.lm_prepare').argv, 'out'),
                   'vocab.txt')
    with open(vocab, encoding='utf-8') as f:
      # Trained: below the uniform model's perplexity V.
      assert 1.0 < entry['pplx'] < len(f.read().splitlines())


def _CheckDecode(r):
  out_dir = os.path.join(lib.Flag(r.argv, 'logdir'), 'decode_dev_unseen_en')
  assert f'hypotheses and scores written to {out_dir}' in r.stdout, r.Why()
  with open(r.Path(out_dir, 'scores.txt'), encoding='utf-8') as f:
    table = f.read()
  assert table in r.stdout
  dev = corpus_io.LanguageCounts(corpus_io.ReadTsv(
      r.Path('data', 'ui_m4', 'dev_unseen_en.tsv')))
  rows = table.splitlines()
  assert rows[0].split() == ['lang', 'n', 'BLEU', 'chrF', 'copyBLEU',
                             'copychrF']
  assert {row.split()[0]: int(row.split()[1]) for row in rows[1:]
          if not row.startswith('[')} == dev
  with open(r.Path(out_dir, 'scores.json'), encoding='utf-8') as f:
    assert mt_decoder.FormatScores(json.load(f)) == table


def _CheckExport(r):
  step = _TrainedStep(r)
  m = re.search(rf'^exported step {step} to (\S+)$', r.stdout, re.M)
  assert m, r.Why()
  assert os.path.isfile(r.Path(m.group(1), 'saved_model.pb')), m.group(1)


def _CheckPrintParams(r):
  model = lib.Flag(r.argv, 'model')
  params = model_registry.GetParams(model, 'Train')
  # The printed params are the ones the trainer runs: 'auto' MoE dispatch
  # resolved for this machine's platform.
  base_layer.ResolveParams(params.task,
                           platform=platform_lib.Platform('default'))
  assert r.stdout.rstrip('\n') == params.ToText().rstrip('\n')


def _CheckListModels(r):
  lines = []
  trainer.ListModels(lines.append)
  assert r.stdout.splitlines() == lines


def _CheckSpmd(r):
  model = lib.Flag(r.argv, 'model')
  assert re.search(rf'^SPMD check: {re.escape(model)} on mesh ', r.stdout,
                   re.M), r.Why()
  assert re.search(r'^  parity vs single device: OK ', r.stdout, re.M)
  for rule in [w.split('=', 1)[1] for w in r.argv
               if w.startswith('--expect=')]:
    assert f'\n    {rule}\n' in r.stdout
  assert r.stdout.rstrip().endswith('result: PASS')


def _CheckCountParams(r):
  model = lib.Flag(r.argv, 'model')
  expected = count_params.FormatCounts(model, count_params.CountModel(model))
  assert r.stdout.rstrip('\n') == expected


def _CheckTpuLaunch(r):
  name = lib.Flag(r.argv, 'name')
  lines = r.stdout.splitlines()
  assert lines and all(line.startswith('+ ') for line in lines), r.Why()
  assert lines[0].startswith(f'+ gcloud compute tpus tpu-vm describe {name} ')
  trainer_line = [line for line in lines if 'lingshard.trainer' in line]
  assert len(trainer_line) == 1, lines
  model = lib.Flag(r.argv, 'model')
  for word in (f'--model={model}', f'--logdir={lib.Flag(r.argv, "logdir")}',
               '--strategy=tpu', lib.Flag(r.argv, 'trainer_args', '')):
    assert word in trainer_line[0], word
  assert lines[-1].startswith(f'+ gcloud compute tpus tpu-vm delete {name} ')
  # The model/slice check's summary (tpu_topology) on stderr.
  accelerator = lib.Flag(r.argv, 'accelerator_type')
  assert lib.OwnStderrLines(r.proc.stderr)[-1].startswith(
      f'{model} on {accelerator}: '), r.Why()


def _CheckSnippet(r):
  lines = r.stdout.splitlines()
  assert lines[0] == '(2, 4)', r.Why()
  assert 'task.train.learning_rate : 0.01' in lines


def _CheckReproduce(r):
  """The evidence page's capacity experiment (quick) on the README corpus:
  every run's command names the config key, seed and overrides; a smaller
  capacity drops more wanted choices (GShard §2.2); the page and its PNG
  are written, sections not run say how to run them."""
  out_dir = r.Path(lib.Flag(r.argv, 'out_dir'))
  with open(os.path.join(out_dir, 'results', 'capacity.json'),
            encoding='utf-8') as f:
    result = json.load(f)
  assert result['mode'] == 'quick' and result['revision'], r.Why()
  drops = {}
  for cf in (0.5, 2.0):
    for policy in ('all', 'random'):
      run = result['runs'][f'cap_cf{cf:g}_{policy}_s1']
      train = shlex.split(run['commands'][0])
      assert train[:3] == ['python', '-m', 'lingshard.trainer']
      assert '--model=m4.TinyMoE' in train and '--seed=1' in train
      assert f'task.moe_tpl.capacity_factor={cf}' in run['commands'][0]
      assert f"second_expert_policy='{policy}'" in run['commands'][0]
      assert [p['step'] for p in run['curve']] == [result['steps']]
      assert 0 < run['curve'][0]['log_pplx'] < 20
      drops[cf, policy] = (run['routing']['over_capacity_first'] +
                           run['routing']['over_capacity_second'])
  for policy in ('all', 'random'):
    assert drops[0.5, policy] > drops[2.0, policy] >= 0.0, drops
  with open(os.path.join(out_dir, 'RESULTS.md'), encoding='utf-8') as f:
    page = f.read()
  assert '## 4. Capacity and random routing (GShard §2.2)' in page
  for cf in ('0.5', '2.0'):
    for policy in ('all', 'random'):
      assert f'| {cf} | {policy} | 1 |' in page
  assert ('Not run yet: `python scripts/reproduce.py --only conditional`.'
          in page)
  with open(os.path.join(out_dir, 'results', 'capacity.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


CHECKS = {
    'lingshard.data.prepare': _CheckPrepare,
    'lingshard.data.lm_prepare': _CheckLmPrepare,
    'lingshard.data.stats': _CheckStats,
    'trainer --mode=train': _CheckTrain,
    'trainer --mode=eval': _CheckEval,
    'trainer --mode=decode': _CheckDecode,
    'trainer --mode=export': _CheckExport,
    'trainer --mode=print_params': _CheckPrintParams,
    'trainer --list_models': _CheckListModels,
    'lingshard.tools.spmd_check': _CheckSpmd,
    'lingshard.tools.count_params': _CheckCountParams,
    'scripts/tpu_vm/launch.py': _CheckTpuLaunch,
    'scripts/reproduce.py': _CheckReproduce,
}


def _Runnable(command):
  """True for commands this test knows how to check and may run."""
  if command.key not in CHECKS:
    return False
  return command.key != 'scripts/tpu_vm/launch.py' or (
      '--dry_run' in command.argv)


# -------------------------------------------------------------- running
RESULTS = []  # (Command, Ran or None) in README order, filled by `ran`.


@pytest.fixture(scope='module')
def ran(tmp_path_factory):
  """Runs the python snippets, then every runnable README command, in
  README order, in one fresh working directory."""
  cache = str(tmp_path_factory.mktemp('wheel_cache'))
  pins_file, _ = lib.BuildWheelCache(cache)
  workdir = str(tmp_path_factory.mktemp('readme'))
  os.symlink(os.path.join(lib.REPO, 'scripts'),
             os.path.join(workdir, 'scripts'))
  env = lib.Env(cache, pins_file)
  snippets = [lib.Command(text, ['python', '-c', text], SNIPPET_KEY)
              for text in SNIPPETS]
  RESULTS.clear()
  start = time.monotonic()
  for command in snippets + COMMANDS:
    if command.section != SNIPPET_KEY and not _Runnable(command):
      RESULTS.append((command, None))
      continue
    t0 = time.monotonic()
    proc = subprocess.run(lib.Executable(command.argv), cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)
    RESULTS.append((command, Ran(command, proc, time.monotonic() - t0,
                                 workdir, pins_file)))
  print('\nREADME commands:', f'{time.monotonic() - start:.0f}s in all',
        *[f'{r.seconds:6.1f}s  {c.line[:90]}' for c, r in RESULTS if r],
        sep='\n  ', file=sys.stderr)
  return {id(c): r for c, r in RESULTS}




def test_readme_has_every_checked_command():
  assert [c.argv for c in SETUP] == [['make', 'demo'], ['make', 'test']]
  keys = [c.key for c in COMMANDS]
  assert sorted(set(keys)) == sorted(CHECKS), (
      'README commands and CHECKS differ: '
      f'{sorted(set(keys) ^ set(CHECKS))}')
  assert keys[0] == 'lingshard.data.prepare'  # The rest need its output.
  assert len(SNIPPETS) == 1


def test_readme_python_snippet(ran):
  command, r = RESULTS[0]
  assert command.section == SNIPPET_KEY
  assert r.proc.returncode == 0, r.Why()
  _CheckSnippet(r)


@pytest.mark.parametrize(
    'command', COMMANDS,
    ids=[f'{i:02d} {c.key}' for i, c in enumerate(COMMANDS)])
def test_readme_command(ran, command):
  assert command.key in CHECKS, (
      f'README command {command.line!r} ({command.key}) has no check in '
      'tests/test_readme_commands.py CHECKS: add one')
  assert _Runnable(command), (
      f'README command {command.line!r} would run a real TPU job: keep '
      '--dry_run in the README')
  r = ran[id(command)]
  assert r.proc.returncode == 0, r.Why()
  CHECKS[command.key](r)


# --------------------------------------------------------- no prepared data
def _First(key):
  return next(c for c in COMMANDS if c.key == key)


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
                        timeout=TIMEOUT, check=False)
  prepare = _First(prepare).line
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
