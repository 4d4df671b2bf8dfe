"""Strategies: MirroredStrategy over 2 virtual CPU devices (and a local
MultiWorkerMirroredStrategy) train like one device on the same global batch;
the TPU path builds its device assignment from the model's device mesh and
asks for SPMD partitioning; TF_CONFIG parsing; batch splitting."""

import glob
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from lingshard import platform
from lingshard import trainer
from lingshard.nested_map import NestedMap
from lingshard.train import strategies
from tests.trainer import trainer_testlib

STEPS = 5


def _Args(logdir, *extra):
  return ['--model=toy.FFRegression', f'--logdir={logdir}',
          f'--max_steps={STEPS}',
          '--params_override=task.train.summary_interval_steps=1;'
          'task.train.log_interval_steps=1'] + list(extra)


def _Losses(logdir):
  out = {}
  for path in glob.glob(os.path.join(logdir, 'train', 'events.out.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == 'loss':
          out[event.step] = float(tf.make_ndarray(value.tensor))
  return [out[s] for s in sorted(out)]


def _Theta(logdir):
  reader = tf.train.load_checkpoint(
      tf.train.latest_checkpoint(os.path.join(logdir, 'train')))
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith(('theta/', 'opt/'))}


RUNS = {  # name: (flags, the trainer's strategy line)
    'mirrored': (('--strategy=mirrored', '--num_cpu_devices=2'),
                 'strategy mirrored: 2 replica(s), jit off'),
    # Two compiled halves with the cross-replica sum between them.
    'mirrored_jit': (('--strategy=mirrored', '--num_cpu_devices=2', '--jit'),
                     'strategy mirrored: 2 replica(s), jit on'),
    'multi_worker': (('--strategy=multi_worker',),
                     'strategy multi_worker: 1 replica(s), jit off'),
}


def test_mirrored_and_multi_worker_match_one_device(tmp_path):
  procs = {
      name: subprocess.Popen(
          trainer_testlib.TrainerCommand(*_Args(tmp_path / name, *flags)),
          env=trainer_testlib.TrainerEnv(), cwd=trainer_testlib.REPO,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for name, (flags, _) in RUNS.items()}
  # The one-device reference runs in this process meanwhile.
  lines = []
  trainer.Execute(trainer_testlib.ParseFlags(*_Args(tmp_path / 'default')),
                  printer=lines.append)
  assert 'strategy default: 1 replica(s), jit off' in lines
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (name, err[-3000:])
    assert f'step {STEPS}/{STEPS} loss' in out, (name, out)
    assert RUNS[name][1] in out.splitlines(), out
  one = _Losses(str(tmp_path / 'default'))
  assert len(one) == STEPS
  one_theta = _Theta(str(tmp_path / 'default'))
  for name in ('mirrored', 'mirrored_jit', 'multi_worker'):
    losses = _Losses(str(tmp_path / name))
    # Step 1: same weights, same global batch -> the same loss.
    np.testing.assert_allclose(losses[0], one[0], rtol=1e-6)
    np.testing.assert_allclose(losses, one, rtol=1e-4)
    theta = _Theta(str(tmp_path / name))
    assert sorted(theta) == sorted(one_theta)
    for key in one_theta:
      np.testing.assert_allclose(theta[key], one_theta[key], rtol=1e-4,
                                 atol=1e-5, err_msg=f'{name} {key}')


def _FakeTopology(mesh_shape):
  """A TPU topology with every chip coordinate of `mesh_shape`."""
  x, y, z, cores = mesh_shape
  coords = [[i, j, k, c] for k in range(z) for j in range(y) for i in range(x)
            for c in range(cores)]
  return tf.tpu.experimental.Topology(
      mesh_shape=list(mesh_shape),
      device_coordinates=np.array([coords], np.int32))


@pytest.mark.parametrize('topology,cores,want', [
    ([2, 2, 1, 2], 1, [1, 1, 1, 1]),
    ([2, 2, 1, 2], 2, [1, 1, 1, 2]),
    ([2, 2, 1, 2], 4, [2, 1, 1, 2]),
    ([2, 2, 1, 2], 8, [2, 2, 1, 2]),
    ([4, 4, 4, 1], 16, [4, 4, 1, 1]),
    ([4, 4, 4, 1], 64, [4, 4, 4, 1]),
    ([3, 2, 1, 1], 6, [3, 2, 1, 1]),
])
def test_computation_shape(topology, cores, want):
  assert strategies.ComputationShape(topology, cores) == want


def test_computation_shape_errors():
  with pytest.raises(strategies.StrategyError) as e:
    strategies.ComputationShape([2, 2, 1, 2], 3)
  assert str(e.value) == ('a device mesh of 3 cores does not divide the TPU '
                          'topology [2, 2, 1, 2] (8 cores)')


def test_device_assignment_from_mesh():
  topology = _FakeTopology([2, 2, 1, 2])  # A v3-8: 4 chips x 2 cores.
  da = strategies.DeviceAssignmentForMesh(topology,
                                          np.arange(4).reshape([2, 2]))
  assert (da.num_replicas, da.num_cores_per_replica) == (2, 4)
  cores = da.core_assignment.reshape([-1, 4])
  # Every physical core is used exactly once across the replicas.
  assert len({tuple(c) for c in cores}) == 8
  single = strategies.DeviceAssignmentForMesh(topology, None)
  assert (single.num_replicas, single.num_cores_per_replica) == (8, 1)


def test_tpu_strategy_code_path(monkeypatch):
  calls = {}
  topology = _FakeTopology([2, 2, 1, 2])

  class Resolver:

    def __init__(self, tpu):
      calls['tpu'] = tpu

  def Strategy(resolver, experimental_device_assignment=None,
               experimental_spmd_xla_partitioning=False):
    calls['strategy'] = (resolver, experimental_device_assignment,
                         experimental_spmd_xla_partitioning)
    return 'tpu-strategy'

  monkeypatch.setattr(tf.distribute.cluster_resolver, 'TPUClusterResolver',
                      Resolver)
  monkeypatch.setattr(tf.config, 'experimental_connect_to_cluster',
                      lambda r: calls.setdefault('connected', r))
  monkeypatch.setattr(tf.tpu.experimental, 'initialize_tpu_system',
                      lambda r: topology)
  monkeypatch.setattr(tf.distribute, 'TPUStrategy', Strategy)
  strategy, info = strategies.CreateStrategy(
      'tpu', tpu='local', device_mesh=np.arange(8).reshape([2, 4]))
  assert strategy == 'tpu-strategy'
  assert calls['tpu'] == 'local'
  resolver, da, spmd = calls['strategy']
  assert resolver is calls['connected']
  assert spmd is True
  assert (da.num_replicas, da.num_cores_per_replica) == (1, 8)
  # XLA compiles the whole replica function on TPU; no nested jit.
  assert info.kind == 'tpu' and info.jit_step is False
  # The program's facts, decided once (lingshard/platform.py).
  program = info.program
  assert program == platform.Program(
      strategy='tpu', platform='tpu', jit=True, mesh_shape=(2, 4),
      mesh_axis_names=None, num_replicas=1)
  assert (program.xla_compiled, program.jit_compile, program.jit_whole,
          program.jit_halves, program.spmd) == (True, False, False, False,
                                                True)


def test_tpu_needs_a_name():
  with pytest.raises(strategies.StrategyError) as e:
    strategies.CreateStrategy('tpu')
  assert str(e.value) == ('--strategy=tpu needs --tpu (a TPU name, or "local" '
                          'on a TPU VM)')


def test_default_jit():
  assert strategies.DefaultJit('tpu', None) is True
  assert strategies.DefaultJit('default', None) is False
  assert strategies.DefaultJit('mirrored', True) is True
  _, info = strategies.CreateStrategy('default', jit=True)
  assert info.jit_step is True
  assert (info.program.xla_compiled, info.program.jit_whole,
          info.program.jit_halves, info.program.spmd) == (True, True, False,
                                                          True)
  # Mirrored --jit: the step's halves are XLA programs, replicas are
  # single devices (no partitioned mesh).
  program = platform.ForStrategy('mirrored', True, num_replicas=2)
  assert (program.jit_whole, program.jit_halves, program.spmd,
          program.num_replicas) == (False, True, False, 2)


def test_parse_tf_config():
  cluster = ('{"cluster": {"worker": ["h0:1", "h1:1", "h2:1"]}, '
             '"task": {"type": "worker", "index": %d}}')
  assert strategies.ParseTfConfig(cluster % 0) == ('worker', 0, 3, True)
  assert strategies.ParseTfConfig(cluster % 2) == ('worker', 2, 3, False)
  with_chief = ('{"cluster": {"chief": ["c:1"], "worker": ["h0:1"]}, '
                '"task": {"type": "worker", "index": 0}}')
  assert strategies.ParseTfConfig(with_chief) == ('worker', 0, 2, False)
  with pytest.raises(strategies.StrategyError) as e:
    strategies.ParseTfConfig(cluster % 3)
  assert str(e.value) == ('TF_CONFIG task index 3 is out of range for 3 '
                          'worker(s)')
  with pytest.raises(strategies.StrategyError,
                     match=r"^TF_CONFIG is not a valid cluster spec"):
    strategies.ParseTfConfig('{"task": {}}')


def test_distribute_batch_needs_divisible_batch():

  class TwoReplicas:
    num_replicas_in_sync = 2

  with pytest.raises(strategies.StrategyError) as e:
    strategies.DistributeBatch(TwoReplicas(),
                               NestedMap(x=tf.zeros([3, 2])))
  assert str(e.value) == ('batch.x has 3 examples, not divisible by 2 '
                          'replicas')
