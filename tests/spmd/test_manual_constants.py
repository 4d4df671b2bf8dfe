"""Constants enter manual regions through SPMDFullToShardShape, so manual
partitioning cannot leak into automatically partitioned code."""

import numpy as np
import tensorflow as tf

from lingshard import sharding
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from lingshard.spmd import manual_constants
from lingshard.spmd import xla_runtime

G, S, M = 8, 4, 3
_MESH = np.arange(8)


def _Loss(x, ids, w):
  """A per-group segment sum under manual partitioning, and the same sum
  done automatically: both start from a zero constant, which TF/MLIR share.
  """
  h = sharding.split(x * w, 0, 8)
  ids = sharding.split(ids, 0, 8)
  h_l = sharding.auto_to_manual(h, _MESH, [0, -1, -1])
  ids_l = sharding.auto_to_manual(ids, _MESH, [0, -1])
  g_l = h_l.shape[0]
  seg_ids = tf.reshape(ids_l + 8 * tf.range(g_l)[:, None], [-1])
  seg_l = tf.math.unsorted_segment_sum(tf.reshape(h_l, [-1, M]), seg_ids,
                                       8 * g_l)
  per_group = sharding.manual_to_auto(tf.reshape(seg_l, [g_l, 8, M]), _MESH,
                                      [0, -1, -1], [G, 8, M])
  total = tf.math.unsorted_segment_sum(tf.reshape(h, [-1, M]),
                                       tf.reshape(ids, [-1]), 8)
  return tf.reduce_sum(per_group * per_group) + tf.reduce_sum(total * total)


def _Inputs():
  rng = np.random.RandomState(0)
  return NestedMap(x=rng.normal(size=[G, S, M]).astype(np.float32),
                   ids=rng.randint(0, 8, size=[G, S]).astype(np.int32),
                   w=rng.normal(size=[M]).astype(np.float32))


def _Step(inp):
  with tf.GradientTape() as tape:
    tape.watch(inp.w)
    loss = _Loss(inp.x, inp.ids, inp.w)
  return NestedMap(loss=loss,
                   dw=sharding.replicate(tape.gradient(loss, inp.w)))


def _AutoOperandsOfManualOps(serialized):
  """[(manual op, operand)] where a fully manual op reads a non-manual value."""
  module = xla_runtime.ParseHloModule(serialized)
  entry = [c for c in module.computations
           if c.id == module.entry_computation_id][0]
  flags = manual_constants.ManualFlags(entry)
  by_id = {i.id: i for i in entry.instructions}
  return [(i.name, by_id[o].opcode) for i in entry.instructions
          if flags[i.id] and i.custom_call_target != 'SPMDFullToShardShape'
          for o in i.operand_ids if not flags[o]]


def test_rewrite_routes_every_constant_through_full_to_shard():
  tensors = [tf.constant(v) for v in _Inputs().Flatten()]

  def Flat(ids, w, x):
    return _Step(NestedMap(ids=ids, w=w, x=x)).Flatten()

  with sharding.SpmdPartitioning(8):
    hlo = tf.function(Flat, jit_compile=True).experimental_get_compiler_ir(
        *tensors)(stage='hlo_serialized')
  before = _AutoOperandsOfManualOps(hlo)
  assert before and {op for _, op in before} <= {'constant', 'broadcast',
                                                  'iota'}, before
  after = manual_constants.RouteConstantsIntoManualRegions(hlo)
  assert _AutoOperandsOfManualOps(after) == []
  # Idempotent: a second pass finds nothing to route.
  assert manual_constants.RouteConstantsIntoManualRegions(after) == after


def test_shared_zero_constant_does_not_leak_manual_sharding():
  """Without the rewrite XLA aborts compiling this step (CHECK failure)."""
  r = check.CheckFunction(_Step, _Inputs(), 8, name='segment_sums',
                          expect=['has:all-reduce', 'no:all-gather'])
  assert r.ok, r.Report()
  # The replicated weight's gradient is summed over the 8 group shards.
  assert r.output_shardings['dw'] == '{replicated}'
  assert any('f32[3]' in c.shape for c in r.CollectivesOf('all-reduce'))
