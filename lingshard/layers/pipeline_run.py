"""One pipeline FProp's state, and how micro-batches are laid out.

Micro-batches are blocked within data shards (`MicroBatchRows`): with the
batch split D ways over a data mesh axis (`batch_mesh_axis`; D = 1
without), shard d holds rows [d B/D, (d+1) B/D) and micro-batch i is its
i-th block of b/D consecutive rows on every shard (a reshape to [D, M,
b/D] and a transpose): forming micro-batches moves no data, and a
micro-batch's tokens on a shard are consecutive tokens of the mini-batch,
so an MoE body's groups of S tokens (S dividing the b/D * T tokens) are
the unpipelined model's groups (GShard §2.2 groups; routing, capacity and
the aux loss then match the unpipelined model exactly).
"""

import numpy as np
import tensorflow as tf

from lingshard import sharding


def MicroBatchRows(batch, m, d):
  """int64 [M, b]: the mini-batch row of each row of each micro-batch."""
  return np.arange(batch, dtype=np.int64).reshape(
      d, m, batch // (m * d)).transpose(1, 0, 2).reshape(m, batch // m)


def SwapFirstTwo(t):
  """[a, b, ...] -> [b, a, ...]."""
  return tf.transpose(t, [1, 0] + list(range(2, t.shape.rank)))


def Block(t, m, d, shard):
  """[B, ...] -> [M, b, ...]: [D, M, b/D, ...] transposed (no data moves
  with B split over the data axis; `shard` annotates that [D, ...])."""
  rest = t.shape.as_list()[1:]
  t = shard(tf.reshape(t, [d, m, -1] + rest))
  return tf.reshape(SwapFirstTwo(t), [m, -1] + rest)


def Unblock(t_mb, m, d, shard):
  """[M, b, ...] -> [B, ...], the inverse of Block."""
  rest = t_mb.shape.as_list()[2:]
  t = shard(SwapFirstTwo(tf.reshape(t_mb, [m, d, -1] + rest)))
  return tf.reshape(t, [-1] + rest)


class PipelineRun:
  """One FProp's inputs to the schedule's steps: theta, the M
  micro-batches of every per-example stream and their mini-batch rows, the
  bubble's micro-batch and the first ordering token (pipeline_remat); the
  steps return what they compute (only the traced stage functions are
  cached here).

  Args:
    layer: the PipelinedLayer (DataShards, ShardBatch, its params).
    theta: its (annotated) stacked weights.
    streams: [inputs, paddings, *extras], each [B, ...].
    m: M micro-batches.
    step: the step (dropout and routing keys) or None.
    token_offset: the batch's first global token, or None (not passed to
      the body).
  """

  def __init__(self, layer, theta, streams, m, step, token_offset):
    batch = int(streams[0].shape[0])
    self.theta, self.m, self.step = theta, m, step
    self.token_offset = (None if token_offset is None else
                         tf.cast(token_offset, tf.int64))
    self._layer = layer
    self._d = layer.DataShards()
    self.rows = MicroBatchRows(batch, m, self._d)  # [M, b]
    # Unstack, not slices: the gradient of a slice inside vectorized_map
    # needs XLA compile-time constants (pipeline.RunStages).
    self.micro = [tf.unstack(Block(t, m, self._d, layer.ShardBatch), num=m)
                  for t in streams]
    # A bubble stage's micro-batch: zeros, paddings (stream 1) ones.
    self.bubble = [tf.zeros_like(t[0]) for t in self.micro]
    self.bubble[1] = tf.ones_like(self.bubble[1])
    k = layer.params.num_stages
    last = np.zeros([k] + [1] * streams[0].shape.rank, np.float32)
    last[-1] = 1.0
    self.last_mask = tf.constant(last, streams[0].dtype)
    self.token = tf.zeros([], streams[0].dtype)
    # RunStages' vectorised stage functions (traced once per FProp) and
    # the aux structure per slot their trace found.
    self.vectorised, self.aux_tpls = {}, None

  def BubbleState(self):
    """Per stream [K, b, ...]: every stage on the bubble's micro-batch (the
    state before the first Shift)."""
    k = self._layer.params.num_stages
    return [tf.broadcast_to(b[tf.newaxis], [k] + b.shape.as_list())
            for b in self.bubble]

  def Unblock(self, t_mb):
    """[M, b, ...] -> [B, ...], the inverse of the micro-batches' Block."""
    return Unblock(t_mb, self.m, self._d, self._layer.ShardBatch)

  def OverStages(self, name, fn, elems, k, stage_mesh_axis):
    """fn on every stage: vectorised over K (K = 1: one direct call).

    The vectorised function is traced (and converted by pfor) once per
    FProp and called by every iteration: every iteration runs the same
    stage code on same-shaped inputs (pfor conversion of the body
    otherwise dominates a pipelined model's tracing time). The body's
    annotations gain the stage dim (sharding.VectorizedOver)."""
    if k == 1:
      return [t[tf.newaxis] for t in fn([t[0] for t in elems])]
    return self._Vectorised(name, fn, stage_mesh_axis)(*elems)

  def OverStagesSpecs(self, name, fn, elems, k, stage_mesh_axis):
    """[(shape, dtype)] of `OverStages(name, fn, elems, ...)`'s outputs,
    traced in a graph of their own (nothing joins the program). K > 1: the
    vectorised function's trace, which OverStages then reuses (one trace
    and pfor conversion of the stage, not a second trace for the shapes)."""
    if k == 1:
      def Trace(*ts):
        return fn(list(ts))

      graph = sharding.Function(Trace, xla_compiled=True).get_concrete_function(
          *[tf.TensorSpec(t.shape[1:], t.dtype) for t in elems]).graph
      return [([1] + t.shape.as_list(), t.dtype) for t in graph.outputs]
    graph = self._Vectorised(name, fn, stage_mesh_axis).get_concrete_function(
        *[tf.TensorSpec(t.shape, t.dtype) for t in elems]).graph
    return [(t.shape.as_list(), t.dtype) for t in graph.outputs]

  def _Vectorised(self, name, fn, stage_mesh_axis):
    if name not in self.vectorised:
      def Vectorised(*ts):
        with sharding.VectorizedOver(stage_mesh_axis):
          return tf.vectorized_map(fn, list(ts))

      # Nested in the step's trace: xla_compiled=True keeps the outer
      # program's choice (sharding.Function).
      self.vectorised[name] = sharding.Function(Vectorised,
                                                xla_compiled=True)
    return self.vectorised[name]
