"""The GPipe schedule as two while loops: forward, and a backward we write.

With re-materialisation (GPipe §2.3) an iteration of the schedule keeps
only its stage inputs, so its gradient is a function of those and of the
cotangents: the whole schedule can be one `tf.custom_gradient` whose
forward and backward are each one `tf.while_loop` over the N = M + K - 1
iterations. The program then holds one forward and one backward iteration
(each vectorised over the K stages), whatever M and K; the unrolled
schedule (pipeline.py) holds N of each. Both read the layer's schedule
(pipeline_schedule.Tables: [N, K] micro-batch and chunk tables indexed by
the iteration tensor; its Shift, whose gradient TF takes: it must be
linear, as a move of data is).

Forward (i is a tensor in the loop):

    E = [Entering(j) for j in range(N + 1)]         # [N + 1, b, ...] a stream
    state = Shift(E[0], bubble, 0)                  # [K, b, ...] a stream
    for i in range(N):
      saved[i] = state                              # all that is kept
      out, aux = Stages(theta, state, mb[i], chunk[i])
      outputs[i] = sum_k(out * last); auxes[i] = aux
      x = outputs[src[i + 1]] if src[i + 1] >= 0 else E[i + 1]  # circular
      state = Shift(x, [out] + state[1:], i + 1)

Backward (state_{i+1} = Shift(E[i + 1], [out_i] + state_i[1:], i + 1)):

    g = 0                                           # d state_{i+1}
    for i in reversed(range(N)):
      dx, (d_out, *d_pass) = ShiftVjp(g, i + 1)
      dE[i + 1] = dx, or d_outputs[src[i + 1]] += dx  # src[i + 1] <= i
      d_out += last * d_outputs[i]
      d_theta_i, d_state = StagesVjp(theta, saved[i], [d_out] + d_auxes[i])
      d_theta += d_theta_i; g = d_state + [0] + d_pass
    dE[0] = ShiftVjp(g, 0)[0]

The stage functions are the unrolled schedule's (pipeline_stages).

TF's own gradient of the forward loop would keep its accumulators in
buffers whose layout the SPMD partitioner chooses (an earlier attempt got
all-gathers of the micro-batch gradient on the real corpus's shapes); here
every buffer is annotated: [N, K, b, ...] with K over the stage axis and b
over the batch axis, [N, b, ...] with b over the batch axis, theta's
gradient as theta. Indexing the iterations dim (never split) is local.
"""

import numpy as np
import tensorflow as tf

from lingshard.layers import pipeline_remat
from lingshard.layers import pipeline_stages


def _Get(buf, i):
  return tf.gather(buf, i)


def _Put(buf, i, t):
  return tf.tensor_scatter_nd_update(buf, tf.reshape(i, [1, 1]),
                                     t[tf.newaxis])


