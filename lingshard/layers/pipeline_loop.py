"""The GPipe schedule as two while loops: forward, and a backward we write.

With re-materialisation (GPipe §2.3) an iteration of the schedule keeps
only its stage inputs, so its gradient is a function of those and of the
cotangents: the whole schedule can be one `tf.custom_gradient` whose
forward and backward are each one `tf.while_loop` over the N = M + K - 1
iterations. The program then holds one forward and one backward iteration
(each vectorised over the K stages), whatever M and K; the unrolled
schedule (pipeline.py) holds N of each.

Forward (the hooks are PipelinedLayer's; i is a tensor in the loop):

    E = [Entering(j) for j in range(N + 1)]         # [N + 1, b, ...] a stream
    state = Shift(E[0], bubble)                     # [K, b, ...] a stream
    for i in range(N):
      saved[i] = state                              # all that is kept
      out, aux = Stages(theta, state, table[i])     # table [N, K]: schedule
      outputs[i] = sum_k(out * last); auxes[i] = aux
      state = Shift(E[i + 1], [out] + state[1:])

Backward (state_{i+1} = Shift(E[i + 1], [out_i] + state_i[1:])):

    g = 0                                           # d state_{i+1}
    for i in reversed(range(N)):
      dE[i + 1], (d_out, *d_pass) = ShiftVjp(g)
      d_out += last * d_outputs[i]
      d_theta_i, d_state = StagesVjp(theta, saved[i], [d_out] + d_auxes[i])
      d_theta += d_theta_i; g = d_state + [0] + d_pass
    dE[0] = ShiftVjp(g)[0]

The loop uses the layer's NumIterations, StageMicroBatches, Entering and
Shift hooks (Shift's gradient by TF: it must be linear, as a move of data
is); RunStages and Collect are the unrolled schedule's.

TF's own gradient of the forward loop would keep its accumulators in
buffers whose layout the SPMD partitioner chooses (an earlier attempt got
all-gathers of the micro-batch gradient on the real corpus's shapes); here
every buffer is annotated: [N, K, b, ...] with K over the stage axis and b
over the batch axis, [N, b, ...] with b over the batch axis, theta's
gradient as theta. Indexing the iterations dim (never split) is local.
"""

import numpy as np
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import pipeline_remat
from lingshard.layers import pipeline_stages


def _Get(buf, i):
  return tf.gather(buf, i)


def _Put(buf, i, t):
  return tf.tensor_scatter_nd_update(buf, tf.reshape(i, [1, 1]),
                                     t[tf.newaxis])


class LoopedSchedule:
  """Runs `layer`'s fill-drain schedule on `run` as the module docstring's
  loops (`Outputs()`)."""

  def __init__(self, layer, run):
    self._layer, self._run = layer, run
    p = layer.params
    self._k = p.num_stages
    self._n = layer.NumIterations(run.m, self._k)
    self._table = np.stack([layer.StageMicroBatches(i, run.m, self._k)
                            for i in range(self._n)])
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
        self._layer, self._run, tf.gather(tf.constant(self._table), i))

  def _Specs(self, elems):
    """The stage function's outputs [K, ...] as (shape, dtype), from one
    stage traced in a graph of its own (nothing joins the program)."""
    k = self._k

    def Trace(*ts):
      return self._one_stage(list(ts))

    fn = sharding.Function(Trace, xla_compiled=True)
    graph = fn.get_concrete_function(
        *[tf.TensorSpec(t.shape[1:], t.dtype) for t in elems]).graph
    return [([k] + t.shape.as_list(), t.dtype) for t in graph.outputs]

  def Outputs(self):
    """(outputs [M, b, ...], [(per slot aux, valid [K, S])] per iteration),
    as the unrolled schedule collects them."""
    layer, run, n, k = self._layer, self._run, self._n, self._k
    # E: per stream the N + 1 micro-batches entering stage 0, [N + 1, b, ...].
    entering = [self._ShardIterations(tf.stack(list(ts)), False)
                for ts in zip(*[layer.Entering(run, i) for i in range(n + 1)])]
    theta = run.theta.Flatten()
    specs = self._Specs(theta + run.BubbleState() + self._Consts(0))
    schedule = self._CustomGradient(specs,
                                    [t.dtype.is_floating for t in entering])
    results = schedule(*(theta + entering))
    outputs, aux_bufs = results[0], results[1:]
    rows = []
    per_leaf = [tf.unstack(t, num=n) for t in aux_bufs]
    for i in range(n):
      rows.append((pipeline_stages.PackAux(run, [ls[i] for ls in per_leaf]),
                   pipeline_stages.ValidSlots(layer, self._table[i])))
    return outputs[k - 1:], rows

  def _Forward(self, theta, entering, specs):
    """The forward loop of the module docstring: (saved states [N, K, b,
    ...] per stream, outputs [N, b, ...], aux leaves [N, K, ...])."""
    layer, run, n = self._layer, self._run, self._n
    state = [layer.Shift(e[0], b)
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
      state = [layer.Shift(_Get(e, i + 1), t)
               for e, t in zip(entering, [out] + state[1:])]
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

  def ShiftVjp(self, g):
    """Cotangents (entering [b, ...], t [K, b, ...]) of the layer's
    Shift(entering, t) for g [K, b, ...], by TF's gradient of Shift (as the
    unrolled schedule gets them: a masked sum over K, an all-reduce when K
    is split, and the shift back, a collective-permute). Shift is linear,
    so its gradient does not depend on the point: zeros."""
    e = tf.zeros(g.shape[1:], g.dtype)
    t = tf.zeros(g.shape, g.dtype)
    with tf.GradientTape() as tape:
      tape.watch([e, t])
      out = self._layer.Shift(e, t)
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

    def Body(j, g, d_theta, d_ent):
      i = n - 1 - j
      d_pass = []
      for c, g_s in enumerate(g):
        d_e, d_t = self.ShiftVjp(g_s)
        d_ent[c] = self._ShardIterations(_Put(d_ent[c], i + 1, d_e), False)
        d_pass.append(d_t)
      d_out = d_pass[0] + run.last_mask * _Get(d_outs, i)[tf.newaxis]
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
      return [j + 1, g, list(d_theta), d_ent]

    _, g, d_theta, d_ent = tf.while_loop(
        lambda j, *_: j < n, Body, [tf.constant(0), g0, d_theta0, d_ent0],
        maximum_iterations=n, parallel_iterations=1)
    d_entering = [None] * len(entering)
    for c, s in enumerate(diff):  # state_0 = Shift(E[0], bubble).
      d_e, _ = self.ShiftVjp(g[c])
      d_entering[s] = self._ShardIterations(_Put(d_ent[c], 0, d_e), False)
    return list(d_theta), d_entering
