"""Validate: every shape constraint of a model on its mesh, at params time.

`Validate(model_params, num_replicas=1, num_input_pipelines=1)` builds the
task's layer tree (no variables: nothing is allocated, so the paper-scale
configs check in well under a second) and raises `ConfigCheckError` with
one line naming the parameter, its value and the constraint at the first
of these that fails:

1. the global batch of every training bucket (`input.bucket_batch_limits[i]`
   or `input.batch_size`) vs the replicas and input hosts of the job: each
   replica takes an equal share (strategies.DistributeBatch);
2. when a replica spans the mesh (`spmd`: TPUStrategy, spmd_check), its
   batch vs the mesh axis its batch dim is split over (every layer's
   activation mapping of a `b...` tensor; XLA would pad uneven shards)
   and, with a GPipe layer, vs `num_micro_batches` x that axis (each
   micro-batch is split over it);
3. every MoE layer (also in a pipeline's body): `num_groups` (or
   `group_size`) vs the tokens of a replica's (micro-)batch, B x T (GShard
   §2.2: G equal groups of S; in a pipeline, the tokens of a micro-batch
   per data shard, whose groups are then the unpipelined model's), and
   `num_groups` vs the mesh axis (or axes) its groups are split over;
   `num_experts` vs the mesh axis its experts are split over (inside each
   stage for a pipeline's body);
4. every declared weight: each split dim (heads, experts, hidden) divisible
   by the size of its mesh axis.

The trainer runs it before any mode (and again with the strategy's replica
and host counts before training), as do `count_params` and `spmd_check`;
`--mode=print_params` prints the params only when they pass.
"""

import numpy as np

from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.layers import micro_batches
from lingshard.layers import pipeline
from lingshard.layers.moe import base as moe_base


class ConfigCheckError(ValueError):
  """A model whose shapes do not fit its mesh, batch or job (one line)."""


def _AxisSize(layer, axis):
  """(size, label) of mesh axis `axis` (int, name, None or a tuple of
  them: the product of their sizes) of a layer."""
  p = layer.params
  names = p.mesh_axis_names
  try:
    size = sharding.AxisSize(p.device_mesh, axis, names)
  except sharding.ShardingError as e:
    raise ConfigCheckError(f'{layer.path}: {e}') from None
  if isinstance(axis, tuple):
    labels = [_AxisSize(layer, a)[1] for a in axis]
    return size, f'mesh axes {" x ".join(labels)} = {size}'
  index = sharding.ResolveSplitDimsMapping(
      [axis], np.asarray(p.device_mesh).ndim, 1, names)[0]
  if index == -1:
    return 1, 'replicated'
  label = f"'{names[index]}'" if names else str(index)
  return size, f'mesh axis {label} of size {size}'


def _TrainShapes(input_params):
  """[(param label, global batch B, length T or None)] of a training
  input: one per bucket of bucketed inputs, else its batch_size."""
  if input_params is None or (
      'is_inference' in input_params and input_params.is_inference):
    return []  # Eval inputs batch by eval_batch_size; not checked.
  if 'bucket_batch_limits' in input_params:
    bounds = list(input_params.bucket_upper_bounds)
    return [(f'input.bucket_batch_limits[{i}]', int(b), int(bounds[i]))
            for i, b in enumerate(input_params.bucket_batch_limits)]
  if 'batch_size' in input_params:
    return [('input.batch_size', int(input_params.batch_size), None)]
  return []


def _BatchAxis(layers):
  """(size, label) of the mesh axis batch dims are split over (1: none)."""
  for layer in layers:
    if layer.params.device_mesh is None:
      continue
    amap = layer.params.activation_split_dims_mapping
    for key, mapping in sorted(amap):
      if key.startswith('b') and mapping and mapping[0] not in (None, -1):
        axis = mapping[0]
        if axis == base_layer.BATCH:
          axis = layer.params.batch_axes
        return _AxisSize(layer, axis)
  return 1, 'no mesh axis'


def _CheckWeights(layers):
  for layer in layers:
    for name, wp in sorted(layer.weight_params.items()):
      mapping, mesh = wp.tensor_split_dims_mapping, wp.device_mesh
      if mapping is None or mesh is None:
        continue
      shape = [int(d) for d in wp.shape]
      for dim, (size, axis) in enumerate(zip(shape, mapping)):
        n, label = _AxisSize(layer, axis)
        if size % n:
          raise ConfigCheckError(
              f'{layer.path}/{name} {shape}: dim {dim} = {size} must be '
              f'divisible by {label} (the weight is split over it)')


