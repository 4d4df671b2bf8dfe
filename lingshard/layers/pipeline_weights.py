"""A pipeline's stacked weights: L layers' weights as [K, S, ...] variables.

GPipe §2.2 partitions L consecutive layers into K cells. Here every weight
of the body is one variable `w_<key>` of shape [K, S, ...] (S = the most
layers any stage holds): slot s of stage k holds layer
`sum(splits[:k]) + s` when s < splits[k], else a padded slot whose output
is its input (an [K, S] active mask) and whose (zero-initialised) weights
get zero gradients. Padded slots are real variables: parameter counts
include them. With R chunks per stage (pipeline_schedule.Circular) the
splits are K R chunk sizes, S = R C (C the longest chunk) and slot r C + c
of stage k holds layer c of chunk r K + k: each device keeps its own
chunks' weights, none moves during a step.

Layers of different shapes (`body_tpl` a list of L layer params with one
weight structure, e.g. FFN hidden dims or head counts that differ): every
layer runs as the widest one (a listed layer with the largest shape of
every weight) on its weights zero-padded to that shape. Zero-padded hidden
units and heads contribute nothing and get zero gradients (activations
with f(0) = 0: ReLU, GELU, Swish), so each layer computes exactly its own
function; the cost is the widest layer's FLOPs in every slot.

Layer l is initialised from seeds of (random_seed, `<path>/layer_<l>/
<weight>`), independently per layer, whatever K is. `StackedWeights` holds
this bookkeeping; the pipeline layer applies it through BaseLayer's public
weight hooks (`PackOwnWeights`, `InitialWeightValue`).
"""

import numpy as np
import tensorflow as tf

from lingshard.layers import base_layer


class StackError(ValueError):
  """Body layers that cannot be stacked (one line)."""


def FlatName(key):
  """The variable name of body weight `key` (e.g. 'ffn.fc_in.w')."""
  return 'w_' + key.replace('.', '__').replace('[', '_').replace(']', '')


def WidestBody(name, tpls, declare):
  """(index into `distinct`, distinct tpls, their declared weights, the
  widest shape per key) of L body params `tpls`.

  `declare(tpl)` returns a layer params' DeclaredWeights (NestedMap of
  WeightParams). Raises StackError when the layers differ in weight keys
  or ranks, or no listed layer is the widest in every weight.
  """
  distinct = []  # Each distinct layer params once (a copied body: one).
  for tpl in tpls:
    if not any(tpl is t for t in distinct):
      distinct.append(tpl)
  declared = [declare(tpl) for tpl in distinct]
  keys = [k for k, _ in declared[0].FlattenItems()]
  shapes = {}
  for dw in declared:
    items = dw.FlattenItems()
    if [k for k, _ in items] != keys or any(
        len(wp.shape) != len(shapes.get(k, wp.shape)) for k, wp in items):
      raise StackError(f'{name}: the body_tpl layers differ in their '
                       'weights or weight ranks; a pipeline stacks one '
                       'weight structure')
    for k, wp in items:
      shapes[k] = [max(a, b) for a, b in zip(shapes.get(k, wp.shape),
                                             wp.shape)]
  for i, dw in enumerate(declared):
    if all(list(wp.shape) == shapes[k] for k, wp in dw.FlattenItems()):
      return i, distinct, declared, shapes
  raise StackError(f'{name}: no body_tpl layer has the largest shape of '
                   'every weight; list one that does')


def LayerCosts(layer_wps):
  """Per layer: matmul FLOPs per token, 2 x its weights (count_params)."""
  return [2.0 * sum(float(np.prod(wp.shape)) for wp in wps.values())
          for wps in layer_wps]


class StackedWeights:
  """Which layer each [K, S] slot holds, and each layer's own weights.

  Args:
    splits: K R layer counts per chunk (R = 1: per stage).
    body_declared: the executed (widest) body's DeclaredWeights.
    layer_wps: L dicts {weight key: the layer's own WeightParams}.
    repeats: R chunks per stage.
  """

  def __init__(self, splits, body_declared, layer_wps, repeats=1):
    self.splits = list(splits)
    self.tpl = body_declared
    self.layer_wps = layer_wps
    self.repeats = repeats
    self.num_stages = k = len(self.splits) // repeats
    self.chunk_slots = c = max(self.splits)
    self.layer_ids = np.zeros([k, repeats * c], np.int64)
    self.active = np.zeros([k, repeats * c], np.float32)
    start = 0
    for chunk, n in enumerate(self.splits):
      stage, first = chunk % k, (chunk // k) * c
      self.layer_ids[stage, first:first + n] = np.arange(start, start + n)
      self.active[stage, first:first + n] = 1.0
      start += n
    # (stage, slot) of each layer, in layer order.
    self.positions = sorted(
        zip(*np.nonzero(self.active)),
        key=lambda ks: self.layer_ids[ks[0], ks[1]])
    # (variable name, body weight key, body WeightParams) in theta order.
    self.flat_keys = [(FlatName(key), key, wp)
                      for key, wp in body_declared.FlattenItems()]
    self._key_of = {flat: (key, wp) for flat, key, wp in self.flat_keys}

  @property
  def slots(self):
    """S: slots per stage (R C)."""
    return self.repeats * self.chunk_slots

  def Declare(self, layer, stage_mesh_axis):
    """Declares the [K, S, ...] variables on `layer` (in its __init__)."""
    k, s = self.num_stages, self.slots
    stage_axis = -1 if stage_mesh_axis is None else stage_mesh_axis
    for flat, _, wp in self.flat_keys:
      mapping = wp.tensor_split_dims_mapping
      if mapping is None:
        mapping = [-1] * len(wp.shape)
      layer.CreateVariable(flat, base_layer.WeightParams(
          [k, s] + list(wp.shape), init=wp.init, dtype=wp.dtype,
          tensor_split_dims_mapping=[stage_axis, -1] + list(mapping),
          trainable=wp.trainable, count_update_rate=wp.count_update_rate,
          update_rule=wp.update_rule))

  def Pack(self, own):
    """{variable name: leaf} -> the body's theta structure."""
    return self.tpl.Pack([own[flat] for flat, _, _ in self.flat_keys])

  def InitialValue(self, layer, flat, wp):
    """The [K, S, ...] initial value of variable `flat`: each active slot
    initialised as its own layer (zero-padded to the widest shape),
    padded slots zero."""
    key, body_wp = self._key_of[flat]
    rows = []
    for stage in range(self.num_stages):
      for slot in range(self.slots):
        if self.active[stage, slot]:
          index = self.layer_ids[stage, slot]
          own = self.layer_wps[index][key]  # Its own shape and init.
          path = f'{layer.path}/layer_{index:03d}/{key}'
          value = base_layer.InitialValue(own, layer.WeightSeed(path, own))
          # A narrower layer's weight, zero-padded to the widest shape.
          rows.append(tf.pad(value, [[0, w - o] for w, o in
                                     zip(body_wp.shape, own.shape)]))
        else:
          rows.append(tf.zeros(body_wp.shape, body_wp.dtype))
    return tf.reshape(tf.stack(rows), wp.shape)

  def LayerThetas(self, theta):
    """L per-layer thetas (the body's structure), in stack order."""
    return [theta.Transform(lambda w, a=int(stage), b=int(slot): w[a, b])
            for stage, slot in self.positions]
