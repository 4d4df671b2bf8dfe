"""The pipelined AmoebaNet through the trainer (in this process): its cells'
batch-norm moving averages, stacked in one `moving` [K, 3, Dmax] weight
(layers/pipeline_cell_weights.py), are trained, checkpointed and restored
bit-exactly on resume, their padding columns stay at zero, and evaluation
reads them (tests/trainer/test_trainer_image.py does this for the
unpipelined ResNet)."""

import json
import os

import numpy as np
import tensorflow as tf

from lingshard import trainer
from lingshard.data import image_prepare
from lingshard.layers import batch_norm
from lingshard.train import checkpointer
from lingshard.train import eval_loop
from tests.data import image_testlib
from tests.trainer import trainer_testlib

_MODEL = 'gpipe.MnistAmoebaNetPipelined'
_MOVING = 'model/body/moving'


def _Args(logdir, data_dir, max_steps, mode='train'):
  """The cheapest pipelined AmoebaNet with K = 2 stages, M = 2
  micro-batches and remat: a stride-2 stem (14 x 14 x 4), a stem reduction
  cell (7 x 7, 2 filters) on stage 0 and one normal cell (4 filters) on
  stage 1, whose batch norms are wider: stage 0's row of `moving` is
  padded."""
  return [f'--model={_MODEL}', f'--logdir={logdir}',
          f'--max_steps={max_steps}', f'--mode={mode}', '--seed=5',
          f"--params_override=input.data_dir='{data_dir}';"
          'input.batch_size=8;task.filters=4;task.stem_filters=4;'
          'task.stem_stride=2;task.num_stem_cells=1;task.num_normal_cells=1;'
          'task.num_reduction_cells=0;task.pipeline_tpl.num_stages=2;'
          'task.pipeline_tpl.num_micro_batches=2;'
          'task.pipeline_tpl.remat=True;task.train.save_interval_steps=2',
          f"--eval_params_override=input.data_dir='{data_dir}'"]


def _StageWidths(body):
  """Per stage, the columns its cells' batch norms use in `moving` (the
  sum of their D, from each cell's declared weights); the rest pad."""
  widths, first = [], 0
  for count in body.StageSplits():
    width = 0
    for cell in body.cells[first:first + count]:
      for key, wp in cell.DeclaredWeights().FlattenItems():
        if key.split('.')[-1] == batch_norm.MOVING:
          width += int(wp.shape[-1])
    widths.append(width)
    first += count
  return widths


def _EvalJson(logdir):
  with open(os.path.join(logdir, 'eval_dev', 'metrics-00000004.json'),
            encoding='utf-8') as f:
    return json.load(f)


def test_stacked_moving_averages_train_resume_bitwise_and_feed_eval(
    tmp_path):
  data = str(tmp_path / 'digits')
  image_prepare.Prepare(image_testlib.FakeWheel(tmp_path / 'fake.whl'), data)
  straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
  want, got = trainer_testlib.StraightAndResumed(
      lambda logdir, steps: _Args(logdir, data, steps), straight, resumed)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)

  cfg = trainer_testlib.ParseFlags(*_Args(resumed, data, 4, mode='eval'))
  params, _ = trainer.BuildParams(cfg)
  body = params.task.Instantiate().body
  assert body.StageSplits() == [1, 1]
  widths = _StageWidths(body)
  moving = want[checkpointer.WeightKey(_MOVING)]
  assert moving.shape == (2, 3, max(widths))
  assert widths[0] < widths[1], widths  # Stage 0's row has padding.
  decay = params.task.bn_decay
  for stage, width in enumerate(widths):
    # Trained: every real column's debiasing row is 1 - decay^4 after 4
    # steps (not 0); the padding columns never moved from their zeros.
    np.testing.assert_allclose(moving[stage, 2, :width], 1.0 - decay**4,
                               rtol=1e-5)
    np.testing.assert_array_equal(moving[stage, :, width:], 0.0)

  trainer_testlib.Run(*_Args(resumed, data, 4, mode='eval'))
  result = _EvalJson(resumed)
  assert result['languages']['all']['examples'] == 1000
  # The eval job's restored theta: evaluated again it gives the job's
  # metrics; with the stacked moving averages reset to their initial
  # zeros (mean 0, variance 1) the metrics move, so eval read them.
  dev, _ = trainer.BuildParams(cfg, 'Dev', for_eval=True)
  theta, step = trainer.RestoredTheta(params, str(resumed))
  assert step == 4
  np.testing.assert_array_equal(theta.body.moving.numpy(), moving)
  evaluator = eval_loop.Evaluator(trainer.InferenceTask(dev),
                                  dev.input.Instantiate())
  assert evaluator.Evaluate(theta, step)['metrics'] == result['metrics']
  theta.body.moving.assign(tf.zeros_like(theta.body.moving))
  reset = evaluator.Evaluate(theta, step)['metrics']
  assert reset['loss'] != result['metrics']['loss']
