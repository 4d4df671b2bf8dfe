"""Per-layer re-materialisation (TransformerStack remat='layer', GShard
§5.1): the same loss and gradients as keeping every activation, XLA-compiled
on one device and partitioned on 8, with routing randomness and dropout on
and tokens dropped; and XLA keeps at most half the temp memory."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard.layers import base_layer
from lingshard.layers import pipeline
from lingshard.layers import remat
from lingshard.layers import transformer
from tests.models import mt_testlib

check = pytest.importorskip('lingshard.spmd.check')

STEP = 5


def _TaskParams(key, policy, **task_kw):
  params = model_registry.GetParams(key, 'Train')
  base_layer.ResolveParams(params, platform='tpu')  # The TPU program.
  tp = params.task.Set(remat=policy, residual_dropout_prob=0.1,
                       atten_dropout_prob=0.1, relu_dropout_prob=0.1,
                       **task_kw)
  if tp.moe_tpl is not None:
    # GShard's random second expert, and capacity small enough to drop.
    tp.moe_tpl.Set(second_expert_policy='random', capacity_factor=0.5)
  return tp


def _Batch(task_params, batch_size=8, length=8):
  batch = mt_testlib.SyntheticBatch(task_params, batch_size=batch_size,
                                    src_len=length, tgt_len=length, seed=4)
  del batch['lang']  # Strings cannot enter an XLA program.
  return batch


def _JitLossAndGrads(task, theta, batch):
  def Step(th, b):
    metrics, _, grads = task.LossAndGradients(
        th, b, step=tf.constant(STEP, tf.int64))
    return metrics.loss[0], grads

  fn = tf.function(Step, jit_compile=True, autograph=False)
  loss, grads = fn(theta, batch)
  return float(loss), grads


def test_layer_remat_equals_no_remat_jit_and_on_8_devices():
  """m4.TinyMoE: each stack recomputes a dense layer and an MoE layer, so
  one program covers both kinds (m4.TinyDense's layers are the dense one's
  code; its memory is the next test's)."""
  key = 'm4.TinyMoE'
  plain = _TaskParams(key, 'none').Instantiate()
  rematted = _TaskParams(key, 'layer').Instantiate()
  assert {'ffn', 'moe'} <= {c for layer in rematted.enc.layer
                            for c in layer.children}
  # Same weights (remat changes no weight path).
  assert ([k for k, _ in rematted.theta.FlattenItems()] ==
          [k for k, _ in plain.theta.FlattenItems()])
  theta = plain.theta.Transform(tf.convert_to_tensor)
  for var, value in zip(rematted.theta.Flatten(), theta.Flatten()):
    var.assign(value)
  batch = _Batch(plain.params)
  # XLA-compiled (jit), one device: remat = no remat.
  want_loss, want_grads = _JitLossAndGrads(plain, theta, batch)
  got_loss, got_grads = _JitLossAndGrads(rematted, theta, batch)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  assert len(want_grads.Flatten()) > 10
  # rtol 1e-5 normwise (check.Compare: max|got - want| / max|want|): XLA
  # fuses the recomputed forward differently, so entries near 0 differ in
  # their last bits.
  errors = [check.Compare(name, np.asarray(want), np.asarray(got),
                          rtol=1e-5, atol=0.0)
            for (name, want), got in zip(want_grads.FlattenItems(),
                                         got_grads.Flatten())]
  assert all(e.ok for e in errors), [e for e in errors if not e.ok]
  # The remat program partitioned for 8 devices matches its 1-device run,
  # and the program that keeps activations.
  result = check.CheckTask(rematted, batch, 8, step=STEP)
  result.AssertOk()
  np.testing.assert_allclose(result.outputs['loss'], want_loss, rtol=1e-5)
  errors = [check.Compare(name, np.asarray(want),
                          result.outputs[f'grads.{name}'], rtol=1e-5,
                          atol=0.0)
            for name, want in want_grads.FlattenItems()]
  assert all(e.ok for e in errors), [e for e in errors if not e.ok]
  assert result.CollectiveCounts()['all-to-all'] > 0


def test_layer_remat_halves_xla_temp_memory():
  """XLA's temp buffers of the loss-and-gradients program (compiled, not
  run) of a 3 + 3-layer TinyDense: at most half with remat='layer'.
  (6 + 6 layers and the whole train step: scripts/bench_remat.py.)"""
  temps, flops = {}, {}
  for policy in ('none', 'layer'):
    task = _TaskParams('m4.TinyDense', policy, device_mesh=None,
                       num_encoder_layers=3,
                       num_decoder_layers=3).Instantiate()
    batch = _Batch(task.params, batch_size=64, length=32)
    result = check.CheckTask(task, batch, 1, step=STEP, compare=False)
    temps[policy], flops[policy] = result.memory['temp'], result.flops
  assert temps['none'] >= 2 * temps['layer'], temps
  # The recomputed forward: more FLOPs, less than a second forward+backward.
  assert flops['none'] < flops['layer'] < 1.5 * flops['none'], flops


def test_recompute_gradient_recomputes_and_equals_plain():
  """remat.Recompute: same values and gradients (float inputs), None for
  the int constant, and the gradient graph runs fn again."""
  calls = []

  def Fn(ins):
    calls.append(1)
    x, w, k = ins
    return [tf.tanh(x @ w) * tf.cast(k, tf.float32), tf.reduce_sum(w)]

  x = tf.random.stateless_normal([3, 4], [1, 2])
  w = tf.random.stateless_normal([4, 5], [3, 4])
  k = tf.constant(3, tf.int32)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([x, w])
    got = remat.Recompute(Fn, [x, w], [k])
    want = Fn([x, w, k])
    loss_got = tf.reduce_sum(got[0] ** 2) + got[1]
    loss_want = tf.reduce_sum(want[0] ** 2) + want[1]
  assert len(calls) == 2
  g_got = tape.gradient(loss_got, [x, w])
  assert len(calls) == 3  # The backward pass recomputed the forward.
  g_want = tape.gradient(loss_want, [x, w])
  for a, b in zip(got + g_got, want + g_want):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_bad_remat_policy_and_pipelined_remat_are_one_line_errors():
  p = transformer.TransformerStack.Params().Set(
      name='enc', model_dim=8, hidden_dim=16, num_heads=2, dim_per_head=4,
      num_layers=2, remat='dots')
  with pytest.raises(ValueError) as e:
    p.Instantiate()
  assert str(e.value) == ("enc: remat must be one of ('none', 'layer'), "
                          "got 'dots'")
  p.Set(remat='layer', pipeline_tpl=pipeline.PipelinedLayer.Params().Set(
      num_stages=2, num_micro_batches=2))
  with pytest.raises(ValueError) as e:
    p.Instantiate()
  assert str(e.value) == (
      "enc: remat='layer' is for an unpipelined stack; a pipeline remats "
      "per stage (set remat='none' and pipeline_tpl.remat)")
