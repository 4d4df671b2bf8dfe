"""scripts/tpu_vm/launch.py: --dry_run prints every command of the batch
job; the VM is created only when missing and deleted only if created."""

import shlex
import subprocess
import sys

import pytest

from tests.trainer import trainer_testlib

SCRIPT = trainer_testlib.LAUNCH_SCRIPT
ARGS = ['--name=ls-m4', '--zone=us-central2-b', '--project=proj',
        '--accelerator_type=v4-32', '--model=m4.TinyMoE',
        '--logdir=gs://bucket/runs/m4',
        '--trainer_args=--max_steps=100 --params_override='
        "'task.train.save_interval_steps=50;task.train.log_interval_steps=5'"]
TPU = trainer_testlib.TPU_VM
WHERE = ['--zone=us-central2-b', '--project=proj']


_Module = trainer_testlib.LaunchModule


def _Ssh(worker, command):
  return trainer_testlib.TpuSsh('ls-m4', WHERE, worker, command)


def test_dry_run_prints_every_command():
  run = subprocess.run([sys.executable, SCRIPT, '--dry_run'] + ARGS,
                       capture_output=True, text=True, check=False,
                       timeout=60)
  assert run.returncode == 0, run.stderr
  got = [shlex.split(line[2:]) for line in run.stdout.splitlines()]
  assert all(line.startswith('+ ') for line in run.stdout.splitlines())
  trainer = ('python3 -m lingshard.trainer --model=m4.TinyMoE '
             '--logdir=gs://bucket/runs/m4 --mode=train --strategy=tpu '
             "--tpu=local --max_steps=100 '--params_override="
             "task.train.save_interval_steps=50;task.train.log_interval_steps=5'"
             '; echo $? > ~/lingshard-train.exit')
  want = [
      TPU + ['describe', 'ls-m4'] + WHERE + ['--format=value(state)'],
      TPU + ['create', 'ls-m4'] + WHERE + ['--accelerator-type=v4-32',
                                           '--version=tpu-ubuntu2204-base'],
      ['git', '-C', trainer_testlib.REPO, 'archive', '--format=tar.gz', '-o',
       '/tmp/lingshard-src.tar.gz', 'HEAD'],
      TPU + ['scp', '/tmp/lingshard-src.tar.gz',
             'ls-m4:~/lingshard-src.tar.gz', '--worker=all'] + WHERE,
      _Ssh('all', 'rm -rf ~/lingshard && mkdir ~/lingshard && tar -xzf '
           '~/lingshard-src.tar.gz -C ~/lingshard && python3 -m pip install '
           '--quiet ~/lingshard tensorflow-tpu -f '
           'https://storage.googleapis.com/libtpu-tf-releases/index.html'),
      _Ssh('all', 'cd ~ && rm -f ~/lingshard-train.exit && nohup sh -c '
           f'{shlex.quote(trainer)} > ~/lingshard-train.log 2>&1 < /dev/null '
           '&'),
      _Ssh('0', 'tail -n +1 -F ~/lingshard-train.log & t=$!; while [ ! -f '
           '~/lingshard-train.exit ]; do sleep 10; done; sleep 2; kill $t'),
      _Ssh('all', 'rc=$(cat ~/lingshard-train.exit); gcloud storage cp '
           '~/lingshard-train.log gs://bucket/runs/m4/tpu_vm_logs/'
           '"$(hostname).log"; echo "$(hostname) exit ${rc:-none}"; exit '
           '"${rc:-1}"'),
      TPU + ['delete', 'ls-m4'] + WHERE + ['--quiet'],
  ]
  assert got == want
  # The trainer command survives both shells (ssh's and sh -c's): it splits
  # back into the trainer's flags, the override's ';' intact.
  job = shlex.split(got[5][-1].split('nohup sh -c ', 1)[1])[0]
  lex = shlex.shlex(job, posix=True, punctuation_chars=True)
  lex.whitespace_split = True
  tokens = list(lex)
  assert tokens[:tokens.index(';')] == [
      'python3', '-m', 'lingshard.trainer', '--model=m4.TinyMoE',
      '--logdir=gs://bucket/runs/m4', '--mode=train', '--strategy=tpu',
      '--tpu=local', '--max_steps=100', '--params_override='
      'task.train.save_interval_steps=50;task.train.log_interval_steps=5']


def test_pip_source_and_spot():
  module = _Module()
  args = module.ParseArgs(ARGS + ['--source=git+https://h/ls@v1', '--spot'])
  assert module.InstallCommands(args) == [_Ssh(
      'all', 'python3 -m pip install --quiet git+https://h/ls@v1 '
      'tensorflow-tpu -f '
      'https://storage.googleapis.com/libtpu-tf-releases/index.html')]
  assert module.CreateCommand(args)[-1] == '--spot'


class FakeRun:
  """Records commands; `fail` maps a gcloud verb to its exit code."""
  dry_run = False

  def __init__(self, **fail):
    self.fail = fail
    self.verbs = []

  def __call__(self, argv, check=True):
    verb = argv[4] if argv[:4] == TPU else argv[0]
    self.verbs.append(verb)
    code = self.fail.get(verb, 0)
    if check and code:
      raise RuntimeError(verb)
    return code


def test_reuses_an_existing_vm_and_keeps_it():
  module = _Module()
  run = FakeRun()
  assert module.Launch(module.ParseArgs(ARGS), run) == 0
  assert run.verbs == ['describe', 'git', 'scp', 'ssh', 'ssh', 'ssh', 'ssh']


def test_deletes_a_created_vm_even_on_failure():
  module = _Module()
  run = FakeRun(describe=1, scp=255)
  with pytest.raises(RuntimeError, match='^scp$'):
    module.Launch(module.ParseArgs(ARGS), run)
  assert run.verbs == ['describe', 'create', 'git', 'scp', 'delete']
  run = FakeRun(describe=1)
  module.Launch(module.ParseArgs(ARGS + ['--keep']), run)
  assert 'delete' not in run.verbs


def test_logdir_must_be_on_gcs(capsys):
  module = _Module()
  with pytest.raises(SystemExit) as e:
    module.ParseArgs([a for a in ARGS if not a.startswith('--logdir')] +
                     ['--logdir=/tmp/x'])
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(
      ': error: --logdir must be a gs:// path (the TPU VMs write it)')


@pytest.mark.parametrize('trainer_args,word', [
    ('--max_steps=10 ; touch x', ';'),
    ('--max_steps=10 touch', 'touch'),
])
def test_stray_words_in_trainer_args_are_refused_before_any_command(
    capsys, trainer_args, word):
  """The trainer's own flag parser finds them before the VM exists (the
  trainer would refuse them only once it runs on the VM)."""
  module = _Module()
  with pytest.raises(SystemExit) as e:
    module.ParseArgs([a for a in ARGS if not a.startswith('--trainer_args')] +
                     [f'--trainer_args={trainer_args}'])
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(
      f': error: --trainer_args {trainer_args!r}: {word!r} is not a '
      'trainer flag (the trainer takes --flags only; every word reaches it '
      'quoted, so shell syntax is not run)')


def test_unknown_trainer_flag_is_refused_before_any_command(capsys):
  module = _Module()
  with pytest.raises(SystemExit) as e:
    module.ParseArgs(ARGS + ['--trainer_args=--max_step=10'])
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(
      ": error: Unknown command line flag 'max_step'. Did you mean: "
      'max_steps ?')
