"""`LayerTask`: any layer as a task, so the checker can run its train step.

The loss is linear in the layer's outputs: loss = sum_i <out_i, cot_i> over
the float output leaves, with fixed random cotangents `cot_i` fed as batch
tensors. Every weight then gets a non-trivial gradient through exactly the
outputs a model would differentiate; outputs that a model only reports
(metrics) can be excluded from the gradient with `grad_outputs` (they still
count in the loss value, so their forward values are checked).

Output leaves are named like NestedMap.FlattenItems of `out=<FProp return>`:
`out` for a single tensor, `out[0]`, `out[1].aux_loss`, ... for
`(outputs, NestedMap(aux_loss=...))`.
"""

import tensorflow as tf

from lingshard import sharding
from lingshard.models import base_model
from lingshard.nested_map import NestedMap


def ToNestedMaps(structure):
  """The same nest with dicts turned into NestedMaps (for FlattenItems)."""
  if isinstance(structure, dict):
    return NestedMap({k: ToNestedMaps(v) for k, v in structure.items()})
  if isinstance(structure, (list, tuple)):
    return type(structure)(ToNestedMaps(v) for v in structure)
  return structure


def FloatOutputs(structure):
  """[(name, tensor)] of the float tensors of a layer's FProp return."""
  items = NestedMap(out=ToNestedMaps(structure)).FlattenItems()
  return [(k, v) for k, v in items
          if isinstance(v, (tf.Tensor, tf.Variable)) and v.dtype.is_floating]


class LayerTask(base_model.BaseTask):
  """Wraps a layer: batch = NestedMap(inputs=[...], cotangents=[...])."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('layer', None, 'Params of the layer under test.')
    p.Define('input_split_dims_mapping', None,
             'Optional list, per FProp input, of a split mapping (or None).')
    p.Define('grad_outputs', None,
             'Names of the float outputs the loss differentiates (e.g. '
             "['out[0]', 'out[1].aux_loss']); None = all.")
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('layer', self.params.layer)

  def ComputePredictions(self, theta, input_batch, **kwargs):
    p = self.params
    args = list(input_batch.inputs)
    mappings = p.input_split_dims_mapping or [None] * len(args)
    if len(mappings) != len(args):
      raise ValueError(f'input_split_dims_mapping has {len(mappings)} '
                       f'entries for {len(args)} inputs')
    args = [sharding.mesh_split(a, p.device_mesh, m, p.mesh_axis_names)
            for a, m in zip(args, mappings)]
    return NestedMap(out=self.layer.FProp(theta.layer, *args, **kwargs))

  def ComputeLoss(self, theta, predictions, input_batch):
    """loss = sum <out_i, cot_i>; per_example = every output (checked)."""
    named = FloatOutputs(predictions.out)
    if len(named) != len(input_batch.cotangents):
      raise ValueError(f'the layer returned {len(named)} float tensors, '
                       f'expected {len(input_batch.cotangents)}')
    wanted = self.params.grad_outputs
    if wanted is not None:
      unknown = sorted(set(wanted) - {k for k, _ in named})
      if unknown:
        raise ValueError(f'grad_outputs {unknown} are not float outputs of '
                         f'the layer: {[k for k, _ in named]}')
    terms = []
    for (key, t), cot in zip(named, input_batch.cotangents):
      if wanted is not None and key not in wanted:
        t = tf.stop_gradient(t)
      terms.append(tf.reduce_sum(tf.cast(t, tf.float32) * cot))
    loss = tf.add_n(terms)
    per_example = NestedMap(out=ToNestedMaps(predictions.out))
    return NestedMap(loss=(loss, tf.constant(1.0))), per_example
