"""m4.MoE2048E60L's bfloat16 activations (GShard §4.1), checked in the
traced train step of the config shrunk to CPU size (its own params with
small dims, fprop_dtype kept): weights, gradients and optimizer slots are
float32; matmuls run in bfloat16; every softmax (the gating softmax of
Algorithm 1, attention, the loss's log-softmax) and the loss are float32."""

import collections

import tensorflow as tf

from lingshard import base_input
from lingshard import model_registry
from lingshard.train import step as step_lib
from tests.models import mt_testlib


def _ShrunkTask():
  params = model_registry.GetParams('m4.MoE2048E60L', 'Train')
  p = params.task
  assert p.fprop_dtype == tf.bfloat16 and p.dtype is None  # float32 root.
  p.Set(model_dim=16, hidden_dim=32, num_heads=2, dim_per_head=8,
        num_encoder_layers=2, num_decoder_layers=2, src_vocab_size=23,
        tgt_vocab_size=19, device_mesh=None, input_dropout_prob=0.0,
        residual_dropout_prob=0.0, atten_dropout_prob=0.0)
  p.moe_tpl.Set(num_experts=4, num_groups=2, device_mesh=None)
  return p


def test_bf16_step_keeps_float32_weights_gating_and_loss():
  p = _ShrunkTask()
  task = p.Instantiate()
  batch = base_input.NumericBatch(mt_testlib.SyntheticBatch(
      p, batch_size=4, src_len=6, tgt_len=5))
  train_step = step_lib.TrainStep(task)
  theta = task.theta.Transform(lambda v: v.read_value())
  opt_state = train_step.InitOptState(theta)
  step = tf.function(train_step.Pure, autograph=False)
  graph = step.get_concrete_function(theta, opt_state, batch,
                                     tf.constant(0, tf.int64)).graph
  dtypes = collections.defaultdict(collections.Counter)
  for op in graph.get_operations():
    if op.type in ('Softmax', 'LogSoftmax', 'Einsum', 'MatMul',
                   'BatchMatMulV2'):
      dtypes[op.type][op.outputs[0].dtype] += 1
  assert set(dtypes['Softmax']) == {tf.float32}
  # Gating (2 MoE layers) + attention (enc self, dec self, dec cross).
  assert sum(dtypes['Softmax'].values()) >= 2 + 6
  assert set(dtypes['LogSoftmax']) == {tf.float32}
  # The expert and attention matmuls run in bfloat16.
  assert dtypes['Einsum'][tf.bfloat16] > 10
  new_theta, new_opt, metrics = step(theta, opt_state, batch,
                                     tf.constant(0, tf.int64))
  assert {t.dtype for t in theta.Flatten()} == {tf.float32}
  assert {t.dtype for t in tf.nest.flatten(new_theta)} == {tf.float32}
  assert {t.dtype for t in tf.nest.flatten(new_opt)} == {tf.float32}
  assert metrics.loss[0].dtype == tf.float32
  assert metrics.is_finite[0].numpy() == 1.0
  # The gating logits einsum (GSM,ME->GSE) is float32: find it by its
  # output's last dim E = 4 and rank 3.
  gating = [op for op in graph.get_operations() if op.type == 'Einsum' and
            op.outputs[0].shape.rank == 3 and op.outputs[0].shape[-1] == 4]
  assert gating and {op.outputs[0].dtype for op in gating} == {tf.float32}
