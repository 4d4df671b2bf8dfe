"""One pipeline stage as a function, for the schedules (pipeline.py's
unrolled one, pipeline_loop's while loops).

A stage holds S = R C slots of the stacked weights [K, S, ...]
(pipeline_weights) and runs, in an iteration, the C slots of one chunk
(R = 1: all S): slot c runs layer `ids[k, c]`, or passes its input through
where `active[k, c]` is 0 (chunks of different depths). With R > 1 the
chunk's weights are a one-hot sum over the R chunks (`select [K, R]`, the
schedule's chunk of each stage): exact, local to the stage's device, and
its gradient reaches only that chunk. The body runs under `dropout.KeyedMasks(layer id, the
micro-batch's example rows)`, with each row's global first token when the
pipeline was given a token_offset, so dropout and routing draw what the
unpipelined stack draws.
"""

import numpy as np
import tensorflow as tf

from lingshard.layers import dropout
from lingshard.nested_map import NestedMap


def _ByChunk(table, repeats):
  """[K, R C] -> [K, R, C]."""
  return table.reshape(table.shape[0], repeats, -1)


def ChunkLayers(layer, stage_chunk):
  """(layer ids [K, C], active [K, C]) (numpy) of each stage's chunk."""
  stack = layer.stack
  k, r = stack.num_stages, stack.repeats
  pick = (np.arange(k), np.asarray(stage_chunk))
  return (_ByChunk(stack.layer_ids, r)[pick],
          _ByChunk(stack.active, r)[pick])


def StageConstants(layer, run, stage_mb, stage_chunk):
  """The stage function's non-differentiated inputs for stage_mb and
  stage_chunk ([K], numpy or tensors; mb -1 = bubble, which uses
  micro-batch 0's rows): layer ids [K, C], active [K, C], rows [K, b],
  and with R > 1 select [K, R] (one-hot of the chunk)."""
  stack = layer.stack
  if isinstance(stage_mb, np.ndarray):
    rows = tf.constant(run.rows[np.maximum(stage_mb, 0)])
  else:
    rows = tf.gather(tf.constant(run.rows), tf.maximum(stage_mb, 0))
  if stack.repeats == 1:
    return [tf.constant(stack.layer_ids), tf.constant(stack.active), rows]
  if isinstance(stage_chunk, np.ndarray):
    ids, active = [tf.constant(t) for t in ChunkLayers(layer, stage_chunk)]
  else:
    ids, active = [
        tf.gather(tf.constant(_ByChunk(t, stack.repeats)), stage_chunk,
                  batch_dims=1) for t in (stack.layer_ids, stack.active)]
  select = tf.one_hot(stage_chunk, stack.repeats, dtype=tf.float32)
  return [ids, active, rows, select]


def AuxRow(layer, aux_list, stage_mb, stage_chunk):
  """(per slot aux, valid [K, C], layer ids [K, C]) of one iteration:
  valid is 1 where stage k's slot c ran a layer on a real micro-batch
  (stage_mb [K], -1 = bubble); the aux of the others is dropped
  (pipeline_aux.PerLayer)."""
  ids, active = ChunkLayers(layer, stage_chunk)
  valid = (np.asarray(stage_mb) >= 0).astype(np.float32)
  return aux_list, valid[:, np.newaxis] * active, ids


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
  """(one_stage, over_stages): one stage's chunk of C slots as a function
  of [theta leaves [S, ...], x, pads, *extras, ids [C], active [C], rows
  [b], (select [R] when R > 1)] -> [y] + aux leaves, and
  `over_stages(name, fn, elems)`: fn on every stage (vectorised over K,
  pipeline_run.PipelineRun.OverStages)."""
  p = layer.params
  stack = layer.stack
  s, k, r, c = stack.slots, p.num_stages, stack.repeats, stack.chunk_slots
  num_consts = 3 if r == 1 else 4
  body, step = layer.body, run.step
  if run.aux_tpls is None:
    run.aux_tpls = [None] * c
  aux_tpls = run.aux_tpls
  num_theta = len(run.theta.Flatten())

  def OneStage(elems):
    leaves = elems[:num_theta]
    x, pads, *extras = elems[num_theta:-num_consts]
    ids_s, active_s, rows_b = elems[-num_consts:][:3]
    kwargs = {}
    if run.token_offset is not None:
      kwargs['token_offset'] = run.token_offset + rows_b * int(
          np.prod(x.shape.as_list()[1:-1]))
    # Unstack, not slice: the gradient of a slice (StridedSliceGrad) inside
    # vectorized_map needs XLA compile-time constants.
    slots = [tf.unstack(w, num=s) for w in leaves]
    if r > 1:
      select = tf.unstack(elems[-1], num=r)
      slots = [[tf.add_n([tf.cast(select[j], w[j * c + i].dtype) *
                          w[j * c + i] for j in range(r)])
                for i in range(c)] for w in slots]
    flat_aux = []
    for slot in range(c):
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
