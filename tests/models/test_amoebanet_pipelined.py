"""gpipe.MnistAmoebaNetPipelined (AmoebaNetClassifier.pipeline_tpl: the cells
as a CellPipelinedLayer): the task equals the unpipelined MnistAmoebaNet
run on each micro-batch with the same per-cell weights (GPipe §2.2 batch
norm); eval after a train step reads the stacked moving averages; the
stage shapes in print_params; the ImageNet pipelined configs' counts."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import config_check
from lingshard import model_registry
from lingshard import trainer
from lingshard.layers import batch_norm
from lingshard.layers import pipeline_run
from lingshard.models import amoebanet_model
from lingshard.nested_map import NestedMap
from lingshard.tools import count_params
from lingshard.train import step as train_step
from tests.trainer import trainer_testlib

model_registry.ImportAllParams()

_B, _M = 8, 4
# 8 x 8 digits: the stem cell halves to 4 x 4, the reduction cell to 2 x 2.
_SMALL = dict(image_shape=(8, 8, 1), num_classes=6, bn_decay=0.7, filters=8,
              stem_filters=8)


def _Params(key, **kw):
  p = model_registry.GetParams(key, 'Train').task
  return p.Set(**_SMALL).Set(**kw)


def _Batch(seed=0):
  rng = np.random.RandomState(seed)
  return NestedMap(
      image=rng.normal(1.0, 2.0, size=[_B, 8, 8, 1]).astype(np.float32),
      label=rng.randint(0, 6, size=[_B]).astype(np.int32))


def _PlainTheta(piped, theta):
  """The unpipelined task's theta of the pipelined task's weights."""
  return NestedMap(stem=theta.stem, stem_bn=theta.stem_bn,
                   cells=piped.body.CellThetas(theta.body),
                   logits=theta.logits)


def _PerMicroBatch(plain, theta, batch):
  """The unpipelined task with its cells on each micro-batch (the stem and
  head on the whole batch): the loss."""
  x = plain.stem_bn.FProp(theta.stem_bn,
                          plain.stem.FProp(theta.stem, batch.image))
  rows = pipeline_run.MicroBatchRows(_B, _M, 1)
  ys = [None] * _B
  for mb in range(_M):
    h, prev = tf.gather(x, rows[mb]), None
    for cell, cell_theta in zip(plain.cells, theta.cells):
      prev, h = h, cell.FProp(cell_theta, h, prev)
    for r, row in enumerate(rows[mb]):
      ys[row] = h[r]
  logits = plain.logits.FProp(
      theta.logits, plain.gap.FProp(None, tf.nn.relu(tf.stack(ys))))
  metrics, _ = plain.ComputeLoss(theta, NestedMap(logits=logits), batch)
  return metrics.loss[0]


def test_pipelined_task_equals_the_unpipelined_run_per_micro_batch():
  piped = _Params('gpipe.MnistAmoebaNetPipelined').Instantiate()
  plain = _Params('gpipe.MnistAmoebaNet').Instantiate()
  assert piped.body.StageSplits() == [2, 2]
  theta, batch = piped.theta, _Batch()
  metrics, _, grads = piped.LossAndGradients(theta, batch)
  with tf.GradientTape() as tape:
    tape.watch(theta.Flatten())
    want_loss = _PerMicroBatch(plain, _PlainTheta(piped, theta), batch)
  want = tape.gradient(want_loss, theta, unconnected_gradients='zero')
  np.testing.assert_allclose(metrics.loss[0].numpy(), want_loss.numpy(),
                             rtol=1e-5)
  # Every leaf, the cells' read per cell (moving: the moment sums of the
  # micro-batches, which the step turns into the whole mini-batch's).
  got, exp = _PlainTheta(piped, grads), _PlainTheta(piped, want)
  for (key, g), (_, w) in zip(got.FlattenItems(), exp.FlattenItems()):
    scale = max(1.0, float(np.abs(w.numpy()).max()))
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-4,
                               atol=2e-5 * scale, err_msg=key)
  assert float(tf.norm(grads.body.w)) > 0.0


def test_eval_after_a_step_reads_the_stacked_moving_averages():
  """decay 0: one step sets every moving average to this batch's
  statistics. The pipelined eval task (the cells on the whole batch) then
  equals the unpipelined eval task on the per-cell weights, and differs
  from its output before the step; setting only the stacked moving
  averages (the stem's kept as before) moves the output too."""
  params = _Params('gpipe.MnistAmoebaNetPipelined', bn_decay=0.0)
  params.pipeline_tpl.remat = False  # The equality test above has it; eager
  # remat builds each stage's backward graph anew (3x this test's time).
  params.train.Set(optimizer='sgd', learning_rate=0.0)
  task = params.Instantiate()
  evals = amoebanet_model.AmoebaNetClassifier.InferenceParams(params)
  eval_task = evals.Instantiate()
  plain_eval = amoebanet_model.AmoebaNetClassifier.InferenceParams(
      _Params('gpipe.MnistAmoebaNet', bn_decay=0.0)).Instantiate()
  theta, batch = task.theta, _Batch(1)
  before = eval_task.ComputePredictions(theta, batch).logits.numpy()
  stepper = train_step.TrainStep(task)
  new, _, out = stepper(theta, stepper.InitOptState(theta), batch,
                        tf.constant(0, tf.int64))
  assert float(out.is_finite[0]) == 1.0
  assert not np.allclose(new.body.moving.numpy(), theta.body.moving.numpy())
  np.testing.assert_array_equal(new.body.w.numpy(), theta.body.w.numpy())
  after = eval_task.ComputePredictions(new, batch).logits.numpy()
  assert np.abs(after - before).max() > 1e-2
  want = plain_eval.ComputePredictions(_PlainTheta(task, new),
                                       batch).logits.numpy()
  np.testing.assert_allclose(after, want, rtol=1e-4, atol=1e-5)
  # The first cell's first BN (its `base` conv of the stem's output) holds
  # the whole batch's mean after the step.
  first = task.body.CellThetas(new.body)[0]
  x = task.stem_bn.FProp(theta.stem_bn, task.stem.FProp(theta.stem,
                                                        batch.image))
  h = task.body.cells[0].base.conv.FProp(first.base.conv,
                                         tf.nn.relu(x)).numpy()
  np.testing.assert_allclose(batch_norm.MovingMean(first.base.bn).numpy(),
                             h.reshape(-1, h.shape[-1]).mean(0), rtol=1e-4,
                             atol=1e-5)
  mixed = theta.copy()  # Before the step but the cells' moving averages.
  mixed.body = NestedMap(w=theta.body.w, moving=new.body.moving)
  moved = eval_task.ComputePredictions(mixed, batch).logits.numpy()
  assert np.abs(moved - before).max() > 1e-2


def test_print_params_lists_the_derived_stage_shapes():
  lines = []
  trainer.Execute(trainer_testlib.ParseFlags(
      '--model=gpipe.MnistAmoebaNetPipelined', '--mode=print_params'),
                  printer=lines.append)
  assert lines[-1].splitlines() == [
      '# pipeline stages (derived):',
      'model/body: stage 0: cells 0-1, in x [28,28,16] prev - -> out '
      '[14,14,64] prev [14,14,24]',
      'model/body: stage 1: cells 2-3, in x [14,14,64] prev [14,14,24] -> '
      'out [7,7,128] prev [7,7,96]']


def test_amoebanet_b_pipelined_counts_each_cell_once():
  """count_params of gpipe.AmoebaNetB_18_512Pipelined (K = 4 stages) ==
  the unpipelined config's (each cell's own weights, not the padding of
  the stage rows: 558,009,288, GPipe's 557M); its 4 stages are listed;
  config_check passed on its mesh (CountModel validates first)."""
  key = 'gpipe.AmoebaNetB_18_512Pipelined'
  counts = count_params.CountModel(key)
  plain = model_registry.GetParams('gpipe.AmoebaNetB_18_512', 'Train').task
  assert counts.total == count_params.CountTask(plain.Instantiate()).total
  assert counts.num_devices == 4
  assert [line.split(',')[0] for line in counts.stage_shapes] == [
      'model/body: stage 0: cells 0-6', 'model/body: stage 1: cells 7-11',
      'model/body: stage 2: cells 12-16', 'model/body: stage 3: cells 17-21']


@pytest.mark.parametrize('override,message', [
    ('input.batch_size=62', 'input.batch_size=62: model/body: '
     'num_micro_batches 4 does not divide the batch 62; use a divisor of 62'),
    ('task.pipeline_tpl.stage_splits=[1,2,1]', 'body: stage_splits [1, 2, '
     '1] must be 2 counts >= 1 summing to the 4 cells'),
    ('task.pipeline_tpl.num_stages=5', 'body: num_stages 5 exceeds the 4 '
     'cells; use at most 4 stages'),
])
def test_bad_pipelines_are_one_line_errors_before_anything_runs(
    tmp_path, override, message):
  with pytest.raises(config_check.ConfigCheckError) as e:
    trainer.Execute(trainer_testlib.ParseFlags(
        '--model=gpipe.MnistAmoebaNetPipelined', '--mode=train',
        f'--logdir={tmp_path}', f'--params_override={override}'),
                    printer=lambda line: None)
  assert str(e.value) == message
  assert not list(tmp_path.iterdir())  # Nothing written.
