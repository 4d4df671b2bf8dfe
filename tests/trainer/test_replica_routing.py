"""Replicas route like one device: under MirroredStrategy over 2 and 4
virtual CPU devices, the trainer's step passes each replica's global
example offset, so GShard's random second expert (keyed by global token,
routing_rng) makes the same decisions: the cross-entropy equals one
device's on the same global batch. With every replica at offset 0 (the
trainer before) it does not. (Still open for #15: the replicas' aux losses
are averaged with the loss's token weights, so `loss` differs by ~2e-5.)"""

import json
import subprocess
import sys

import numpy as np

from tests.trainer import trainer_testlib

HELPER = 'tests.trainer.replica_routing_helper'


def _Run(*args):
  proc = subprocess.run([sys.executable, '-m', HELPER, *args],
                        cwd=trainer_testlib.REPO,
                        env=trainer_testlib.TrainerEnv(),
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_and_four_replicas_route_like_one_device():
  """xent depends on every routing decision (a different random second
  expert or drop changes it by ~1e-3): equal to 1e-6 on 2 and 4 replicas,
  different when every replica starts at offset 0."""
  runs = _Run()
  one = runs['1']
  for n in ('2', '4'):
    for key in ('xent', 'log_pplx'):
      np.testing.assert_allclose(runs[n][key], one[key], rtol=1e-6,
                                 err_msg=f'{n} replicas: {key}')
  zero = _Run('--zero_offset')
  assert zero['1']['xent'] == one['xent']
  for n in ('2', '4'):
    assert abs(zero[n]['xent'] - one['xent']) > 1e-4, (n, zero[n], one)
