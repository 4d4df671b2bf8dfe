"""The schedule as a forward and a hand-written backward while loop
(pipeline_loop, `loop=True` with remat): the same loss, outputs, aux and
gradients (theta, the inputs and a per-example extra) as the schedule
traced iteration by iteration, in a program whose size does not grow with
the number of micro-batches."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import pipeline
from lingshard.spmd import check
from tests.layers import pipeline_testlib

_B, _T, _D, _L = 8, 3, 4, 4
_STEP = 7


def _Layer(num_stages, num_micro_batches, loop):
  return pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=_L, num_stages=num_stages,
      num_micro_batches=num_micro_batches, remat=True, loop=loop,
      body_tpl=pipeline_testlib.MlpBody.Params().Set(
          dim=_D, dropout_prob=0.3)).Instantiate()


def _Inputs():
  rng = np.random.RandomState(1)
  return (rng.normal(size=[_B, _T, _D]).astype(np.float32),
          (rng.rand(_B, _T) < 0.25).astype(np.float32),
          rng.normal(size=[_B, _D]).astype(np.float32),
          rng.normal(size=[_B, _T, _D]).astype(np.float32))


def _Step(layer):
  """fn(theta leaves) -> [loss, y, aux_loss, h_mean, dx, dctx, *dtheta]."""
  x, pad, ctx, cot = _Inputs()

  def Fn(*leaves):
    x_t, ctx_t = tf.constant(x), tf.constant(ctx)
    theta = layer.theta.Pack(list(leaves))
    with tf.GradientTape() as tape:
      tape.watch(list(leaves) + [x_t, ctx_t])
      y, aux = layer.FProp(theta, x_t, pad, ctx_t, step=tf.constant(_STEP))
      loss = tf.reduce_sum(y * cot) + aux.aux_loss + aux.metrics.h_mean
    grads = tape.gradient(loss, [x_t, ctx_t] + list(leaves))
    return [loss, y, aux.aux_loss, aux.metrics.h_mean] + grads

  return Fn


@pytest.mark.parametrize('num_stages,num_micro_batches', [(2, 4), (4, 2),
                                                          (1, 4)])
def test_while_loops_equal_the_iterations_traced_one_by_one(
    num_stages, num_micro_batches):
  results = []
  for loop in (True, False):
    layer = _Layer(num_stages, num_micro_batches, loop)
    fn = tf.function(_Step(layer), autograph=False)
    results.append([t.numpy() for t in fn(*layer.theta.Flatten())])
  looped, traced = results
  assert len(looped) == 6 + len(_Layer(1, 1, True).theta.Flatten())
  for a, b in zip(looped, traced):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Gradients reach the inputs and every stage's weights.
  assert all(np.abs(g).max() > 0 for g in looped[4:])


def _ProgramSize(num_micro_batches, loop):
  layer = _Layer(2, num_micro_batches, loop)
  fn = tf.function(_Step(layer), autograph=False, jit_compile=True)
  hlo = fn.experimental_get_compiler_ir(*layer.theta.Flatten())(
      stage='hlo_serialized')
  return check.ProgramSize(hlo)


def test_the_loop_program_does_not_grow_with_micro_batches():
  # M + K - 1 = 3 and 9 iterations. The loop's program grows only by the
  # per-micro-batch bookkeeping around it (each iteration's aux combined
  # over the micro-batches), not by stage computations.
  looped = [_ProgramSize(m, True) for m in (2, 8)]
  traced = [_ProgramSize(m, False) for m in (2, 8)]
  print('HLO instructions, M = 2, 8: loop', looped, 'traced', traced)
  assert traced[1] > 2 * traced[0], traced
  assert looped[1] - looped[0] < (traced[1] - traced[0]) / 10, (
      looped, traced)
