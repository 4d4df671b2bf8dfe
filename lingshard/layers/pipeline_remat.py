"""Re-materialisation of a pipeline iteration's stages (GPipe §2.3).

`RematStages(run_stages, stages_vjp, elems, consts, token, num_theta)` runs
every stage of one iteration as one `tf.custom_gradient` function: only its
inputs (theta leaves and the stage-boundary states) are kept, and its
gradient recomputes each stage's forward and differentiates it per stage
(`stages_vjp`), behind an XLA optimization barrier so XLA does not merge the
recomputation into the forward pass.

`token` is a zero scalar computed from the previous iteration's output.
Its gradient is made from this iteration's recomputed gradients, so
backprop runs the iterations one after another: each recomputation starts
only once the later iteration's is done, and at most one iteration's
activations are alive (with K = 1 nothing else orders them: every
micro-batch's cotangent is ready at once).

The barrier and the opaque zero that keep the recomputation distinct
from the forward pass and after it are remat.py's.
"""

import tensorflow as tf

from lingshard.layers import remat


def RematStages(run_stages, stages_vjp, elems, consts, token, num_theta):
  """The stages' outputs, recomputed in backprop.

  Args:
    run_stages: fn(list of tensors) -> list of outputs (every stage).
    stages_vjp: fn(inputs, output cotangents) -> per input its gradient
      (None for non-float inputs), recomputing the forward.
    elems: differentiable inputs: theta leaves, then the states.
    consts: non-differentiable inputs appended after elems.
    token: the ordering zero (see the module docstring).
    num_theta: how many of `elems` are theta leaves (the first state
      follows them and carries the cotangent dependency).
  """

  @tf.custom_gradient
  def Stages(*args_and_token):
    args, token_in = list(args_and_token[:-1]), args_and_token[-1]
    outs = run_stages(args + consts)

    def Grad(*dys):
      dys = [tf.zeros_like(o) if d is None else d
             for o, d in zip(outs, dys)] + [token_in]
      # The barrier ties the recomputation's inputs to the incoming
      # cotangents: XLA can neither merge it into the forward pass nor
      # schedule it before this iteration's backward pass is due (which
      # would keep every iteration's activations alive again).
      # The first state is what the recomputation starts from.
      ins, dys = remat.TieToCotangent(args + consts, dys, [num_theta])
      dys = dys[:-1]  # The token went behind the barrier too.
      grads = stages_vjp(ins, dys)[:len(args)]
      d_token = remat.OpaqueZero(grads[0])  # Orders the iterations.
      return grads + [tf.cast(d_token, token_in.dtype)]

    return outs, Grad

  return Stages(*elems, token)


def StagesVjp(over_stages, one_stage, elems, dys):
  """Per stage: recompute `one_stage`'s forward and pull the cotangents
  `dys` back to every float input (None for the others), vectorised over
  the stages by `over_stages(name, fn, elems)`."""

  def One(both):
    ins, outs_dy = both[:len(elems)], both[len(elems):]
    floats = [i for i, t in enumerate(ins) if t.dtype.is_floating]
    with tf.GradientTape() as tape:
      tape.watch([ins[i] for i in floats])
      outs = one_stage(ins)
    grads = tape.gradient(outs, [ins[i] for i in floats],
                          output_gradients=list(outs_dy),
                          unconnected_gradients='zero')
    out = [tf.zeros([], tf.float32)] * len(ins)
    for i, g in zip(floats, grads):
      out[i] = g
    return out

  got = over_stages('vjp', One, list(elems) + list(dys))
  floats = [t.dtype.is_floating for t in elems]
  return [g if f else None for g, f in zip(got, floats)]