class LoopedSchedule:
  """Runs `layer`'s schedule (`tables`, pipeline_schedule.Tables) on `run`
  as the module docstring's loops (`Outputs()`)."""

  def __init__(self, layer, run, tables):
    self._layer, self._run, self._tables = layer, run, tables
    p = layer.params
    self._k = p.num_stages
    self._n = tables.n
    self._table = tables.mb
    self._shift = layer.schedule.Shift
    self._recirculates = tables.recirculates
    self._one_stage, self._over_stages = pipeline_stages.StageFunctions(
        layer, run)
    self._theta_tpl = run.theta
    self._num_theta = len(run.theta.Flatten())

  # ------------------------------------------------------------- annotate
  def _Shard(self, t, leading):
    return self._layer.AnnotateLeading(t, leading, replicated=True)

  def _ShardIterations(self, t, over_stages):
    """[N, K, b, ...] (over_stages) or [N, b, ...]: the iterations dim is
    annotated unsplit (left free, the partitioner may split it)."""
    p = self._layer.params
    if over_stages:
      return self._Shard(t, [-1, p.stage_mesh_axis, p.batch_mesh_axis])
    return self._Shard(t, [-1, p.batch_mesh_axis])

  def _ShardAux(self, t):
    """[N, K, ...]: an aux leaf per iteration and stage."""
    return self._Shard(t, [-1, self._layer.params.stage_mesh_axis])

  def _ShardTheta(self, leaves):
    return self._layer.ShardTheta(self._theta_tpl.Pack(list(leaves))).Flatten()

  # ------------------------------------------------------------------ run
  def _Consts(self, i):
    return pipeline_stages.StageConstants(
        self._layer, self._run, tf.gather(tf.constant(self._table), i),
        tf.gather(tf.constant(self._tables.chunk), i))

  def _FromOutput(self, i):
    """(bool scalar: x entering in iteration i is an earlier output, the
    output's iteration (clamped to 0))."""
    src = self._tables.enter_src
    return (tf.gather(tf.constant(src >= 0), i),
            tf.gather(tf.constant(np.maximum(src, 0)), i))

  def _Specs(self, elems):
    """The stage function's outputs [K, ...] as (shape, dtype), from the
    forward loop's stage function traced ahead of the loop."""
    return self._run.OverStagesSpecs('forward', self._one_stage, elems,
                                     self._k,
                                     self._layer.params.stage_mesh_axis)

  def Outputs(self):
    """(outputs [M, b, ...], [(per slot aux, valid [K, S])] per iteration),
    as the unrolled schedule collects them."""
    layer, run, n, tables = self._layer, self._run, self._n, self._tables
    # E: per stream the N + 1 micro-batches entering stage 0, [N + 1, b, ...]
    # (zeros where x is an earlier output: the loop selects that).
    zeros = {int(s): run.bubble[0] for s in tables.enter_src if s >= 0}
    entering = [self._ShardIterations(tf.stack(list(ts)), False)
                for ts in zip(*[layer.Entering(run, tables, i, zeros)
                                for i in range(n + 1)])]
    theta = run.theta.Flatten()
    specs = self._Specs(theta + run.BubbleState() + self._Consts(0))
    schedule = self._CustomGradient(specs,
                                    [t.dtype.is_floating for t in entering])
    results = schedule(*(theta + entering))
    outputs, aux_bufs = results[0], results[1:]
    rows = []
    per_leaf = [tf.unstack(t, num=n) for t in aux_bufs]
    for i in range(n):
      rows.append(pipeline_stages.AuxRow(
          layer, pipeline_stages.PackAux(run, [ls[i] for ls in per_leaf]),
          tables.mb[i], tables.chunk[i]))
    first = int(tables.outputs[0])
    if np.array_equal(tables.outputs, np.arange(first, first + run.m)):
      return outputs[first:first + run.m], rows
    return tf.gather(outputs, tables.outputs), rows

  def _Forward(self, theta, entering, specs):
    """The forward loop of the module docstring: (saved states [N, K, b,
    ...] per stream, outputs [N, b, ...], aux leaves [N, K, ...])."""
    layer, run, n = self._layer, self._run, self._n
    state = [self._shift(layer, e[0], b, 0)
             for e, b in zip(entering, run.BubbleState())]
    saved = [self._ShardIterations(tf.zeros([n] + s.shape.as_list(), s.dtype),
                                   True) for s in state]
    outs = self._ShardIterations(
        tf.zeros([n] + state[0].shape.as_list()[1:], state[0].dtype), False)
    auxes = [self._ShardAux(tf.zeros([n] + list(shape), dtype))
             for shape, dtype in specs[1:]]

    def Body(i, state, saved, outs, auxes):
      saved = [self._ShardIterations(_Put(b, i, s), True)
               for b, s in zip(saved, state)]
      res = self._over_stages('forward', self._one_stage,
                              theta + state + self._Consts(i))
      out = layer.ShardState(res[0])
      outs = self._ShardIterations(
          _Put(outs, i, tf.reduce_sum(out * run.last_mask, 0)), False)
      auxes = [self._ShardAux(_Put(b, i, t)) for b, t in zip(auxes, res[1:])]
      ins = [_Get(e, i + 1) for e in entering]
      if self._recirculates:
        from_out, src = self._FromOutput(i + 1)
        ins[0] = tf.where(from_out, _Get(outs, src), ins[0])
      state = [self._shift(layer, e, t, i + 1)
               for e, t in zip(ins, [out] + state[1:])]
      return [i + 1, state, saved, outs, auxes]

    _, _, saved, outs, auxes = tf.while_loop(
        lambda i, *_: i < n, Body, [tf.constant(0), state, saved, outs, auxes],
        maximum_iterations=n, parallel_iterations=1)
    return saved, outs, auxes

  def _CustomGradient(self, specs, floats):
    """The schedule as fn(*theta leaves, *entering) -> [outputs] + aux
    buffers, its gradient the backward loop."""
    nt = self._num_theta

    @tf.custom_gradient
    def Schedule(*args):
      theta, entering = list(args[:nt]), list(args[nt:])
      saved, outs, auxes = self._Forward(theta, entering, specs)

      def Grad(*dys):
        dys = [tf.zeros_like(o) if d is None else d
               for o, d in zip([outs] + auxes, dys)]
        d_theta, d_entering = self._Backward(theta, entering, saved, dys,
                                             floats)
        return d_theta + d_entering

      return [outs] + auxes, Grad

    return Schedule

  def ShiftVjp(self, g, i):
    """Cotangents (entering [b, ...], t [K, b, ...]) of the schedule's
    Shift(entering, t, i) for g [K, b, ...], by TF's gradient of Shift (as the
    unrolled schedule gets them: a masked sum over K, an all-reduce when K
    is split, and the shift back, a collective-permute). Shift is linear,
    so its gradient does not depend on the point: zeros."""
    e = tf.zeros(g.shape[1:], g.dtype)
    t = tf.zeros(g.shape, g.dtype)
    with tf.GradientTape() as tape:
      tape.watch([e, t])
      out = self._shift(self._layer, e, t, i)
    d_e, d_t = tape.gradient(out, [e, t], output_gradients=g)
    return d_e, self._layer.ShardState(d_t)

  def _Backward(self, theta, entering, saved, dys, floats):
    """The backward loop of the module docstring: (d theta leaves, d
    entering per stream, None for streams that are not float)."""
    layer, run, n, nt = self._layer, self._run, self._n, self._num_theta
    d_outs, d_auxes = dys[0], dys[1:]
    # Float streams only (x first, then paddings and float extras): g and
    # the entering cotangents are lists over these.
    diff = [s for s, f in enumerate(floats) if f]
    g0 = [layer.ShardState(tf.zeros(saved[s].shape[1:], saved[s].dtype))
          for s in diff]
    d_ent0 = [self._ShardIterations(tf.zeros_like(entering[s]), False)
              for s in diff]
    d_theta0 = self._ShardTheta([tf.zeros_like(t) for t in theta])

    recirculates = self._recirculates
    if recirculates:  # d_outs gains the recirculated x's cotangents.
      d_outs = self._ShardIterations(d_outs, False)

    def Body(j, g, d_theta, d_ent, *carried):
      d_outs_i = carried[0] if recirculates else d_outs
      i = n - 1 - j
      d_pass = []
      for c, g_s in enumerate(g):
        d_e, d_t = self.ShiftVjp(g_s, i + 1)
        if c == 0 and recirculates:
          # x of iteration i + 1 was output src (<= i): its cotangent
          # goes there, before d_outs[i] is read.
          from_out, src = self._FromOutput(i + 1)
          d_outs_i = self._ShardIterations(tf.tensor_scatter_nd_add(
              d_outs_i, tf.reshape(src, [1, 1]),
              tf.where(from_out, d_e, tf.zeros_like(d_e))[tf.newaxis]),
                                           False)
          d_e = tf.where(from_out, tf.zeros_like(d_e), d_e)
        d_ent[c] = self._ShardIterations(_Put(d_ent[c], i + 1, d_e), False)
        d_pass.append(d_t)
      d_out = d_pass[0] + run.last_mask * _Get(d_outs_i, i)[tf.newaxis]
      state = [layer.ShardState(_Get(b, i)) for b in saved]
      cot = [d_out] + [_Get(b, i) for b in d_auxes]
      grads = pipeline_remat.StagesVjp(
          self._over_stages, self._one_stage,
          theta + state + self._Consts(i), cot)
      d_theta = self._ShardTheta([a + b for a, b in zip(d_theta, grads[:nt])])
      # Stream 0's stage input does not pass on (the stage's output does);
      # the others move to the next stage as they are.
      g = [layer.ShardState(grads[nt + s] + d_pass[c] if s else grads[nt])
           for c, s in enumerate(diff)]
      return [j + 1, g, list(d_theta), d_ent] + (
          [d_outs_i] if recirculates else [])

    _, g, d_theta, d_ent, *_ = tf.while_loop(
        lambda j, *_: j < n, Body,
        [tf.constant(0), g0, d_theta0, d_ent0] + (
            [d_outs] if recirculates else []),
        maximum_iterations=n, parallel_iterations=1)
    d_entering = [None] * len(entering)
    for c, s in enumerate(diff):  # state_0 = Shift(E[0], bubble, 0).
      d_e, _ = self.ShiftVjp(g[c], 0)
      d_entering[s] = self._ShardIterations(_Put(d_ent[c], 0, d_e), False)
    return list(d_theta), d_entering
