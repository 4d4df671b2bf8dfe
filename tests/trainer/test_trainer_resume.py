"""Faults during saves, then resume: one logdir's trainer is stopped
inside a save again and again (a seeded choice of signal: SIGKILL, SIGTERM,
SIGINT; of kill point, tests/trainer/ckpt_crash_helper.py; and of step),
and a second trainer (this process) is started on it while the first
holds it. After each kill the state file names only checkpoints that exist
and restore, the latest the last one committed; the restarted run resumes
from it despite the lock file the dead run may leave; and the last run
(this process) ends with theta, optimizer slots, step and seed bitwise
identical, and the same loss at every step, as an uninterrupted run (same
seed; the data iterator's position is part of every checkpoint). The kill
points are hooks on the production save path, so every run of this test
stops at the same places; the trainer binary runs 3 times."""

import os
import random
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard import trainer
from lingshard.train import checkpointer
from lingshard.train import state as state_lib
from lingshard.train import step as step_lib
from tests.trainer import ckpt_crash_helper
from tests.trainer import trainer_testlib

MAX_STEPS = 40
SAVE_EVERY = 5
SEED = 7
# Points before the state file's rename leave the previous save committed.
_UNCOMMITTED = ('before_merge', 'mid_merge', 'before_state', 'mid_state')
_HELPER = os.path.join(os.path.dirname(__file__), 'ckpt_crash_helper.py')


def _Plan():
  """[(signal, kill point, step)]: each signal once, distinct kill points,
  increasing steps from 10 (so that every save has a checkpoint to delete
  at mid_sweep)."""
  rng = random.Random(53)
  signals = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT]
  rng.shuffle(signals)
  points = rng.sample(ckpt_crash_helper.KILL_POINTS, len(signals))
  steps = sorted(rng.sample(range(2 * SAVE_EVERY, MAX_STEPS, SAVE_EVERY),
                            len(signals)))
  return list(zip(signals, points, steps))


def _Args(logdir):
  return ['--model=toy.FFRegression', f'--logdir={logdir}',
          f'--max_steps={MAX_STEPS}', f'--seed={SEED}',
          f'--params_override=task.train.save_interval_steps={SAVE_EVERY};'
          'task.train.max_checkpoints_to_keep=1;'
          'task.train.log_interval_steps=1;'
          'task.train.summary_interval_steps=50']


def _Popen(cmd):
  return subprocess.Popen(cmd, env=trainer_testlib.TrainerEnv(),
                          cwd=trainer_testlib.REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _Losses(stdout):
  """{step: the loss its progress line printed}."""
  return {int(s): loss for s, loss in
          re.findall(r'^step (\d+)/\d+ loss (\S+)', stdout, re.M)}


def _Values(path):
  reader = tf.train.load_checkpoint(path)
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.endswith('VARIABLE_VALUE')}


def _CheckStateFile(train, latest, what):
  """The state file names ckpt-<latest>, and every checkpoint it lists
  exists and restores its step."""
  assert checkpointer.ReadState(str(train)) == str(train / f'ckpt-{latest}')
  listed = tf.train.get_checkpoint_state(str(train)).all_model_checkpoint_paths
  assert listed, what
  for path in listed:
    step = int(path.rsplit('-', 1)[1])
    task = model_registry.GetParams('toy.FFRegression').task.Set(
        random_seed=SEED).Instantiate()
    state = state_lib.TrainState(task, step_lib.TrainStep(task))
    assert checkpointer.Checkpointer(str(train), state).Restore(
        os.path.join(str(train), path)) == (step, False), what


def _Refused(logdir, holder_pid):
  """A second trainer (this process) on the held logdir: one line naming
  the holder, nothing written."""
  before = sorted(os.listdir(logdir / 'train'))
  with pytest.raises(trainer.ConfigError) as e:
    trainer.Execute(trainer_testlib.ParseFlags(*_Args(logdir)),
                    printer=lambda _: None)
  assert re.fullmatch(
      re.escape(f'--logdir {logdir} is in use by another trainer (pid '
                f'{holder_pid} on {socket.gethostname()}, started ') +
      r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC' + re.escape(
          '); wait for it to finish (or stop it) or choose another --logdir'),
      str(e.value)), str(e.value)
  assert sorted(os.listdir(logdir / 'train')) == before


def _Execute(logdir):
  """Trains in this process (the trainer binary's main path); returns
  {step: printed loss}."""
  lines = []
  trainer.Execute(trainer_testlib.ParseFlags(*_Args(logdir)),
                  printer=lines.append)
  return _Losses('\n'.join(lines))


def test_killed_saves_and_a_second_trainer_then_resume_is_bitwise_identical(
    tmp_path):
  logdir = tmp_path / 'killed'
  train = logdir / 'train'
  losses = {}
  resume_at = 1
  for i, (sig, point, step) in enumerate(_Plan()):
    what = f'{sig.name} at {point} of the save of step {step}'
    killed = _Popen([sys.executable, _HELPER, '--pause', point, str(step),
                     *_Args(logdir)])
    stdout = []
    for line in killed.stdout:  # Until the helper stops in the save.
      stdout.append(line)
      if line.startswith('paused '):
        break
    assert stdout[-1:] == [f'paused {point} {step}\n'], what
    if i == 0:
      _Refused(logdir, killed.pid)
    killed.send_signal(sig)
    out, err = killed.communicate(timeout=300)
    # (SIGINT: KeyboardInterrupt unwinds, then the trainer dies by SIGINT
    # after one line.)
    assert killed.returncode == -sig, (what, err[-3000:])
    if sig == signal.SIGINT:
      assert 'Traceback' not in err, err[-3000:]
      assert err.rstrip().splitlines()[-1] == (
          f'lingshard.trainer: {trainer.INTERRUPTED}'), err[-3000:]
    printed = _Losses(''.join(stdout) + out)
    assert sorted(printed) == list(range(resume_at, step + 1)), what
    losses.update(printed)
    resume_at = step + 1 - (SAVE_EVERY if point in _UNCOMMITTED else 0)
    _CheckStateFile(train, resume_at - 1, what)
    # SIGINT unwinds (the lock file is removed); a killed run leaves it.
    assert (logdir / 'trainer.lock').exists() == (sig != signal.SIGINT), what
  printed = _Execute(logdir)
  assert sorted(printed) == list(range(resume_at, MAX_STEPS + 1))
  losses.update(printed)
  assert not (logdir / 'trainer.lock').exists()
  _CheckStateFile(train, MAX_STEPS, 'the last run')
  # The uninterrupted run.
  assert losses == _Execute(tmp_path / 'reference')
  ref = _Values(str(tmp_path / 'reference' / 'train' / f'ckpt-{MAX_STEPS}'))
  res = _Values(str(train / f'ckpt-{MAX_STEPS}'))
  assert sorted(ref) == sorted(res)
  assert {k.split('/')[0] for k in ref} == {'theta', 'opt', 'step', 'seed'}
  for key in ref:
    np.testing.assert_array_equal(ref[key], res[key], err_msg=key)
