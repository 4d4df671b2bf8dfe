"""Checkpoints: atomic saves (a process killed at every stage of a save
leaves a loadable latest checkpoint, also with max_to_keep=1), mismatch
errors naming the first differing variable, warm start, cadence and
retention."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard.train import checkpointer
from lingshard.train import state as state_lib
from lingshard.train import step as step_lib
from tests.trainer import trainer_testlib

# Kill points of ckpt_crash_helper (in save order) -> the step the state
# file must name afterwards (max_to_keep=1: a save that deleted the old
# checkpoint before recording the new one would leave nothing loadable).
KILL_POINTS = {'before_merge': 1, 'mid_merge': 1, 'before_state': 1,
               'mid_state': 1, 'before_sweep': 2, 'mid_sweep': 2}


def _State(**train):
  p = model_registry.GetParams('toy.FFRegression')
  p.task.train.Set(**train)
  task = p.task.Instantiate()
  return state_lib.TrainState(task, step_lib.TrainStep(task))


def _AllValues(state):
  return [v.numpy() for v in state.theta.Flatten() + state.opt_state.Flatten()]


def _CheckKilledSave(train_dir, point, latest):
  files = sorted(os.listdir(train_dir))
  # The crash happened inside the save of step 2 ...
  if point == 'before_merge':
    assert 'ckpt-2_temp' in files, files
  else:
    assert 'ckpt-2.index' in files, files
  if point == 'mid_state':
    # ... inside the state file's atomic write: its temporary names ckpt-2,
    # the state file still ckpt-1.
    tmp = [n for n in files if n.startswith('checkpoint.tmp')]
    assert len(tmp) == 1, files
    assert 'model_checkpoint_path: "ckpt-2"' in (train_dir / tmp[0]).read_text()
  if point == 'before_sweep':
    assert 'ckpt-1.index' in files, files
  if point == 'mid_sweep':  # A torn ckpt-1 the state file no longer lists.
    assert 'ckpt-1.index' in files, files
    assert 'ckpt-1.data-00000-of-00001' not in files, files
  # ... and the committed checkpoint is intact.
  state = _State()
  ckpt = checkpointer.Checkpointer(str(train_dir), state, max_to_keep=1)
  assert ckpt.LatestPath() == str(train_dir / f'ckpt-{latest}'), point
  assert ckpt.Restore()[0] == latest, point
  for value in _AllValues(state):
    np.testing.assert_array_equal(value, np.full_like(value, latest))
  # The run goes on: the next save replaces torn files and leftovers.
  for var in state.theta.Flatten():
    var.assign(var * 0 + 3.0)
  state.step.assign(latest + 1)
  ckpt.Save(latest + 1)
  again = _State()
  assert checkpointer.Checkpointer(str(train_dir), again).Restore()[0] == (
      latest + 1)
  np.testing.assert_array_equal(again.theta.fc[0].w.numpy(),
                                np.full([8, 32], 3.0, np.float32))
  assert sorted(os.listdir(train_dir)) == [
      'checkpoint', f'ckpt-{latest + 1}.data-00000-of-00001',
      f'ckpt-{latest + 1}.index'], point


def test_killed_saves_leave_a_loadable_latest_checkpoint(tmp_path):
  helper = os.path.join(os.path.dirname(__file__), 'ckpt_crash_helper.py')
  procs = {}
  for point in KILL_POINTS:
    procs[point] = subprocess.Popen(
        [sys.executable, helper, str(tmp_path / point), point],
        env=trainer_testlib.TrainerEnv(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
  for point, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, (point, out, err[-2000:])
    assert out == 'saved 1\n', point
    _CheckKilledSave(tmp_path / point, point, KILL_POINTS[point])


def _Saved(tmp_path, **task):
  p = model_registry.GetParams('toy.FFRegression').task.Set(**task)
  t = p.Instantiate()
  state = state_lib.TrainState(t, step_lib.TrainStep(t))
  ckpt = checkpointer.Checkpointer(str(tmp_path), state)
  ckpt.Save(7)
  return os.path.join(str(tmp_path), 'ckpt-7')


def _Mismatch(path, task_p, optimizer='adam'):
  task_p.train.optimizer = optimizer
  task = task_p.Instantiate()
  state = state_lib.TrainState(task, step_lib.TrainStep(task))
  with pytest.raises(checkpointer.CheckpointError) as e:
    checkpointer.Checkpointer(os.path.dirname(path), state).Restore()
  return str(e.value)


def _TaskParams(**kw):
  return model_registry.GetParams('toy.FFRegression').task.Set(**kw)


def test_mismatched_shape_names_the_variable(tmp_path):
  path = _Saved(tmp_path)
  msg = _Mismatch(path, _TaskParams(hidden_dims=[32, 16]))
  assert msg == (f'checkpoint {path} does not match the model: variable '
                 "'model/fc_001/b' is [16] float32 in the model but [32] "
                 'float32 in the checkpoint')


def test_missing_and_extra_variables(tmp_path):
  # 8 -> 32 -> 32 -> 1 -> 1: the default model plus a last layer fc_003.
  path = _Saved(tmp_path / 'deeper', hidden_dims=[32, 32, 1])
  msg = _Mismatch(path, _TaskParams())
  assert msg == (f'checkpoint {path} does not match the model: checkpoint '
                 "variable 'model/fc_003/b' is not in the model")
  path = _Saved(tmp_path / 'default')
  msg = _Mismatch(path, _TaskParams(hidden_dims=[32, 32, 1]))
  assert msg == (f'checkpoint {path} does not match the model: variable '
                 "'model/fc_003/b' is missing from the checkpoint")
  msg = _Mismatch(path, _TaskParams(name='other'))
  assert msg == (f'checkpoint {path} does not match the model: checkpoint '
                 "variable 'model/fc_000/b' is not in the model")


def test_other_optimizer_names_the_slot(tmp_path):
  path = _Saved(tmp_path)
  msg = _Mismatch(path, _TaskParams(), optimizer='adafactor')
  assert msg == (f'checkpoint {path} does not match the model: checkpoint '
                 "optimizer slot 'model/fc_000/b/m' is not in the model")


def test_unreadable_checkpoint(tmp_path):
  path = _Saved(tmp_path)
  with open(path + '.index', 'wb') as f:
    f.write(b'not a checkpoint')
  state = _State()
  with pytest.raises(checkpointer.CheckpointError) as e:
    checkpointer.Checkpointer(str(tmp_path), state).Restore()
  assert str(e.value) == (
      f'checkpoint file {path}.index is unreadable (file is too short to be '
      f'an sstable); nothing was written: make {tmp_path}/checkpoint name a '
      'good checkpoint (one line: model_checkpoint_path: "ckpt-<step>") or '
      'use a new logdir')


def test_seed_mismatch(tmp_path):
  path = _Saved(tmp_path)
  task = _TaskParams(random_seed=99).Instantiate()
  state = state_lib.TrainState(task, step_lib.TrainStep(task))
  with pytest.raises(checkpointer.CheckpointError) as e:
    checkpointer.Checkpointer(str(tmp_path), state).Restore()
  assert str(e.value) == (
      f'checkpoint {path} was trained with random_seed 1234 but this run has '
      '99; pass --seed=1234 (or a new logdir) so that randomness continues '
      'where it stopped')


def test_restore_is_exact(tmp_path):
  state = _State()
  for i, var in enumerate(state.theta.Flatten() + state.opt_state.Flatten()):
    var.assign(tf.random.stateless_normal(var.shape, [i, 5]))
  state.step.assign(41)
  checkpointer.Checkpointer(str(tmp_path), state).Save(41)
  other = _State()
  assert checkpointer.Checkpointer(str(tmp_path), other).Restore() == (41,
                                                                       False)
  for a, b in zip(_AllValues(state), _AllValues(other)):
    np.testing.assert_array_equal(a, b)
  assert int(other.step.numpy()) == 41
  keys = {k for k, _ in tf.train.list_variables(str(tmp_path / 'ckpt-41'))}
  assert 'theta/model/fc_000/w/.ATTRIBUTES/VARIABLE_VALUE' in keys
  assert 'opt/model/fc_000/w/m/.ATTRIBUTES/VARIABLE_VALUE' in keys
  assert 'step/.ATTRIBUTES/VARIABLE_VALUE' in keys


def test_warm_start_loads_theta_only(tmp_path):
  src = _State()
  for var in src.theta.Flatten() + src.opt_state.Flatten():
    var.assign(var * 0 + 5.0)
  src.step.assign(9)
  checkpointer.Checkpointer(str(tmp_path / 'a'), src).Save(9)
  dst = _State()
  ckpt = checkpointer.Checkpointer(str(tmp_path / 'b'), dst)
  ckpt.WarmStart(str(tmp_path / 'a' / 'ckpt-9'))
  for var in dst.theta.Flatten():
    np.testing.assert_array_equal(var.numpy(), np.full(var.shape, 5.0))
  for var in dst.opt_state.Flatten():
    np.testing.assert_array_equal(var.numpy(), np.zeros(var.shape))
  assert int(dst.step.numpy()) == 0
  bigger = _TaskParams(hidden_dims=[32, 64]).Instantiate()
  with pytest.raises(checkpointer.CheckpointError) as e:
    checkpointer.Checkpointer(str(tmp_path / 'c'), state_lib.TrainState(
        bigger)).WarmStart(str(tmp_path / 'a' / 'ckpt-9'))
  assert str(e.value) == (
      f'--init_from_checkpoint {tmp_path}/a/ckpt-9: variable '
      "'model/fc_001/b' is [64] in the model but [32] in the checkpoint")


def test_cadence_and_retention(tmp_path):
  state = _State()
  ckpt = checkpointer.Checkpointer(str(tmp_path), state, max_to_keep=2,
                                   save_interval_steps=3)
  saved = [s for s in range(1, 11) if ckpt.MaybeSave(s)]
  assert saved == [3, 6, 9]
  assert ckpt.Save(9) is None  # A step is never saved twice.
  ckpt.Save(10)
  state_proto = tf.train.get_checkpoint_state(str(tmp_path))
  assert [os.path.basename(p) for p in
          state_proto.all_model_checkpoint_paths] == ['ckpt-9', 'ckpt-10']
  assert not any(n.startswith('ckpt-3.') for n in os.listdir(tmp_path))
  timed = checkpointer.Checkpointer(str(tmp_path / 't'), state,
                                    save_interval_secs=1e-9)
  assert timed.ShouldSave(1)
