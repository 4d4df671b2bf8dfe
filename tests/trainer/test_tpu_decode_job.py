"""The TPU VM launcher's batch decode job (`--mode=decode` with gs://
--decode_input / --decode_output): --dry_run of m4.MoE2048E36L on a
v3-2048 pod slice prints its exact commands and passes the topology check
(the decode dataset's inference params against the slice); a model whose
mesh does not tile the slice, and missing or local decode paths, are
refused in one line before any command."""

import shlex
import subprocess
import sys

import pytest

from tests.trainer import trainer_testlib

SCRIPT = trainer_testlib.LAUNCH_SCRIPT
TPU = trainer_testlib.TPU_VM
WHERE = ['--zone=europe-west4-a', '--project=proj']
LOGDIR = 'gs://bucket/m4/moe2048e36l'
INPUT = 'gs://bucket/in/part-*.tsv'
OUTPUT = 'gs://bucket/out/moe2048e36l'
BASE = ['--name=ls-1t', '--zone=europe-west4-a', '--project=proj',
        f'--logdir={LOGDIR}']
DECODE = ['--mode=decode', f'--decode_input={INPUT}',
          f'--decode_output={OUTPUT}']


_Module = trainer_testlib.LaunchModule


def _Ssh(worker, command):
  return trainer_testlib.TpuSsh('ls-1t', WHERE, worker, command)


def test_decode_job_dry_run_on_v3_2048():
  run = subprocess.run(
      [sys.executable, SCRIPT, '--dry_run', *BASE,
       '--accelerator_type=v3-2048', '--model=m4.MoE2048E36L', *DECODE],
      capture_output=True, text=True, check=False, timeout=120,
      env=trainer_testlib.TrainerEnv())
  assert run.returncode == 0, run.stderr
  assert run.stderr.splitlines()[-1] == (
      'm4.MoE2048E36L on v3-2048: 2048 TPU devices on 256 host(s), 1 '
      'replica(s) of a 2048-device mesh; every host runs the decode job with '
      f'the same flags: shards {INPUT} -> {OUTPUT}/<shard>.hyp.txt, complete '
      f'outputs skipped; logdir {LOGDIR}')
  lines = run.stdout.splitlines()
  assert all(line.startswith('+ ') for line in lines)
  decode = shlex.join([
      'python3', '-m', 'lingshard.trainer', '--model=m4.MoE2048E36L',
      f'--logdir={LOGDIR}', '--mode=decode', '--strategy=tpu', '--tpu=local',
      f'--decode_input={INPUT}', f'--decode_output={OUTPUT}'])
  job = f'{decode}; echo $? > ~/lingshard-decode.exit'
  assert [shlex.split(line[2:]) for line in lines] == [
      TPU + ['describe', 'ls-1t'] + WHERE + ['--format=value(state)'],
      TPU + ['create', 'ls-1t'] + WHERE + ['--accelerator-type=v3-2048',
                                           '--version=tpu-ubuntu2204-base'],
      ['git', '-C', trainer_testlib.REPO, 'archive', '--format=tar.gz', '-o',
       '/tmp/lingshard-src.tar.gz', 'HEAD'],
      TPU + ['scp', '/tmp/lingshard-src.tar.gz',
             'ls-1t:~/lingshard-src.tar.gz', '--worker=all'] + WHERE,
      _Ssh('all', 'rm -rf ~/lingshard && mkdir ~/lingshard && tar -xzf '
           '~/lingshard-src.tar.gz -C ~/lingshard && python3 -m pip install '
           '--quiet ~/lingshard tensorflow-tpu -f '
           'https://storage.googleapis.com/libtpu-tf-releases/index.html'),
      _Ssh('all', 'cd ~ && rm -f ~/lingshard-decode.exit && nohup sh -c '
           f'{shlex.quote(job)} > ~/lingshard-decode.log 2>&1 < /dev/null &'),
      _Ssh('0', 'tail -n +1 -F ~/lingshard-decode.log & t=$!; while [ ! -f '
           '~/lingshard-decode.exit ]; do sleep 10; done; sleep 2; kill $t'),
      _Ssh('all', 'rc=$(cat ~/lingshard-decode.exit); gcloud storage cp '
           f'~/lingshard-decode.log {LOGDIR}/tpu_vm_logs/'
           '"$(hostname)-decode.log"; echo "$(hostname) exit ${rc:-none}"; '
           'exit "${rc:-1}"'),
      TPU + ['delete', 'ls-1t'] + WHERE + ['--quiet'],
  ]
  # The worker's shell gets the glob quoted: the trainer, not sh, expands it.
  inner = shlex.split(shlex.split(lines[5][2:])[-1].split('sh -c ', 1)[1])[0]
  assert f'--decode_input={INPUT}' in shlex.split(inner.split(';')[0])


def _Refused(capsys, *flags):
  """launch.ParseArgs in-process: exit 2 before any command; the error."""
  with pytest.raises(SystemExit) as e:
    _Module().ParseArgs(['--dry_run', *BASE, *flags])
  assert e.value.code == 2
  out = capsys.readouterr()
  assert out.out == ''
  return out.err.splitlines()[-1].partition(': error: ')[2]


def test_decode_job_mesh_mismatch_is_refused_in_one_line(capsys):
  assert _Refused(capsys, '--accelerator_type=v3-8', '--model=m4.MoE2048E36L',
                  *DECODE) == (
      'm4.MoE2048E36L needs a multiple of 2048 TPU devices (its device mesh '
      '[2048]); a v3-8 has 8 on 1 host(s)')


@pytest.mark.parametrize('flags,message', [
    (['--mode=decode', f'--decode_output={OUTPUT}'],
     '--mode=decode needs --decode_input=gs://... (every host reads the '
     'shards and writes the hypotheses there)'),
    (['--mode=decode', f'--decode_input={INPUT}', '--decode_output=/tmp/o'],
     '--mode=decode needs --decode_output=gs://... (every host reads the '
     'shards and writes the hypotheses there)'),
    ([f'--decode_input={INPUT}'],
     '--decode_input is for --mode=decode (the batch decode job)'),
])
def test_decode_paths_are_checked_before_any_command(capsys, flags, message):
  assert _Refused(capsys, '--accelerator_type=v3-8', '--model=m4.TinyMoE',
                  *flags) == message
