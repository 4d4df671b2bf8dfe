"""One pipeline FProp's state, how micro-batches are laid out, and how the
schedule's iterations run (`Run.Iterate`: traced one by one, or all but
the first as one tf.while_loop whose buffers and queue are annotated).

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


class PipelineError(ValueError):
  """A pipeline configuration that cannot run (one line)."""


def NumMicroBatches(p, batch, d):
  """M for a batch of `batch` examples over `d` data shards (the pipeline's
  params `p` set num_micro_batches or micro_batch_size)."""
  if p.num_micro_batches is not None:
    if batch % p.num_micro_batches:
      raise PipelineError(f'{p.name}: num_micro_batches '
                          f'{p.num_micro_batches} does not divide the batch '
                          f'{batch}; use a divisor of {batch}')
    m = p.num_micro_batches
  else:
    if batch % p.micro_batch_size:
      raise PipelineError(f'{p.name}: micro_batch_size '
                          f'{p.micro_batch_size} does not divide the batch '
                          f'{batch}; use a divisor of {batch}')
    m = batch // p.micro_batch_size
  if (batch // m) % d:
    raise PipelineError(f'{p.name}: micro-batches of {batch // m} '
                        f'examples do not split over the {d} data shards '
                        f'of batch_mesh_axis {p.batch_mesh_axis}; use a '
                        f'batch divisible by {m * d}')
  return m


def MicroBatchRows(batch, m, d):
  """int64 [M, b]: the mini-batch row of each row of each micro-batch."""
  return np.arange(batch, dtype=np.int64).reshape(
      d, m, batch // (m * d)).transpose(1, 0, 2).reshape(m, batch // m)


def SwapFirstTwo(t):
  """[a, b, ...] -> [b, a, ...]."""
  return tf.transpose(t, [1, 0] + list(range(2, t.shape.rank)))


class Run:
  """One FProp's schedule state, shared by the pipeline's hooks: theta, the
  M micro-batches of every per-example stream and their mini-batch rows,
  the bubble's micro-batch, the collected outputs and aux rows, and the
  ordering token (pipeline_remat).

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
    # The micro-batches still to enter stage 0, [b, M, ...] per stream
    # (b over the batch axis; M second, so that no layout of the [K, b,
    # ...] stage state is taken for it; Entering).
    self.queue = [layer.ShardBatch(SwapFirstTwo(self._Block(t, m)))
                  for t in streams]
    # A bubble stage's micro-batch: zeros, paddings (stream 1) ones.
    self.bubble = [tf.zeros_like(t[:, 0]) for t in self.queue]
    self.bubble[1] = tf.ones_like(self.bubble[1])
    k = layer.params.num_stages
    last = np.zeros([k] + [1] * streams[0].shape.rank, np.float32)
    last[-1] = 1.0
    self.last_mask = tf.constant(last, streams[0].dtype)
    self.token = tf.zeros([], streams[0].dtype)
    # The (output, aux list) of the iterations traced one by one (0, or
    # all without the loop), then the loop's buffers: the outputs, then
    # one per aux leaf (StartLoop).
    self._traced, self.accumulators = [], None
    self.schedule = None
    # RunStages' vectorised stage functions (traced once per FProp) and
    # the aux structure per slot their trace found.
    self.vectorised, self.aux_tpls = {}, None

  # ------------------------------------------------------------- schedule
  def Schedule(self, schedule):
    """Sets the schedule: int [N, K], each iteration's micro-batch per
    stage (-1 = bubble)."""
    self.schedule = np.asarray(schedule, np.int64)

  def StageMicroBatches(self, i):
    """[K] micro-batches of iteration i: numpy for an int i, a tensor for
    the loop's tensor i."""
    if isinstance(i, int):
      return self.schedule[i]
    return tf.gather(tf.constant(self.schedule), i)

  def Entering(self, i):
    """The tensors entering stage 0 in iteration i: the head of the queue
    of micro-batches (fill-drain: micro-batch i, from M on the bubble's),
    which then moves up one.

    A queue carried through the loop, not a gather or a masked sum of the
    micro-batches by i: the gradient of those, summed over the loop's
    iterations, gets a layout of the partitioner's choosing (then
    all-gathers); the queue's stays the annotated one.
    """
    del i  # Fill-drain pops in order; another schedule may use it.
    out, queue = [], []
    for t, bubble in zip(self.queue, self.bubble):
      out.append(t[:, 0])
      queue.append(self._layer.ShardBatch(
          tf.concat([t[:, 1:], bubble[:, tf.newaxis]], 1)))
    self.queue = queue
    return out

  def Iterate(self, iteration, state, n, loop):
    """state = iteration(i, state) for i in 0 ... n - 1: iteration 0 traced
    on its own (it fixes the aux structure and the shapes of the loop's
    buffers), the others as one tf.while_loop (`loop`) or each traced.

    Without remat the pipeline does not loop: TF's gradient of a while
    loop takes the shapes some gradients need (e.g. Tile's) from loop
    accumulators, which XLA cannot compile; remat's gradient recomputes
    inside the loop.
    """
    state = iteration(0, state)
    if not loop:
      for i in range(1, n):
        state = iteration(i, state)
      return
    if n == 1:
      return
    self.StartLoop(n)

    def Body(i, token, accumulators, queue, *state):
      self.token, self.accumulators, self.queue = token, accumulators, queue
      state = iteration(i, list(state))
      return [i + 1, self.token, self.accumulators, self.queue] + state

    loop_vars = tf.while_loop(
        lambda i, *_: i < n, Body,
        [tf.constant(1), self.token, self.accumulators, self.queue] + state,
        maximum_iterations=n - 1)
    self.accumulators = loop_vars[2]

  def Accumulate(self, i, out, aux_list):
    """Keeps iteration i's collected output and per slot aux."""
    leaves = [t for aux in aux_list for t in aux.Flatten()]
    if self.accumulators is None:
      self._traced.append((out, aux_list))
      return
    # A scatter into an annotated buffer, not a TensorArray: the
    # partitioner would pick the layout of a TensorArray's buffer itself
    # (e.g. the iterations split over the devices, then all-gathered).
    index = tf.reshape(tf.cast(i, tf.int32) - 1, [1, 1])
    self.accumulators = [
        self._layer.ShardAccumulated(
            tf.tensor_scatter_nd_update(buf, index, t[tf.newaxis]), j > 0)
        for j, (buf, t) in enumerate(zip(self.accumulators, [out] + leaves))]

  def StartLoop(self, n):
    """Buffers [N - 1, ...] for iterations 1 ... N - 1 of iteration 0's
    values (the output, then the aux leaves)."""
    out, aux_list = self._traced[0]
    firsts = [out] + [t for aux in aux_list for t in aux.Flatten()]
    self.accumulators = [
        self._layer.ShardAccumulated(
            tf.zeros([n - 1] + t.shape.as_list(), t.dtype), j > 0)
        for j, t in enumerate(firsts)]

  def Collected(self, skip):
    """(outputs [M, b, ...] of iterations skip ..., [(aux list, [K]
    micro-batches)] of every iteration)."""
    outs = [out for out, _ in self._traced]
    rows = [(aux_list, self.schedule[j])
            for j, (_, aux_list) in enumerate(self._traced)]
    aux_list = self._traced[0][1]
    if self.accumulators is not None:
      stacked = self.accumulators
      n = int(self.schedule.shape[0])
      outs += tf.unstack(stacked[0], num=n - 1)
      per_leaf = [tf.unstack(t, num=n - 1) for t in stacked[1:]]
      for j in range(n - 1):
        leaves, packed = [ls[j] for ls in per_leaf], []
        for aux in aux_list:
          width = len(aux.Flatten())
          packed.append(aux.Pack(leaves[:width]))
          leaves = leaves[width:]
        rows.append((packed, self.schedule[j + 1]))
    return tf.stack(outs[skip:]), rows

  def _Block(self, t, m):
    """[B, ...] -> [M, b, ...]: [D, M, b/D, ...] transposed (no data moves
    with B split over the data axis)."""
    d, rest = self._d, t.shape.as_list()[1:]
    t = self._layer.ShardBatch(tf.reshape(t, [d, m, -1] + rest))
    return tf.reshape(SwapFirstTwo(t), [m, -1] + rest)

  def Unblock(self, t_mb):
    """[M, b, ...] -> [B, ...], the inverse of _Block."""
    d, rest = self._d, t_mb.shape.as_list()[2:]
    t = tf.reshape(t_mb, [self.m, d, -1] + rest)
    t = self._layer.ShardBatch(SwapFirstTwo(t))
    return tf.reshape(t, [-1] + rest)

  def OverStages(self, name, fn, elems, k, stage_mesh_axis):
    """fn on every stage: vectorised over K (K = 1: one direct call).

    The vectorised function is traced (and converted by pfor) once per
    FProp and called by every iteration: every iteration runs the same
    stage code on same-shaped inputs (pfor conversion of the body
    otherwise dominates a pipelined model's tracing time). The body's
    annotations gain the stage dim (sharding.VectorizedOver)."""
    if k == 1:
      return [t[tf.newaxis] for t in fn([t[0] for t in elems])]
    if name not in self.vectorised:
      def Vectorised(*ts):
        with sharding.VectorizedOver(stage_mesh_axis):
          return tf.vectorized_map(fn, list(ts))

      # Nested in the step's trace: xla_compiled=True keeps the outer
      # program's choice (sharding.Function).
      self.vectorised[name] = sharding.Function(Vectorised,
                                                xla_compiled=True)
    return self.vectorised[name](*elems)
