"""The trainer refuses to resume a pipelined run under another weight
layout: gpipe.TinyDensePipelinedCircular (4 + 4 layers, K = 2) saved with
one chunk per stage (repeats=1: fill-drain's layout, stage 0 = layers
{0, 1}) and resumed with its registered R = 2 (stage 0 = layers {0, 2})
has weights of the same shapes; the CLI exits 1 with one line naming the
pipeline and both layouts, and writes nothing. (The checkpoint is the
trainer's TrainState saved in-process at step 1, not trained: a compiled
training step would cost ~13 s CPU and the layout does not depend on it.)"""

import os

from lingshard import trainer
from lingshard.train import checkpointer
from lingshard.train import state as state_lib
from lingshard.train import step as step_lib
from tests.trainer import trainer_testlib

MODEL = 'gpipe.TinyDensePipelinedCircular'


def test_resuming_under_another_pipeline_layout_is_one_line(prepared_dir,
                                                            tmp_path):
  overrides = ';'.join(trainer_testlib.CorpusOverrides(prepared_dir,
                                                       batch=16))
  params, _ = trainer.BuildParams(trainer_testlib.ParseFlags(
      f'--model={MODEL}', f'--logdir={tmp_path}', '--params_override=' +
      overrides + ';task.pipeline_tpl.schedule.repeats=1'))
  task = params.task.Instantiate()
  state = state_lib.TrainState(task, step_lib.TrainStep(task))
  state.step.assign(1)
  train_dir = os.path.join(tmp_path, 'train')
  checkpointer.Checkpointer(train_dir, state).Save(1)
  before = trainer_testlib.Snapshot(tmp_path)
  run = trainer_testlib.RunTrainer(f'--model={MODEL}', f'--logdir={tmp_path}',
                                   '--mode=train', '--max_steps=2',
                                   f'--params_override={overrides}')
  assert run.returncode == 1, run.stderr[-3000:]
  assert run.stderr.rstrip().splitlines()[-1] == (
      'lingshard.trainer: error: checkpoint '
      f'{os.path.join(train_dir, "ckpt-1")} does not match the model: '
      "pipeline 'model/dec/pipeline' holds layers [[0, 1], [2, 3]] in the "
      'checkpoint but [[0, 2], [1, 3]] in the model (stage -> slot -> '
      'layer, -1 padding): another schedule or stage split would restore '
      'its layers permuted; resume with the layout it was trained with, or '
      'use a new logdir')
  assert 'Traceback' not in run.stderr
  assert trainer_testlib.Snapshot(tmp_path) == before