def _CheckMoE(layer, tokens, where):
  """One MoE layer vs the `tokens` of a replica's (micro-)batch."""
  p = layer.params
  if p.num_groups is not None and tokens % p.num_groups:
    raise ConfigCheckError(
        f'{layer.path}: num_groups={p.num_groups} must divide the {tokens} '
        f'tokens of {where} (GShard §2.2: G equal groups)')
  if p.group_size is not None and tokens % p.group_size:
    raise ConfigCheckError(
        f'{layer.path}: group_size={p.group_size} must divide the {tokens} '
        f'tokens of {where}')


def _CheckMoEMesh(layer):
  p = layer.params
  if p.device_mesh is None:
    return
  gsm = p.activation_split_dims_mapping.gsm
  if p.num_groups is not None and gsm and gsm[0] not in (None, -1):
    n, label = _AxisSize(layer, gsm[0])
    if p.num_groups % n:
      raise ConfigCheckError(
          f'{layer.path}: num_groups={p.num_groups} must be a multiple of '
          f'{label} (groups are split over it)')
  wi = p.weight_split_dims_mapping.wi
  if wi and wi[0] not in (None, -1):
    n, label = _AxisSize(layer, wi[0])
    if p.num_experts % n:
      raise ConfigCheckError(
          f'{layer.path}: num_experts={p.num_experts} must be divisible by '
          f'{label} (experts are split over it)')


def Validate(model_params, num_replicas=1, num_input_pipelines=1, spmd=True):
  """Checks `model_params` (a SingleTaskModel's); returns the task (built
  without variables). Raises ConfigCheckError (module docstring).

  `spmd`: each replica spans the device mesh (TPUStrategy, spmd_check), so
  a replica's batch must also split over the mesh (check 2). False for
  strategies whose replicas are single devices (mirrored, multi_worker,
  default), where the annotations are not partitioned.
  """
  task = model_params.task.Instantiate()
  layers = list(task.AllLayers())
  pipes = [x for x in layers if isinstance(x, pipeline.PipelinedLayer)]
  # MoE layers and the data shards of their micro-batch (pipeline bodies:
  # the pipeline's; else 1).
  moes = [(x, 1) for x in layers if isinstance(x, moe_base.MoEBase)]
  for pipe in pipes:
    moes += [(x, pipe.DataShards()) for x in pipe.body.AllLayers()
             if isinstance(x, moe_base.MoEBase)]
  for layer, _ in moes:
    _CheckMoEMesh(layer)
  _CheckWeights(layers)
  batch_axis, axis_label = _BatchAxis(layers)
  for label, batch, length in _TrainShapes(model_params.input):
    if batch % num_replicas or num_replicas % num_input_pipelines:
      raise ConfigCheckError(
          f'{label}={batch} (the global batch) must be divisible by the '
          f'{num_replicas} replicas of {num_input_pipelines} input host(s)')
    per_replica = batch // num_replicas
    what = (f'{label}={batch}' if num_replicas == 1 else
            f'{label}={batch} / {num_replicas} replicas = {per_replica}')
    micro = 1
    for pipe in pipes:
      try:
        micro = micro_batches.NumMicroBatches(
            pipe.params, per_replica, error=ConfigCheckError, name=pipe.path)
      except ConfigCheckError as e:
        raise ConfigCheckError(f'{what}: {e}') from None
      need = micro * batch_axis if spmd else micro
      if per_replica % need:
        split = (f' x {axis_label} = {need} (each micro-batch is split over '
                 'it)') if spmd else ''
        raise ConfigCheckError(
            f'{what} must be divisible by {pipe.path}: num_micro_batches='
            f'{micro}{split}')
    if spmd and not pipes and per_replica % batch_axis:
      raise ConfigCheckError(f'{what} must be divisible by {axis_label} '
                             '(the batch is split over it)')
    if length is None:
      continue
    tokens = per_replica // micro * length
    where = (f'a replica\'s batch ({what} x input.bucket_upper_bounds'
             f'{label[len("input.bucket_batch_limits"):]}={length})')
    if micro > 1:
      where = f'a micro-batch ({micro} per batch) of {where}'
    for layer, shards in moes:
      if shards > 1:
        _CheckMoE(layer, tokens // shards,
                  f'one of {shards} data shards of {where}')
      else:
        _CheckMoE(layer, tokens, where)
  return task
