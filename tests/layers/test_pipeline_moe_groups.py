"""GShard inside GPipe with MoE groups spanning rows: a pipelined
Transformer stack equals a stack built with no pipeline at all.

The registered pipelined MoE configs route groups of 64 or 512 tokens, far
more than one row (S > T): micro-batches must then hold the unpipelined
model's groups (`PipelinedLayer.MicroBatchRows`: consecutive rows within
each data shard), or capacity drops, the outputs and GShard's group aux
loss change. The reference is a separate `TransformerStack` without
`pipeline_tpl` (its own layer paths and seeds), given the pipeline's
weights by name; routing is deterministic (second expert 'all', no
dropout) so that only the grouping can differ, and capacity is small
enough that tokens drop.
"""

import numpy as np
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import pipeline
from lingshard.layers import transformer
from lingshard.layers.moe import top2
from lingshard.nested_map import NestedMap
from lingshard.spmd import check

_B, _T, _M, _E = 16, 4, 8, 4
_S = 2 * _T  # Tokens per MoE group: two rows.
_STEP = 3


def _StackParams(pipelined):
  """A decoder stack of (dense, MoE) x 2 on a [2 data, 2 stage] mesh."""
  moe = top2.MoELayer.Params().Set(
      num_experts=_E, group_size=_S, capacity_factor=0.5,
      second_expert_policy='all', dispatch_impl='einsum',
      **{'aux_loss_weights.group_aux': 0.5})
  p = transformer.TransformerStack.Params().Set(
      name='stack', model_dim=_M, hidden_dim=16, num_heads=2, dim_per_head=4,
      num_layers=4, is_decoder=True, moe_tpl=moe,
      residual_dropout_prob=0.0, atten_dropout_prob=0.0,
      relu_dropout_prob=0.0)
  p.device_mesh = np.arange(4).reshape(2, 2)
  p.mesh_axis_names = ['data', 'stage']
  if pipelined:
    p.pipeline_tpl = pipeline.PipelinedLayer.Params().Set(
        num_stages=2, num_micro_batches=4, remat=True,
        stage_mesh_axis='stage', batch_mesh_axis='data')
  return p


def _Inputs():
  rng = np.random.RandomState(0)
  x = rng.normal(size=[_B, _T, _M]).astype(np.float32)
  pad = np.zeros([_B, _T], np.float32)
  pad[:, -1] = rng.rand(_B) < 0.5
  enc = rng.normal(size=[_B, 3, _M]).astype(np.float32)
  enc_pad = np.zeros([_B, 3], np.float32)
  cot = rng.normal(size=[_B, _T, _M]).astype(np.float32)
  return x, pad, enc, enc_pad, cot


def _LossAuxGrads(stack, theta):
  x, pad, enc, enc_pad, cot = _Inputs()
  with tf.GradientTape() as tape:
    tape.watch(theta.Flatten())
    y, aux = stack.FProp(theta, x, pad, enc, enc_pad,
                         step=tf.constant(_STEP, tf.int64))
    loss = tf.reduce_sum(y * cot) + tf.add_n(
        [a.aux_loss for a in aux.values()])
  return loss, y, aux, tape.gradient(loss, theta)


def _PerLayer(stack, theta):
  """The theta of an unpipelined stack holding `stack`'s weights."""
  return NestedMap(layer=[t for _, t in stack.Layers(theta)],
                   final_ln=theta.final_ln)


# Routing metrics that depend on how tokens are grouped.
_GROUP_METRICS = ('load', 'tokens_per_expert_first', 'dispatched_per_expert',
                  'over_capacity_first', 'frac_dispatched_0',
                  'frac_dispatched_2', 'capacity')


def test_pipelined_moe_keeps_the_unpipelined_groups():
  """B = 16 rows over D = 2 data shards, M = 4 micro-batches: each holds 2
  rows per shard, one whole group of S = 2T tokens (a strided layout,
  rows i::M, would group rows i and i + 4 instead: checked, it fails)."""
  piped = _StackParams(True).Instantiate()
  plain = _StackParams(False).Instantiate()
  theta = piped.theta.Transform(tf.convert_to_tensor)
  ref_theta = _PerLayer(piped, theta)
  # Same weights, matched by name and shape (none are left over).
  assert ([(k, v.shape) for k, v in ref_theta.FlattenItems()] ==
          [(k, v.shape) for k, v in plain.theta.FlattenItems()])

  loss, y, aux, grads = sharding.Function(
      lambda: _LossAuxGrads(piped, theta), xla_compiled=False)()
  # The reference runs eagerly (unannotated, as the graph above): the same
  # ops without the cost of tracing them.
  with sharding.Unannotated():
    want_loss, want_y, want_aux, want_grads = _LossAuxGrads(plain, ref_theta)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  assert sorted(aux) == sorted(want_aux) == ['layer_001', 'layer_003']
  for key, want in want_aux.items():
    np.testing.assert_allclose(aux[key].aux_loss, want.aux_loss, rtol=1e-5,
                               err_msg=key)
    for name in _GROUP_METRICS:
      np.testing.assert_allclose(aux[key].metrics[name], want.metrics[name],
                                 rtol=1e-5, atol=1e-6, err_msg=name)
    # Tokens dropped: grouping decides which.
    assert 0 < float(want.metrics.over_capacity_first) < 1
  got_grads = _PerLayer(piped, grads)
  errors = [check.Compare(name, np.asarray(w), np.asarray(g), rtol=1e-5,
                          atol=0.0)
            for (name, w), g in zip(want_grads.FlattenItems(),
                                    got_grads.Flatten())]
  assert len(errors) > 20 and all(e.ok for e in errors), [
      e for e in errors if not e.ok]
