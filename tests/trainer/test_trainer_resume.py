"""Resume: a trainer killed with SIGKILL at a random step and restarted ends
with parameters bitwise identical to an uninterrupted run (same seed; the
data iterator's position is part of every checkpoint)."""

import random
import re
import signal
import subprocess

import numpy as np
import tensorflow as tf

from tests.trainer import trainer_testlib

MAX_STEPS = 400


def _Args(logdir):
  return ['--model=toy.FFRegression', f'--logdir={logdir}',
          f'--max_steps={MAX_STEPS}', '--seed=7',
          '--params_override=task.train.save_interval_steps=25;'
          'task.train.log_interval_steps=1;'
          'task.train.summary_interval_steps=50']


def _Checkpoint(logdir):
  path = tf.train.latest_checkpoint(str(logdir / 'train'))
  reader = tf.train.load_checkpoint(path)
  # Everything but the manager's save_counter (how many saves this process
  # made): theta, optimizer slots, step, seed.
  return path, {k: reader.get_tensor(k)
                for k in reader.get_variable_to_shape_map()
                if k.endswith('VARIABLE_VALUE') and
                not k.startswith('save_counter/')}


def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
  kill_at = random.SystemRandom().randint(30, 300)
  reference = subprocess.Popen(
      trainer_testlib.TrainerCommand(*_Args(tmp_path / 'reference')),
      env=trainer_testlib.TrainerEnv(), cwd=trainer_testlib.REPO,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  killed = subprocess.Popen(
      trainer_testlib.TrainerCommand(*_Args(tmp_path / 'resumed')),
      env=trainer_testlib.TrainerEnv(), cwd=trainer_testlib.REPO,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  last = 0
  for line in killed.stdout:
    m = re.match(r'step (\d+)/', line)
    if m:
      last = int(m.group(1))
      if last >= kill_at:
        killed.send_signal(signal.SIGKILL)
        break
  killed.wait(timeout=60)
  assert killed.returncode == -signal.SIGKILL, (kill_at, last)
  assert kill_at <= last < MAX_STEPS, (kill_at, last)
  # Restart: it resumes from the last committed checkpoint.
  resumed = trainer_testlib.RunTrainer(*_Args(tmp_path / 'resumed'))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  first = int(re.search(r'^step (\d+)/', resumed.stdout, re.M).group(1))
  assert 1 < first <= last + 1, (kill_at, last, first)
  assert (first - 1) % 25 == 0, first  # Continued from a checkpoint.
  assert reference.wait(timeout=300) == 0, reference.stderr.read()[-3000:]
  ref_path, ref = _Checkpoint(tmp_path / 'reference')
  res_path, res = _Checkpoint(tmp_path / 'resumed')
  assert ref_path.endswith(f'ckpt-{MAX_STEPS}')
  assert res_path.endswith(f'ckpt-{MAX_STEPS}')
  assert sorted(ref) == sorted(res)
  assert {k.split('/')[0] for k in ref} == {'theta', 'opt', 'step', 'seed'}
  for key in ref:
    np.testing.assert_array_equal(ref[key], res[key], err_msg=(
        f'{key} differs after a kill at step {last} (target {kill_at})'))
