"""A schedule written outside lingshard/ as a subclass: micro-batches enter
last first. It runs in both runners (unrolled and the while loops) and
trains exactly as fill-drain does (same math, another order)."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import pipeline
from lingshard.layers import pipeline_schedule
from tests.layers import pipeline_testlib


class LastFirst(pipeline_schedule.FillDrain):
  """Fill-drain on micro-batches M - 1, ..., 0."""

  def StageWork(self, t, m, k):
    mb, chunk = super().StageWork(t, m, k)
    return np.where(mb >= 0, m - 1 - mb, -1), chunk

  def Entering(self, t, m, k):
    mb, source = super().Entering(t, m, k)
    return (m - 1 - mb if mb >= 0 else -1), source

  def OutputIterations(self, m, k):
    return super().OutputIterations(m, k)[::-1]


def _Train(schedule, loop, steps=3):
  """Losses of `steps` SGD steps on a 2-layer, 2-stage pipeline."""
  layer = pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=2, num_stages=2, num_micro_batches=4,
      loop=loop, schedule=schedule,
      body_tpl=pipeline_testlib.MlpBody.Params().Set(
          dim=4, dropout_prob=0.3)).Instantiate()
  rng = np.random.RandomState(3)
  x = rng.normal(size=[8, 3, 4]).astype(np.float32)
  pad = (rng.rand(8, 3) < 0.25).astype(np.float32)
  ctx = rng.normal(size=[8, 4]).astype(np.float32)
  target = rng.normal(size=[8, 3, 4]).astype(np.float32)

  @tf.function(autograph=False)
  def Step(step):
    with tf.GradientTape() as tape:
      y, aux = layer.FProp(layer.theta, x, pad, ctx, step=step)
      loss = tf.reduce_mean(tf.square(y - target)) + aux.aux_loss
    grads = tape.gradient(loss, layer.theta)
    for v, g in zip(layer.theta.Flatten(), grads.Flatten()):
      v.assign_sub(0.1 * g)
    return loss

  return np.array([Step(tf.constant(s)).numpy() for s in range(steps)])


def test_a_user_schedule_trains_as_fill_drain():
  want = _Train(pipeline_schedule.FillDrain.Params(), loop=True)
  assert want[-1] < want[0]
  for loop in (True, False):
    got = _Train(LastFirst.Params(), loop)
    np.testing.assert_allclose(got, want, rtol=1e-5)


class _FeedsItsOwnOutput(LastFirst):
  def Entering(self, t, m, k):
    return super().Entering(t, m, k)[0], t


def test_a_schedule_that_reads_an_output_before_it_exists_is_one_line():
  layer = pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=2, num_stages=2, num_micro_batches=2,
      schedule=_FeedsItsOwnOutput.Params(),
      body_tpl=pipeline_testlib.MlpBody.Params()).Instantiate()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: schedule _FeedsItsOwnOutput feeds stage 0 an output of the '
      r'same or a later iteration$')):
    layer.FProp(layer.theta, np.zeros([4, 3, 4], np.float32),
                np.zeros([4, 3], np.float32), np.zeros([4, 4], np.float32))
