"""Replicas route like one device: under MirroredStrategy over 2 and 4
virtual CPU devices the trainer's per-replica step (`TrainStep.Replica`)
passes each replica's global example offset, so GShard's random second
expert (keyed by global token, routing_rng) makes the same decisions,
dropout draws the same masks (keyed by global example, dropout.py), and
each replica differentiates its share of the global loss (token-weighted
cross-entropy plus the aux loss averaged over replicas), so the loss and
the update equal one device's on the same global batch (the
auxiliary-loss-free selection bias too: its counts are summed over
replicas). With every replica
at offset 0 (the trainer before #15) the routing differs."""

import json
import subprocess
import sys

import numpy as np

from tests.trainer import trainer_testlib

HELPER = 'tests.trainer.replica_routing_helper'


def _Run():
  proc = subprocess.run([sys.executable, '-m', HELPER],
                        cwd=trainer_testlib.REPO,
                        env=trainer_testlib.TrainerEnv(),
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_and_four_replicas_route_like_one_device():
  both = _Run()  # One process: global offsets, then every replica at 0.
  runs, zero = both['global'], both['zero_offset']
  one = runs['1']
  assert len(one['routing']) == 2  # One MoE layer in each stack.
  dispatched = np.concatenate([np.asarray(r)[2] for r in one['routing']])
  assert 0 < dispatched.sum() < dispatched.size  # Capacity 1: drops.
  for n in ('2', '4'):
    for layer, (a, b) in enumerate(zip(one['routing'], runs[n]['routing'])):
      # [expert, slot, dispatched] of every (group, token, choice).
      np.testing.assert_array_equal(np.asarray(b), np.asarray(a),
                                    err_msg=f'{n} replicas, layer {layer}')
    for key in ('loss', 'xent', 'aux_loss', 'log_pplx', 'num_tgt_tokens',
                'enc_layer_001_frac_dispatched_2'):
      np.testing.assert_allclose(runs[n]['metrics'][key],
                                 one['metrics'][key], rtol=1e-6,
                                 err_msg=f'{n} replicas: {key}')
    np.testing.assert_allclose(runs[n]['theta_sum'], one['theta_sum'],
                               rtol=1e-6)
    # The selection bias moved by the global batch's counts, not a
    # replica's own (layers/moe/bias_balance.py).
    assert runs[n]['selection_bias'] == one['selection_bias'], n
  assert zero['1']['routing'] == one['routing']
  assert len(one['selection_bias']) == 2
  assert all(np.abs(b).max() > 0 for b in one['selection_bias'])
  for n in ('2', '4'):
    assert zero[n]['routing'] != one['routing'], n
    assert abs(zero[n]['metrics']['xent'] - one['metrics']['xent']) > 1e-4
