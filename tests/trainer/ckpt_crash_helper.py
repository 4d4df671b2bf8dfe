"""Subprocess helper of the checkpoint tests: dies by SIGKILL (or stops and
waits for a signal) at a chosen point of a save.

  python ckpt_crash_helper.py TRAIN_DIR KILL_POINT
    saves checkpoint 1 (all weights 1.0) with max_to_keep=1, then dies at
    KILL_POINT while saving checkpoint 2 (all weights 2.0).

  python ckpt_crash_helper.py --trainer KILL_POINT STEP TRAINER_FLAGS...
    runs lingshard.trainer and dies at KILL_POINT of the save of step STEP.

  python ckpt_crash_helper.py --pause KILL_POINT STEP TRAINER_FLAGS...
    the same, but at KILL_POINT prints `paused KILL_POINT STEP` and sleeps
    until a signal (sent by the test) ends it.

Kill points, in the order a save goes through them (TF's write is hooked
on the op it calls; the rest are checkpointer.SAVE_STAGES, the save's own
test hook; the production code otherwise runs unchanged):
  before_merge   shards written to <prefix>_temp/, not yet merged
  mid_merge      ckpt-2.index/.data written, then truncated (a torn write)
  before_state   ckpt-2 complete, the `checkpoint` state file not updated
  mid_state      the state file's temporary sibling written (naming
                 ckpt-2), the rename over `checkpoint` not done
  before_sweep   the state file names ckpt-2, ckpt-1 not yet deleted
  mid_sweep      one file of the checkpoints no longer listed deleted
"""

import os
import signal
import sys
import time

# The start-up before TensorFlow's import, as in the trainer: TensorFlow then
# loads without jax, matplotlib and Keras (lingshard/startup.py; ~1 s).
from lingshard import startup

if __name__ == '__main__':
  startup.Install()

from tensorflow.python.checkpoint import functional_saver

from lingshard import model_registry
from lingshard.train import checkpointer
from lingshard.train import state as state_lib
from lingshard.train import step as step_lib

KILL_POINTS = ('before_merge', 'mid_merge') + checkpointer.SAVE_STAGES


def _Die(point, step):
  del point, step
  sys.stdout.flush()
  os.kill(os.getpid(), signal.SIGKILL)


def _Pause(point, step):
  print(f'paused {point} {step}', flush=True)
  time.sleep(600)  # The test signals long before; a lost helper ends.
  sys.exit(9)


def _SetAll(state, value):
  for var in state.theta.Flatten() + state.opt_state.Flatten():
    var.assign(var.read_value() * 0 + value)


def Patch(kill_point, step, prefix, action=_Die):
  """Makes the save of checkpoint `prefix` (of `step`) call
  `action(kill_point, step)` at `kill_point`."""
  assert kill_point in KILL_POINTS, kill_point
  gen_io_ops = functional_saver.gen_io_ops
  real_merge = gen_io_ops.merge_v2_checkpoints

  def Merge(*args, **kwargs):
    if kill_point == 'before_merge':
      action(kill_point, step)
    out = real_merge(*args, **kwargs)
    if kill_point == 'mid_merge':
      directory, base = os.path.split(prefix)
      for name in os.listdir(directory):
        if name.startswith(base + '.'):
          path = os.path.join(directory, name)
          with open(path, 'r+b') as f:
            f.truncate(os.path.getsize(path) // 2)
      action(kill_point, step)
    return out

  gen_io_ops.merge_v2_checkpoints = Merge

  def Stage(stage, at_step):
    if stage == kill_point and at_step == step:
      action(kill_point, step)

  checkpointer.stage_hook = Stage


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
  Patch(kill_point, 2, os.path.join(train_dir, 'ckpt-2'))
  ckpt.Save(2)
  print('saved 2 (not killed)', flush=True)


def TrainerMain(kill_point, kill_step, trainer_args, action=_Die):
  """Runs the trainer binary; calls `action` at `kill_point` of the save of
  `kill_step`."""
  from lingshard import trainer  # pylint: disable=import-outside-toplevel
  real_save = checkpointer.Checkpointer.Save

  def Save(self, step):
    if step == kill_step:
      Patch(kill_point, step, os.path.join(self.train_dir, f'ckpt-{step}'),
            action)
    return real_save(self, step)

  checkpointer.Checkpointer.Save = Save
  # Ctrl-C's KeyboardInterrupt, also when started with SIGINT ignored (a
  # background job, some test runners' workers).
  signal.signal(signal.SIGINT, signal.default_int_handler)
  sys.argv = [sys.argv[0]] + list(trainer_args)
  trainer.RunFromCommandLine()


if __name__ == '__main__':
  if sys.argv[1] in ('--trainer', '--pause'):
    TrainerMain(sys.argv[2], int(sys.argv[3]), sys.argv[4:],
                _Die if sys.argv[1] == '--trainer' else _Pause)
  else:
    main(sys.argv[1], sys.argv[2])
