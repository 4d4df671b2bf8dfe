"""scripts/tpu_vm/launch.py with hostile flag values.

The launcher (and its --dry_run output, pasted into bash) runs in a sandbox:
stub `gcloud`, `git`, `python3`, `tar`, `hostname` and `sleep` on PATH
record their argv; the stub gcloud runs each `ssh --command` in bash with
HOME in the sandbox, as a worker would. Every value must reach the trainer,
pip and `gcloud storage cp` as the same one argument, no injected command
may run (no file `P`), and the trainer's exit code must be the launcher's.
"""

import importlib.util
import json
import os
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, 'scripts', 'tpu_vm', 'launch.py')
TPU = ['gcloud', 'compute', 'tpus', 'tpu-vm']
TRAINER_RC = 7
HOSTILE = [
    '; touch P #',
    '$(touch P)',
    '`touch P`',
    'it\'s a "quote" \\',
    'line one\ntouch P\n',
    '  two  spaces\t| touch P && touch P & ',
    '\'; touch P; echo \'"; touch P; echo "',
]
ALL = ''.join(HOSTILE)

# Records argv as one JSON line; `gcloud ... ssh` runs --command in bash.
_STUB = f"""#!{sys.executable}
import json, os, subprocess, sys
name = os.path.basename(sys.argv[0])
argv = sys.argv[1:]
with open(os.environ['STUB_LOG'], 'a') as f:
  f.write(json.dumps([name] + argv) + '\\n')
if name == 'gcloud' and argv[3:4] == ['ssh']:
  command = [a for a in argv if a.startswith('--command=')][0]
  sys.exit(subprocess.run(['bash', '-c', command[len('--command='):]],
                          cwd=os.environ['HOME']).returncode)
if name == 'python3' and argv[:2] == ['-m', 'lingshard.trainer']:
  sys.exit({TRAINER_RC})
"""


