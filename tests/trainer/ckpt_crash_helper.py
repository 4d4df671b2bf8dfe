"""Subprocess helper of the checkpoint tests: dies by SIGKILL at a chosen
point of a save.

  python ckpt_crash_helper.py TRAIN_DIR KILL_POINT
    saves checkpoint 1 (all weights 1.0) with max_to_keep=1, then dies at
    KILL_POINT while saving checkpoint 2 (all weights 2.0).

  python ckpt_crash_helper.py --trainer KILL_POINT STEP TRAINER_FLAGS...
    runs lingshard.trainer and dies at KILL_POINT of the save of step STEP.

Kill points, in the order a save goes through them (all are hooks on the
functions the production save calls, which otherwise run unchanged):
  before_merge   shards written to <prefix>_temp/, not yet merged
  mid_merge      ckpt-2.index/.data written, then truncated (a torn write)
  before_state   ckpt-2 complete, the `checkpoint` state file not updated
  mid_state      inside TF's atomic write of the state file: its temporary
                 file is written, the rename over `checkpoint` not done
  before_sweep   the state file names ckpt-2, ckpt-1 not yet deleted
"""

import os
import signal
import sys

# The start-up before TensorFlow's import, as in the trainer: TensorFlow then
# loads without jax, matplotlib and Keras (lingshard/startup.py; ~1 s).
from lingshard import startup

if __name__ == '__main__':
  startup.Install()

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


def Patch(kill_point, prefix):
  """Makes the next save of checkpoint `prefix` die at `kill_point`."""
  gen_io_ops = functional_saver.gen_io_ops
  real_merge = gen_io_ops.merge_v2_checkpoints

  def Merge(*args, **kwargs):
    if kill_point == 'before_merge':
      _Die()
    out = real_merge(*args, **kwargs)
    if kill_point == 'mid_merge':
      directory, base = os.path.split(prefix)
      for name in os.listdir(directory):
        if name.startswith(base + '.'):
          path = os.path.join(directory, name)
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
  # The real file_io.atomic_write_string_to_file writes its temporary file,
  # then calls this module-level rename.
  real_rename = file_io.rename

  def Rename(oldname, newname, overwrite=False):
    if (kill_point == 'mid_state' and
        os.path.basename(newname) == 'checkpoint'):
      _Die()
    return real_rename(oldname, newname, overwrite)

  file_io.rename = Rename
  manager_cls = checkpoint_management.CheckpointManager
  real_sweep = manager_cls._sweep  # pylint: disable=protected-access

  def Sweep(self):
    if kill_point == 'before_sweep':
      _Die()
    return real_sweep(self)

  manager_cls._sweep = Sweep  # pylint: disable=protected-access


def main(train_dir, kill_point):
  params = model_registry.GetParams('toy.FFRegression')
  task = params.task.Instantiate()
  state = state_lib.TrainState(task, step_lib.TrainStep(task))
  ckpt = checkpointer.Checkpointer(train_dir, state, max_to_keep=1)
  _SetAll(state, 1.0)
  state.step.assign(1)
  ckpt.Save(1)
  print('saved 1', flush=True)
  _SetAll(state, 2.0)
  state.step.assign(2)
  Patch(kill_point, os.path.join(train_dir, 'ckpt-2'))
  ckpt.Save(2)
  print('saved 2 (not killed)', flush=True)


def TrainerMain(kill_point, kill_step, trainer_args):
  """Runs the trainer binary; dies at `kill_point` of the save of
  `kill_step`."""
  from lingshard import trainer  # pylint: disable=import-outside-toplevel
  real_save = checkpointer.Checkpointer.Save

  def Save(self, step):
    if step == kill_step:
      Patch(kill_point, os.path.join(self.train_dir, f'ckpt-{step}'))
    return real_save(self, step)

  checkpointer.Checkpointer.Save = Save
  sys.argv = [sys.argv[0]] + list(trainer_args)
  trainer.RunFromCommandLine()


if __name__ == '__main__':
  if sys.argv[1] == '--trainer':
    TrainerMain(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
  else:
    main(sys.argv[1], sys.argv[2])
