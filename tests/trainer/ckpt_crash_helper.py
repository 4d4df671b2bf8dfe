"""Subprocess helper of test_trainer_checkpointer: saves checkpoint 1 (all
weights 1.0), then dies by SIGKILL at `kill_point` while saving checkpoint 2
(all weights 2.0).

  python ckpt_crash_helper.py TRAIN_DIR KILL_POINT

Kill points, in the order a save goes through them:
  before_merge   shards written to <prefix>_temp/, not yet merged
  mid_merge      ckpt-2.index/.data written, then truncated (a torn write)
  before_state   ckpt-2 complete, the `checkpoint` state file not updated
  mid_state      the new state file's temporary written, not yet renamed
"""

import os
import signal
import sys

from tensorflow.python.checkpoint import checkpoint_management
from tensorflow.python.checkpoint import functional_saver
from tensorflow.python.lib.io import file_io

from lingshard import model_registry
from lingshard.train import checkpointer
from lingshard.train import state as state_lib
from lingshard.train import step as step_lib


def _Die():
  sys.stdout.flush()
  os.kill(os.getpid(), signal.SIGKILL)


def _SetAll(state, value):
  for var in state.theta.Flatten() + state.opt_state.Flatten():
    var.assign(var.read_value() * 0 + value)


def Patch(kill_point, train_dir):
  gen_io_ops = functional_saver.gen_io_ops
  real_merge = gen_io_ops.merge_v2_checkpoints

  def Merge(*args, **kwargs):
    if kill_point == 'before_merge':
      _Die()
    out = real_merge(*args, **kwargs)
    if kill_point == 'mid_merge':
      for name in os.listdir(train_dir):
        if name.startswith('ckpt-2.'):
          path = os.path.join(train_dir, name)
          with open(path, 'r+b') as f:
            f.truncate(os.path.getsize(path) // 2)
      _Die()
    return out

  gen_io_ops.merge_v2_checkpoints = Merge
  real_update = checkpoint_management.update_checkpoint_state_internal

  def Update(*args, **kwargs):
    if kill_point == 'before_state':
      _Die()
    return real_update(*args, **kwargs)

  checkpoint_management.update_checkpoint_state_internal = Update
  real_atomic = file_io.atomic_write_string_to_file

  def Atomic(filename, contents, overwrite=True):
    if kill_point == 'mid_state':
      file_io.write_string_to_file(filename + '.tmp-crash', contents)
      _Die()
    return real_atomic(filename, contents, overwrite)

  file_io.atomic_write_string_to_file = Atomic


def main(train_dir, kill_point):
  params = model_registry.GetParams('toy.FFRegression')
  task = params.task.Instantiate()
  state = state_lib.TrainState(task, step_lib.TrainStep(task))
  ckpt = checkpointer.Checkpointer(train_dir, state)
  _SetAll(state, 1.0)
  state.step.assign(1)
  ckpt.Save(1)
  print('saved 1', flush=True)
  _SetAll(state, 2.0)
  state.step.assign(2)
  Patch(kill_point, train_dir)
  ckpt.Save(2)
  print('saved 2 (not killed)', flush=True)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])
