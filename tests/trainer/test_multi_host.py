"""A 2-host multi-worker job (two local processes, TF_CONFIG on localhost)
runs the trainer's main path: each host's input pipeline reads only its own
examples (InputContext -> ParamsForHost: every 2nd row of each language,
half the global batch), and both take the same steps."""

import json
import os
import socket
import subprocess
import sys

from tests.trainer import trainer_testlib

HELPER = 'tests.trainer.multi_host_helper'
GLOBAL_BATCH, STEPS = 8, 3


def _FreePorts(n):
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(('localhost', 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def test_two_hosts_read_disjoint_examples(prepared_dir, tmp_path):
  vocab = os.path.join(prepared_dir, 'vocab', 'spm_shared.model')
  overrides = ';'.join([
      f"input.file_pattern='{prepared_dir}/train.tsv'",
      f"input.src_vocab='{vocab}'", f"input.tgt_vocab='{vocab}'",
      'input.bucket_upper_bounds=[64]',
      f'input.bucket_batch_limits=[{GLOBAL_BATCH}]',
      'task.train.log_interval_steps=1'])
  workers = [f'localhost:{p}' for p in _FreePorts(2)]
  procs = []
  for index in range(2):
    env = trainer_testlib.TrainerEnv()
    env['TF_CONFIG'] = json.dumps({'cluster': {'worker': workers},
                                   'task': {'type': 'worker', 'index': index}})
    procs.append(subprocess.Popen(
        [sys.executable, '-m', HELPER, str(tmp_path / f'host{index}.json'),
         '--model=m4.TinyDense', f'--logdir={tmp_path / "log"}',
         '--strategy=multi_worker', f'--max_steps={STEPS}',
         f'--params_override={overrides}'],
        env=env, cwd=trainer_testlib.REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
  for proc in procs:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
  hosts = [json.loads((tmp_path / f'host{i}.json').read_text())
           for i in range(2)]
  for host in hosts:
    assert 'strategy multi_worker: 2 replica(s), jit off' in host['lines']
    assert host['batch_rows'] == [GLOBAL_BATCH // 2] * STEPS
  rows = [{json.dumps(r) for r in host['rows']} for host in hosts]
  assert rows[0] and rows[1]
  assert not rows[0] & rows[1], rows[0] & rows[1]
  # Both hosts took the same synchronous steps: the same global loss.
  losses = [[line for line in host['lines'] if line.startswith('step ')]
            for host in hosts]
  assert len(losses[0]) == STEPS
  assert [line.split(' loss ')[1].split()[0] for line in losses[0]] == [
      line.split(' loss ')[1].split()[0] for line in losses[1]]
