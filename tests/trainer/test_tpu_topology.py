"""The TPU VM launcher at paper scale: --dry_run of m4.MoE2048E36L on a
v3-2048 pod slice prints the multi-host job (every worker runs the trainer
with the same flags) and its shape; a model that does not fit the slice is
refused with one line before any command; the accelerator table."""

import importlib.util
import os
import shlex
import subprocess
import sys

import pytest

from lingshard.train import tpu_topology
from tests.trainer import trainer_testlib

SCRIPT = os.path.join(trainer_testlib.REPO, 'scripts', 'tpu_vm', 'launch.py')


def _Module():
  spec = importlib.util.spec_from_file_location('tpu_vm_launch', SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _Launch(*flags):
  return subprocess.run(
      [sys.executable, SCRIPT, '--dry_run', '--name=ls-1t',
       '--zone=europe-west4-a', '--project=proj', *flags],
      capture_output=True, text=True, check=False, timeout=120,
      env=trainer_testlib.TrainerEnv())


@pytest.mark.parametrize('accelerator,devices,hosts', [
    ('v2-8', 8, 1), ('v3-8', 8, 1), ('v3-32', 32, 4), ('v3-2048', 2048, 256),
    ('v4-8', 4, 1), ('v4-32', 16, 4), ('v5p-16', 8, 2),
    ('v5litepod-8', 8, 1), ('v5litepod-16', 16, 4), ('v6e-256', 256, 64)])
def test_accelerator_types(accelerator, devices, hosts):
  topo = tpu_topology.Topology(accelerator)
  assert (topo.devices, topo.hosts) == (devices, hosts)


def test_unknown_accelerator_type():
  with pytest.raises(tpu_topology.TopologyError) as e:
    tpu_topology.Topology('v9-8')
  assert str(e.value) == ("--accelerator_type 'v9-8' is not a Cloud TPU type "
                          'such as v2-8, v3-2048, v4-32, v5p-16, '
                          'v5litepod-8, v6e-16')


def test_paper_scale_dry_run_on_v3_2048():
  run = _Launch('--accelerator_type=v3-2048', '--model=m4.MoE2048E36L',
                '--logdir=gs://bucket/m4/moe2048e36l')
  assert run.returncode == 0, run.stderr
  assert run.stderr.splitlines()[-1] == (
      'm4.MoE2048E36L on v3-2048: 2048 TPU devices on 256 host(s), 1 '
      'replica(s) of a 2048-device mesh; every host runs the trainer with the '
      'same flags; logdir gs://bucket/m4/moe2048e36l')
  commands = [shlex.split(line[2:]) for line in run.stdout.splitlines()]
  create = [c for c in commands if c[4:5] == ['create']]
  assert create and '--accelerator-type=v3-2048' in create[0]
  ssh = [c for c in commands if c[4:5] == ['ssh']]
  trainer = [c for c in ssh if 'lingshard.trainer' in c[-1]]
  assert len(trainer) == 1 and '--worker=all' in trainer[0]
  assert ('--model=m4.MoE2048E36L --logdir=gs://bucket/m4/moe2048e36l '
          '--mode=train --strategy=tpu --tpu=local') in trainer[0][-1]


@pytest.mark.parametrize('flags,message', [
    (['--accelerator_type=v3-8', '--model=m4.MoE2048E36L'],
     'm4.MoE2048E36L needs a multiple of 2048 TPU devices (its device mesh '
     '[2048]); a v3-8 has 8 on 1 host(s)'),
    (['--accelerator_type=v4-32', '--model=m4.MoE128E12L'],
     'm4.MoE128E12L needs a multiple of 128 TPU devices (its device mesh '
     '[128]); a v4-32 has 16 on 4 host(s)'),
    (['--accelerator_type=v3-2048', '--model=m4.TinyMoE'],
     'm4.TinyMoE on a v3-2048 (256 replica(s) of 8 devices): '
     'input.bucket_batch_limits[0]=128 (the global batch) must be divisible '
     'by the 256 replicas of 1 input host(s)'),
    (['--accelerator_type=v3-2048', '--model=m4.MoE2048E36L',
      '--trainer_args=--params_override=input.bucket_batch_limits=[1024,512,'
      '256]'],
     "m4.MoE2048E36L on a v3-2048 (1 replica(s) of 2048 devices): "
     "input.bucket_batch_limits[0]=1024 must be divisible by mesh axis 'x' "
     'of size 2048 (the batch is split over it)'),
    (['--accelerator_type=v3-2048', '--model=m4.NoSuchModel'],
     "Model 'm4.NoSuchModel' is not registered; known models: "),
])
def test_mismatch_is_refused_in_one_line(flags, message, capsys):
  """In-process (launch.ParseArgs, as main runs it): exit 2 before any
  command, the error as the last stderr line."""
  with pytest.raises(SystemExit) as e:
    _Module().ParseArgs(['--dry_run', '--name=ls-1t', '--zone=z',
                         '--project=p', *flags, '--logdir=gs://bucket/x'])
  assert e.value.code == 2
  out = capsys.readouterr()
  assert out.out == ''  # No command printed, none run.
  last = out.err.splitlines()[-1]
  prog, _, error = last.partition(': error: ')  # prog: argv[0]'s name.
  assert prog and error.startswith(message), last
  if not message.endswith(': '):
    assert error == message
