"""The circular schedule (pipeline_schedule.Circular, R = 2 chunks per
stage): the same loss, aux and gradients as the unpipelined stack over the
same weights, unrolled and as while loops, with and without remat; each
stage keeps its own chunks; bad configs are one line (MoE bodies:
test_pipeline_circular_moe.py)."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import pipeline
from lingshard.layers import pipeline_schedule
from lingshard.spmd import check
from tests.layers import pipeline_testlib

_B, _T, _D = 8, 3, 4
_STEP = 7


def _Circular(repeats=2):
  return pipeline_schedule.Circular.Params().Set(repeats=repeats)


def _Layer(num_layers, num_stages, num_micro_batches, remat, loop=True,
           **kwargs):
  return pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=num_layers, num_stages=num_stages,
      num_micro_batches=num_micro_batches, remat=remat, loop=loop,
      schedule=_Circular(), body_tpl=pipeline_testlib.MlpBody.Params().Set(
          dim=_D, dropout_prob=0.3), **kwargs).Instantiate()


def _Inputs():
  rng = np.random.RandomState(2)
  return (rng.normal(size=[_B, _T, _D]).astype(np.float32),
          (rng.rand(_B, _T) < 0.25).astype(np.float32),
          rng.normal(size=[_B, _D]).astype(np.float32),
          rng.normal(size=[_B, _T, _D]).astype(np.float32))


def _LossAndGrads(layer, pipelined):
  """(loss, per-layer gradients) of the pipeline or of its layers one
  after another on the whole batch (FPropUnpipelined: same keys)."""
  x, pad, ctx, cot = _Inputs()
  fprop = layer.FProp if pipelined else layer.FPropUnpipelined

  @tf.function(autograph=False)
  def Fn():
    with tf.GradientTape() as tape:
      y, aux = fprop(layer.theta, x, pad, ctx, step=tf.constant(_STEP))
      loss = tf.reduce_sum(y * cot) + aux.aux_loss + aux.metrics.h_mean
    return loss, tape.gradient(loss, layer.theta)

  loss, grads = Fn()
  return loss.numpy(), layer.LayerThetas(grads)


def _AssertGradsEqual(got, want):
  errors = [check.Compare(f'{i}.{key}', w.numpy(), g.numpy(), rtol=1e-5,
                          atol=0.0)
            for i, (g_layer, w_layer) in enumerate(zip(got, want))
            for (key, w), g in zip(w_layer.FlattenItems(), g_layer.Flatten())]
  assert len(errors) == 4 * len(want)
  assert all(e.ok for e in errors), [e for e in errors if not e.ok]


@pytest.mark.parametrize('num_layers,num_stages,num_micro_batches,remat,loop',
                         [(8, 2, 4, True, True), (8, 2, 2, True, False),
                          (5, 2, 4, True, True), (4, 2, 2, False, False)])
def test_circular_equals_the_unpipelined_stack(
    num_layers, num_stages, num_micro_batches, remat, loop):
  layer = _Layer(num_layers, num_stages, num_micro_batches, remat, loop)
  loss, grads = _LossAndGrads(layer, True)
  want_loss, want_grads = _LossAndGrads(layer, False)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  _AssertGradsEqual(grads, want_grads)


def test_each_stage_holds_chunks_k_and_k_plus_num_stages():
  layer = _Layer(8, 2, 4, True)
  # Chunks of 2 layers: stage 0 holds chunks 0 and 2, stage 1 chunks 1, 3.
  np.testing.assert_array_equal(layer.stack.layer_ids,
                                [[0, 1, 4, 5], [2, 3, 6, 7]])
  assert layer.theta.fc.w.shape == (2, 4, _D, 8)
  assert layer.StageSplits() == [4, 4] and layer.ChunkSplits() == [2] * 4
  # Uneven: 5 layers in 4 chunks by cost, shorter chunks padded.
  layer = _Layer(5, 2, 4, True)
  assert layer.ChunkSplits() == [2, 1, 1, 1]
  np.testing.assert_array_equal(layer.stack.active, [[1, 1, 1, 0],
                                                     [1, 0, 1, 0]])
  np.testing.assert_array_equal(layer.stack.layer_ids[layer.stack.active > 0],
                                [0, 1, 3, 2, 4])
  tables = pipeline_schedule.Tables(layer.schedule, 4, 2)
  assert tables.n == 2 * 4 + 2 - 1  # Bubble 1/9 (fill-drain: 1/5).
  np.testing.assert_array_equal(tables.outputs, [5, 6, 7, 8])


def test_bad_circular_configs_are_one_line_errors():
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: the circular schedule cuts num_layers 3 into num_stages x '
      r'repeats = 2 x 2 = 4 chunks; use at least 4 layers or fewer '
      r'repeats$')):
    _Layer(3, 2, 4, True)
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: the circular schedule needs at least num_stages 4 '
      r'micro-batches \(a micro-batch re-enters stage 0 after leaving the '
      r'last\), got 2$')):
    _Layer(8, 4, 2, True)
  layer = _Layer(8, 4, None, True, micro_batch_size=4)
  x, pad, ctx, _ = _Inputs()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: the circular schedule needs at least num_stages 4 '
      r'micro-batches .*, got 2$')):
    layer.FProp(layer.theta, x, pad, ctx)
  p = pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=8, num_stages=2, num_micro_batches=2,
      schedule=_Circular(0), body_tpl=pipeline_testlib.MlpBody.Params())
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: schedule.repeats must be an int >= 1, got 0$')):
    p.Instantiate()
  assert ('schedule.cls : type/lingshard.layers.pipeline_schedule/Circular'
          in p.ToText())
  assert 'schedule.repeats : 0' in p.ToText()


def test_batch_norm_moments_are_fill_drains_layer_by_layer():
  """Batch norm uses micro-batch statistics: the circular pipeline's
  per-layer moments (each chunk's aux credited to its own layers) are
  fill-drain's."""
  x, pad, ctx, _ = _Inputs()
  got = []
  for schedule in (_Circular(), pipeline_schedule.FillDrain.Params()):
    layer = pipeline.PipelinedLayer.Params().Set(
        name='stack', num_layers=4, num_stages=2, num_micro_batches=2,
        remat=False, schedule=schedule,
        body_tpl=pipeline_testlib.MlpBody.Params().Set(
            dim=_D, batch_norm=True)).Instantiate()
    y, aux = layer.FProp(layer.theta, x, pad, ctx, step=tf.constant(_STEP))
    got.append((y.numpy(), [m.count.numpy() for m in aux.moments],
                tf.nest.flatten(aux.moments)))
  np.testing.assert_allclose(got[0][0], got[1][0], rtol=1e-5, atol=1e-6)
  # Each layer saw the 8 rows' real positions once.
  assert got[0][1] == got[1][1] == [float((pad == 0).sum())] * 4
  for a, b in zip(got[0][2], got[1][2]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
