"""Re-materialisation: recompute a function's forward in the backward pass.

GShard §5.1: the 36- and 60-layer models fit a TPU core only because the
compiler recomputes activations in the backward pass (28% / 34% of the
cycles); GPipe §2.3 does the same per pipeline stage. `Recompute(fn, elems,
consts)` runs `fn` as one `tf.custom_gradient` function that keeps only its
inputs (and outputs): its gradient recomputes `fn` under a GradientTape and
differentiates that copy. TransformerStack's `remat='layer'` wraps each
layer in it, so only layer boundaries stay alive between the forward and
the backward pass; pipeline_remat builds a pipeline iteration's remat from
the same two XLA pieces below.

Randomness is keyed, not stateful (dropout masks and MoE routing draw from
(seed, step, layer, token) counters), so the recomputed forward draws what
the forward drew: remat changes memory, never numerics.

XLA pieces: an optimization barrier ties the recomputation's inputs to the
incoming cotangents, so XLA neither merges it into the forward pass (CSE)
nor schedules it before the backward pass needs it; XLA:CPU drops barriers
before CSE, so a zero computed from the cotangent (`OpaqueZero`) is added
to the activations the recomputation starts from (`TieToCotangent`), a data
dependency that no pass can remove.
"""

import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla


def OpaqueZero(t):
  """A float32 zero computed from `t` that XLA cannot fold to a constant
  (min(|sum t|, 0); x * 0 could be simplified away): a data dependency."""
  return tf.minimum(tf.abs(tf.reduce_sum(tf.cast(t, tf.float32))), 0.0)


def OptimizationBarrier(tensors):
  """XLA optimization barrier: the recomputation is not merged into the
  forward pass (which would keep its activations)."""
  return list(xla.optimization_barrier(*tensors))


def TieToCotangent(ins, dys, tie):
  """`ins` and `dys` behind one barrier; the float inputs at indices `tie`
  get a zero made from the first float cotangent (module docstring).

  Tie the activations the recomputation starts from: every part of it that
  reads none of them could still be merged with the forward pass."""
  both = OptimizationBarrier(list(ins) + list(dys))
  ins, dys = both[:len(ins)], both[len(ins):]
  first_dy = next((d for d in dys if d.dtype.is_floating), None)
  if first_dy is not None:
    zero = OpaqueZero(first_dy)
    for i in tie:
      if ins[i].dtype.is_floating:
        ins[i] = ins[i] + tf.cast(zero, ins[i].dtype)
  return ins, dys


def Recompute(fn, elems, consts=(), activations=None):
  """`fn(elems + consts)` (a list of tensors), recomputed in backprop.

  Args:
    fn: fn(list of tensors) -> list of tensors; pure (keyed randomness).
    elems: the inputs gradients flow to (float tensors; others get None).
    consts: inputs with no gradient (e.g. the int step), appended after
      `elems`. Everything `fn` reads must be in `elems` or `consts`: a
      tensor it captures would get no gradient.
    activations: indices into `elems` of the activations fn starts from
      (e.g. a layer's input), tied to the cotangent (TieToCotangent);
      None = every float input (weights too: a copy of each per call).

  Returns:
    fn's outputs (a list).
  """
  elems = [tf.convert_to_tensor(e) for e in elems]
  consts = [tf.convert_to_tensor(c) for c in consts]
  n = len(elems)
  tie = range(n) if activations is None else list(activations)

  @tf.custom_gradient
  def Forward(*args):
    outs = fn(list(args) + consts)

    def Grad(*dys):
      dys = [tf.zeros_like(o) if d is None else d for o, d in zip(outs, dys)]
      ins, dys = TieToCotangent(list(args) + consts, dys, tie)
      floats = [i for i in range(n) if ins[i].dtype.is_floating]
      out_floats = [j for j, o in enumerate(outs) if o.dtype.is_floating]
      with tf.GradientTape() as tape:
        tape.watch([ins[i] for i in floats])
        again = fn(ins)
      grads = tape.gradient([again[j] for j in out_floats],
                            [ins[i] for i in floats],
                            output_gradients=[dys[j] for j in out_floats],
                            unconnected_gradients='zero')
      result = [None] * n
      for i, g in zip(floats, grads):
        result[i] = g
      return result

    return outs, Grad

  return list(Forward(*elems))
