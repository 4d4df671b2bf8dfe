"""The circular schedule with bfloat16 activations (fprop_dtype), as
fill-drain: float32 weights and gradients, bfloat16 body activations; the
circular pipeline computes fill-drain's numbers and stays within bfloat16
rounding of the unpipelined bfloat16 stack (the tolerance of
test_moe_layer's bfloat16 test), with finite gradients."""

import numpy as np
import tensorflow as tf

from lingshard.layers import pipeline
from lingshard.layers import pipeline_schedule
from tests.layers import pipeline_testlib


def _Layer(schedule):
  return pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=4, num_stages=2, num_micro_batches=2,
      fprop_dtype=tf.bfloat16, schedule=schedule,
      body_tpl=pipeline_testlib.MlpBody.Params().Set(
          dim=4, dropout_prob=0.3)).Instantiate()


def _OutputAndGrads(layer, pipelined):
  rng = np.random.RandomState(2)
  x, ctx, cot = (rng.normal(size=s).astype(np.float32)
                 for s in ([8, 3, 4], [8, 4], [8, 3, 4]))
  pad = (rng.rand(8, 3) < 0.25).astype(np.float32)
  fprop = layer.FProp if pipelined else layer.FPropUnpipelined
  x, pad, ctx = (tf.cast(v, tf.bfloat16) for v in (x, pad, ctx))
  with tf.GradientTape() as tape:
    y, aux = fprop(layer.theta, x, pad, ctx, step=tf.constant(7))
    loss = (tf.reduce_sum(tf.cast(y, tf.float32) * cot) +
            tf.cast(aux.aux_loss, tf.float32))
  assert y.dtype == tf.bfloat16
  return tf.cast(y, tf.float32), tape.gradient(loss, layer.theta)


def _RelErr(a, b):
  return float(tf.reduce_max(tf.abs(a - b)) / tf.reduce_max(tf.abs(b)))


def test_circular_bfloat16_matches_fill_drain_and_the_unpipelined_stack():
  circular = _Layer(pipeline_schedule.Circular.Params().Set(repeats=2))
  fill_drain = _Layer(pipeline_schedule.FillDrain.Params())
  assert circular.theta.fc.w.dtype == tf.float32
  y, grads = _OutputAndGrads(circular, True)
  y_fd, grads_fd = _OutputAndGrads(fill_drain, True)
  y_ref, grads_ref = _OutputAndGrads(circular, False)
  # Per layer: fill-drain stacks layers {0, 1} on stage 0, circular {0, 2}.
  got, fd, ref = (layer.LayerThetas(g) for layer, g in (
      (circular, grads), (fill_drain, grads_fd), (circular, grads_ref)))
  np.testing.assert_allclose(y.numpy(), y_fd.numpy(), rtol=1e-6)
  assert _RelErr(y, y_ref) < 2e-2
  flat = [tf.nest.flatten(g) for g in (got, fd, ref)]
  assert len(flat[0]) == 4 * 4
  for g, g_fd, g_ref in zip(*flat):
    assert g.dtype == tf.float32 and np.all(np.isfinite(g.numpy()))
    np.testing.assert_allclose(g.numpy(), g_fd.numpy(), rtol=1e-5,
                               atol=1e-6)
    assert _RelErr(g, g_ref) < 3e-2