def _Module():
  spec = importlib.util.spec_from_file_location('tpu_vm_launch', SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _Flags(value, source):
  return [
      '--name=ls-m4', f'--zone={value}', f'--project={value}',
      f'--accelerator_type={value}', f'--runtime_version={value}',
      f'--model={value}', f'--logdir=gs://b/{value}', f'--mode={value}',
      '--trainer_args=' + shlex.join([f'--params_override={value}', value]),
      f'--source={source}', '--pip_extra=' + shlex.join([value, '-f', 'u']),
      # Hostile model and accelerator names are not a registered model on a
      # TPU type: this file tests quoting only.
      '--skip_topology_check']


def _Sandbox(tmp_path):
  """(env, home) with the stubs first on PATH."""
  home, bin_dir = tmp_path / 'home', tmp_path / 'bin'
  home.mkdir()
  bin_dir.mkdir()
  for name in ('gcloud', 'git', 'python3', 'tar'):
    (bin_dir / name).write_text(_STUB)
  (bin_dir / 'hostname').write_text('#!/bin/sh\necho worker-0\n')
  (bin_dir / 'sleep').write_text('#!/bin/sh\nexec /bin/sleep 0.05\n')
  for stub in bin_dir.iterdir():
    stub.chmod(0o755)
  env = dict(os.environ, HOME=str(home), STUB_LOG=str(tmp_path / 'calls'),
             PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
  return env, home


def _Calls(tmp_path):
  with open(tmp_path / 'calls') as f:
    return [json.loads(line) for line in f]


def _CheckRemoteSide(tmp_path, home, value, source):
  """The trainer, pip and the log copy got `value` intact; nothing else ran."""
  calls = _Calls(tmp_path)
  assert not list(tmp_path.rglob('P'))
  assert (home / 'lingshard-train.exit').read_text() == f'{TRAINER_RC}\n'
  pip_source = '/'.join([str(home), 'lingshard']) if source == 'local' else (
      source)
  assert sorted(c for c in calls if c[0] == 'python3') == sorted([
      ['python3', '-m', 'pip', 'install', '--quiet', pip_source, value, '-f',
       'u'],
      ['python3', '-m', 'lingshard.trainer', f'--model={value}',
       f'--logdir=gs://b/{value}', f'--mode={value}', '--strategy=tpu',
       '--tpu=local', f'--params_override={value}', value]])
  assert [c for c in calls if c[:2] == ['gcloud', 'storage']] == [
      ['gcloud', 'storage', 'cp', f'{home}/lingshard-train.log',
       f'gs://b/{value}/tpu_vm_logs/worker-0.log']]
  ssh = [c for c in calls if c[:5] == TPU + ['ssh']]
  assert [c[5:9] for c in ssh] == [
      ['ls-m4', f'--zone={value}', f'--project={value}', f'--worker={w}']
      for w in ('all', 'all', '0', 'all')]
  return calls


@pytest.mark.parametrize('value', HOSTILE + [ALL])
def test_hostile_values_reach_the_workers_intact(tmp_path, value):
  env, home = _Sandbox(tmp_path)
  run = subprocess.run([sys.executable, SCRIPT] + _Flags(value, value),
                       env=env, cwd=home, capture_output=True, text=True,
                       check=False, timeout=60)
  assert run.returncode == TRAINER_RC, run.stderr
  assert run.stdout.splitlines()[-1] == f'worker-0 exit {TRAINER_RC}'
  calls = _CheckRemoteSide(tmp_path, home, value, value)
  assert [c for c in calls if c[:5] == TPU + ['describe']] == [
      TPU + ['describe', 'ls-m4', f'--zone={value}', f'--project={value}',
             '--format=value(state)']]


@pytest.mark.parametrize('source', ['local', ALL])
def test_dry_run_output_pasted_into_bash_runs_the_same_job(tmp_path, source):
  env, home = _Sandbox(tmp_path)
  run = subprocess.run([sys.executable, SCRIPT, '--dry_run'] +
                       _Flags(ALL, source), env=env, cwd=home,
                       capture_output=True, text=True, check=False,
                       timeout=60)
  assert run.returncode == 0, run.stderr
  # bash reads the printout back into the exact argv lists of the job.
  printed = subprocess.run(
      ['bash'], input='+() { printf "%s\\0" "$#" "$@"; }\n' + run.stdout,
      cwd=home, capture_output=True, text=True, check=True).stdout
  fields, argvs = printed.split('\0')[:-1], []
  while fields:
    n = int(fields.pop(0))
    argvs.append(fields[:n])
    del fields[:n]
  module = _Module()
  args = module.ParseArgs(_Flags(ALL, source))
  assert argvs == ([module.DescribeCommand(args), module.CreateCommand(args)]
                   + module.InstallCommands(args) + [
                       module.Ssh(args, module.TrainerCommand(args)),
                       module.StreamCommand(args),
                       module.CollectCommand(args),
                       module.DeleteCommand(args)])
  assert not list(tmp_path.rglob('P'))
  # Pasted as is, the printout runs the job.
  subprocess.run(['bash'], input='+() { "$@"; }\n' + run.stdout, env=env,
                 cwd=home, capture_output=True, text=True, check=False,
                 timeout=60)
  calls = _CheckRemoteSide(tmp_path, home, ALL, source)
  if source == 'local':
    assert calls[2:4] == [
        ['git', '-C', REPO, 'archive', '--format=tar.gz', '-o',
         '/tmp/lingshard-src.tar.gz', 'HEAD'],
        TPU + ['scp', '/tmp/lingshard-src.tar.gz',
               'ls-m4:~/lingshard-src.tar.gz', '--worker=all',
               f'--zone={ALL}', f'--project={ALL}']]


def test_collect_exits_with_the_trainer_code_whatever_the_copy_does(
    tmp_path):
  env, home = _Sandbox(tmp_path)
  module = _Module()
  command = module.CollectCommand(module.ParseArgs(_Flags(HOSTILE[0],
                                                          'local')))
  command = command[-1][len('--command='):]
  (tmp_path / 'bin' / 'gcloud').write_text('#!/bin/sh\nexit 1\n')
  for code in ('0', '3'):
    (home / 'lingshard-train.exit').write_text(code + '\n')
    run = subprocess.run(['bash', '-c', command], env=env, cwd=home,
                         capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout) == (int(code),
                                            f'worker-0 exit {code}\n')
  (home / 'lingshard-train.exit').unlink()
  run = subprocess.run(['bash', '-c', command], env=env, cwd=home,
                       capture_output=True, text=True, check=False)
  assert (run.returncode, run.stdout) == (1, 'worker-0 exit none\n')
  assert not list(tmp_path.rglob('P'))


@pytest.mark.parametrize('flag,message', [
    ('--name=ls; touch P #', "--name 'ls; touch P #' is not a TPU VM name: "
     'use lowercase letters, digits and hyphens, starting with a letter (at '
     'most 63)'),
    ('--name=LS-m4', "--name 'LS-m4' is not a TPU VM name: use lowercase "
     'letters, digits and hyphens, starting with a letter (at most 63)'),
    ("--trainer_args=--params_override='a=1", "--trainer_args "
     "\"--params_override='a=1\" is not a shell-quoted command line (No "
     'closing quotation); close every quote'),
    ('--pip_extra=tensorflow-tpu "-f', "--pip_extra 'tensorflow-tpu \"-f' "
     'is not a shell-quoted command line (No closing quotation); close '
     'every quote'),
])
def test_bad_flags_are_one_line_errors(tmp_path, flag, message):
  env, home = _Sandbox(tmp_path)
  flags = [f for f in _Flags('x', 'local')
           if not f.startswith(flag.split('=')[0] + '=')]
  run = subprocess.run([sys.executable, SCRIPT, '--dry_run', flag] + flags,
                       env=env, cwd=home, capture_output=True, text=True,
                       check=False, timeout=60)
  assert run.returncode == 2
  assert run.stderr.splitlines()[-1] == f'launch.py: error: {message}'
  assert run.stdout == ''
