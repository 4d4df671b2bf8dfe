"""One pipeline stage as a function, for the schedules (pipeline.py's
unrolled one, pipeline_loop's while loops).

A stage holds S slots of the stacked weights [K, S, ...]
(pipeline_weights); slot s of stage k runs layer `layer_ids[k, s]`, or
passes its input through where `active[k, s]` is 0 (stages of different
depths). The body runs under `dropout.KeyedMasks(layer id, the
micro-batch's example rows)`, with each row's global first token when the
pipeline was given a token_offset, so dropout and routing draw what the
unpipelined stack draws.
"""

import numpy as np
import tensorflow as tf

from lingshard.layers import dropout
from lingshard.nested_map import NestedMap


def StageConstants(layer, run, stage_mb):
  """The stage function's non-differentiated inputs for stage_mb ([K],
  numpy or a tensor; -1 = bubble, which uses micro-batch 0's rows): layer
  ids [K, S], active [K, S], rows [K, b]."""
  if isinstance(stage_mb, np.ndarray):
    rows = tf.constant(run.rows[np.maximum(stage_mb, 0)])
  else:
    rows = tf.gather(tf.constant(run.rows), tf.maximum(stage_mb, 0))
  return [tf.constant(layer.stack.layer_ids),
          tf.constant(layer.stack.active), rows]


def ValidSlots(layer, stage_mb):
  """float [K, S] (numpy): 1 where stage k's slot s ran a layer on a real
  micro-batch (stage_mb [K], -1 = bubble); the aux of the others is
  dropped (pipeline_aux)."""
  valid = (np.asarray(stage_mb) >= 0).astype(np.float32)
  return valid[:, np.newaxis] * layer.stack.active


def PackAux(run, leaves):
  """Per slot the aux NestedMap of the stage function's aux leaves (their
  structure found by its trace)."""
  aux_list = []
  for tpl in run.aux_tpls:
    n = len(tpl.Flatten())
    aux_list.append(tpl.Pack(list(leaves[:n])))
    leaves = leaves[n:]
  return aux_list


def StageFunctions(layer, run):
  """(one_stage, over_stages): one stage's S slots as a function of
  [theta leaves [S, ...], x, pads, *extras, ids [S], active [S], rows [b]]
  -> [y] + aux leaves, and `over_stages(name, fn, elems)`: fn on every
  stage (vectorised over K, pipeline_run.Run.OverStages)."""
  p = layer.params
  stack = layer.stack
  s, k = stack.slots, p.num_stages
  body, step = layer.body, run.step
  if run.aux_tpls is None:
    run.aux_tpls = [None] * s
  aux_tpls = run.aux_tpls
  num_theta = len(run.theta.Flatten())

  def OneStage(elems):
    leaves, (x, pads, *extras) = elems[:num_theta], elems[num_theta:-3]
    ids_s, active_s, rows_b = elems[-3:]
    kwargs = {}
    if run.token_offset is not None:
      kwargs['token_offset'] = run.token_offset + rows_b * int(
          np.prod(x.shape.as_list()[1:-1]))
    # Unstack, not slice: the gradient of a slice (StridedSliceGrad) inside
    # vectorized_map needs XLA compile-time constants.
    slots = [tf.unstack(w, num=s) for w in leaves]
    flat_aux = []
    for slot in range(s):
      slot_theta = stack.tpl.Pack([w[slot] for w in slots])
      with dropout.KeyedMasks(ids_s[slot], rows_b):
        y, aux = body.FProp(slot_theta, x, pads, *extras, step=step,
                            **kwargs)
      on = tf.cast(active_s[slot], y.dtype)
      x = y * on + x * (1 - on)
      aux = NestedMap(aux) if aux else NestedMap()
      aux_tpls[slot] = aux
      flat_aux += aux.Flatten()
    return [x] + flat_aux

  def OverStages(name, fn, elems):
    return run.OverStages(name, fn, elems, k, p.stage_mesh_axis)

  return OneStage, OverStages
