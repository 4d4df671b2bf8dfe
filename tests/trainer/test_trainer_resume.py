"""Resume: a trainer killed by SIGKILL at a fixed point of a save and
restarted ends with theta, optimizer slots, step and seed bitwise identical
to an uninterrupted run (same seed; the data iterator's position is part of
every checkpoint). The kill point is a hook on the production save path
(tests/trainer/ckpt_crash_helper.py), so every run of this test kills at the
same place."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.trainer import trainer_testlib

MAX_STEPS = 100
SAVE_EVERY = 25
# The killed run dies inside the state-file write of the save of step 75:
# ckpt-75 is complete on disk but not recorded, so the restarted run must
# resume from ckpt-50 (and, e.g., not from the newest files on disk).
KILL_POINT, KILL_STEP, RESUME_AT = 'mid_state', 75, 51
_HELPER = os.path.join(os.path.dirname(__file__), 'ckpt_crash_helper.py')


def _Args(logdir):
  return ['--model=toy.FFRegression', f'--logdir={logdir}',
          f'--max_steps={MAX_STEPS}', '--seed=7',
          f'--params_override=task.train.save_interval_steps={SAVE_EVERY};'
          'task.train.log_interval_steps=1;'
          'task.train.summary_interval_steps=50']


def _Popen(cmd):
  return subprocess.Popen(cmd, env=trainer_testlib.TrainerEnv(),
                          cwd=trainer_testlib.REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _Steps(stdout):
  return [int(s) for s in re.findall(r'^step (\d+)/', stdout, re.M)]


def _Checkpoint(logdir):
  path = tf.train.latest_checkpoint(str(logdir / 'train'))
  reader = tf.train.load_checkpoint(path)
  # Everything but the manager's save_counter (how many saves this process
  # made): theta, optimizer slots, step, seed.
  return path, {k: reader.get_tensor(k)
                for k in reader.get_variable_to_shape_map()
                if k.endswith('VARIABLE_VALUE') and
                not k.startswith('save_counter/')}


def test_sigkill_during_a_save_then_resume_is_bitwise_identical(tmp_path):
  reference = _Popen(trainer_testlib.TrainerCommand(
      *_Args(tmp_path / 'reference')))
  logdir = tmp_path / 'killed'
  killed = _Popen([sys.executable, _HELPER, '--trainer', KILL_POINT,
                   str(KILL_STEP), *_Args(logdir)])
  out, err = killed.communicate(timeout=300)
  assert killed.returncode == -signal.SIGKILL, err[-3000:]
  assert _Steps(out) == list(range(1, KILL_STEP + 1)), out[-500:]
  assert (logdir / 'train' / f'ckpt-{KILL_STEP}.index').exists()
  resumed = trainer_testlib.RunTrainer(*_Args(logdir))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _Steps(resumed.stdout) == list(range(RESUME_AT, MAX_STEPS + 1))
  out, err = reference.communicate(timeout=300)
  assert reference.returncode == 0, err[-3000:]
  ref_path, ref = _Checkpoint(tmp_path / 'reference')
  res_path, res = _Checkpoint(logdir)
  assert ref_path.endswith(f'ckpt-{MAX_STEPS}')
  assert res_path.endswith(f'ckpt-{MAX_STEPS}')
  assert sorted(ref) == sorted(res)
  assert {k.split('/')[0] for k in ref} == {'theta', 'opt', 'step', 'seed'}
  for key in ref:
    np.testing.assert_array_equal(ref[key], res[key], err_msg=(
        f'{key} differs after a kill at {KILL_POINT} of the save of step '
        f'{KILL_STEP}'))
