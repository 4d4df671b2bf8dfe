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

`CheckValues(model_params)` (run first by Validate, and by the trainer in
every mode before anything else) checks values that need no mesh: sizes
>= 1, MoE layer indices, float dtypes, the input's buckets, batch sizes
and sampling temperature, checkpoints kept. `CheckHostMemory(task)` (the
trainer, before it allocates on this host) refuses weights that cannot
fit in this host's memory.
"""

import math
import os

import numpy as np
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.layers import micro_batches
from lingshard.layers import pipeline
from lingshard.layers import pipeline_cells


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


def _Fits(check, *args):
  """Runs a layer's fit hook (base_layer: CheckMeshFit, CheckTokensFit);
  its one-line ValueError becomes a ConfigCheckError."""
  try:
    check(*args)
  except ConfigCheckError:
    raise
  except ValueError as e:
    raise ConfigCheckError(str(e)) from None


def Validate(model_params, num_replicas=1, num_input_pipelines=1, spmd=True):
  """Checks `model_params` (a SingleTaskModel's); returns the task (built
  without variables). Raises ConfigCheckError (module docstring).

  `spmd`: each replica spans the device mesh (TPUStrategy, spmd_check), so
  a replica's batch must also split over the mesh (check 2). False for
  strategies whose replicas are single devices (mirrored, multi_worker,
  default), where the annotations are not partitioned.
  """
  CheckValues(model_params)
  try:
    task = model_params.task.Instantiate()
  except ValueError as e:  # A layer's own check of its params (one line).
    raise ConfigCheckError(str(e).splitlines()[0]) from None
  layers = list(task.AllLayers())
  pipes = [x for x in layers if isinstance(
      x, (pipeline.PipelinedLayer, pipeline_cells.CellPipelinedLayer))]
  # Every layer and the data shards of its micro-batch (pipeline bodies:
  # the pipeline's; else 1), for the layers' own fit checks.
  sharded = [(x, 1) for x in layers]
  for pipe in pipes:
    if isinstance(pipe, pipeline.PipelinedLayer):
      sharded += [(x, pipe.DataShards()) for x in pipe.body.AllLayers()]
  for layer, _ in sharded:
    _Fits(layer.CheckMeshFit,
          lambda axis, x=layer: _AxisSize(x, axis))
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
    for layer, shards in sharded:
      if shards > 1:
        _Fits(layer.CheckTokensFit, tokens // shards,
              f'one of {shards} data shards of {where}')
      else:
        _Fits(layer.CheckTokensFit, tokens, where)
  return task


def StageShapeLines(task):
  """Each shape-changing pipeline's stages and boundary shapes
  (pipeline_cells.CellPipelinedLayer.StageShapes), '<path>: stage k: ...'
  lines (print_params, count_params); [] without one."""
  return [f'{layer.path}: {line}' for layer in task.AllLayers()
          if isinstance(layer, pipeline_cells.CellPipelinedLayer)
          for line in layer.StageShapes()]


# ------------------------------------------- values (no mesh, no replicas)
# Sizes that are >= 1 wherever they are set (templates included; other
# sizes such as a template's input_dim = 0 are filled in by its parent).
_POSITIVE = ('model_dim', 'num_experts', 'num_heads', 'dim_per_head',
             'src_vocab_size', 'tgt_vocab_size', 'vocab_size',
             'num_encoder_layers', 'num_decoder_layers', 'num_groups',
             'group_size', 'num_stages', 'num_micro_batches',
             'micro_batch_size')
# ... and at the task's root only.
_POSITIVE_AT_ROOT = ('hidden_dim',)
_FLOAT_DTYPES = ('dtype', 'fprop_dtype', 'expert_dtype')


def _IsInt(value):
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _Key(prefix, name):
  return f'{prefix}.{name}' if prefix else name


def _CheckMoELayers(node, prefix, name):
  """`<x>_moe_layers` (or `moe_layers`): None or indices into the
  `num_<x>_layers` (`num_layers`) layers of its stack."""
  value = node.Get(name)
  if value is None:
    return
  count_name = 'num_' + name[:-len('moe_layers')] + 'layers'
  key = _Key(prefix, name)
  if (not isinstance(value, (list, tuple)) or
      not all(_IsInt(i) for i in value)):
    raise ConfigCheckError(f'{key}={value!r}: must be None or a list of '
                           'layer indices, e.g. [1, 3]')
  count = node.Get(count_name) if count_name in node else None
  if _IsInt(count) and count > 0:
    bad = [int(i) for i in value if not 0 <= i < count]
    if bad:
      raise ConfigCheckError(
          f'{key}={list(value)}: layer index {bad[0]} is out of range; '
          f'{_Key(prefix, count_name)}={count} (indices 0..{count - 1})')


def _CheckTaskValues(task_params):
  for prefix, node in task_params.IterParams('task.'):
    for name, value in node:
      key = _Key(prefix, name)
      if value is not None and (name in _POSITIVE or (
          prefix == 'task' and name in _POSITIVE_AT_ROOT)):
        if not _IsInt(value) or value < 1:
          raise ConfigCheckError(f'{key}={value!r}: must be an integer >= 1')
      elif name in _FLOAT_DTYPES and value is not None and not (
          isinstance(value, tf.DType) and value.is_floating):
        raise ConfigCheckError(
            f'{key}={value!r}: must be a floating-point dtype (tf.float32, '
            'tf.bfloat16, tf.float16 or tf.float64)')
      elif name.endswith('moe_layers'):
        _CheckMoELayers(node, prefix, name)
  train = task_params.train if 'train' in task_params else None
  if train is not None and 'max_checkpoints_to_keep' in train:
    keep = train.max_checkpoints_to_keep
    if keep is not None and (not _IsInt(keep) or keep < 1):
      raise ConfigCheckError(
          f'task.train.max_checkpoints_to_keep={keep!r}: must be >= 1 (the '
          'latest checkpoint is the one training resumes from)')


def _CheckInputValues(input_params):
  p = input_params
  if p is None:
    return
  if 'bucket_upper_bounds' in p:
    bounds = p.bucket_upper_bounds
    if (not isinstance(bounds, (list, tuple)) or not bounds or
        not all(_IsInt(b) for b in bounds) or bounds[0] < 2 or
        list(bounds) != sorted(set(bounds))):
      raise ConfigCheckError(
          f'input.bucket_upper_bounds={bounds!r}: must be a non-empty '
          'ascending list of sequence lengths >= 2')
    if 'bucket_batch_limits' in p:
      limits = p.bucket_batch_limits
      if (not isinstance(limits, (list, tuple)) or
          len(limits) != len(bounds)):
        raise ConfigCheckError(
            f'input.bucket_batch_limits={limits!r}: must list one batch size '
            f'per bucket of input.bucket_upper_bounds={list(bounds)}')
      bad = [b for b in limits if not _IsInt(b) or b < 1]
      if bad:
        raise ConfigCheckError(
            f'input.bucket_batch_limits={list(limits)}: every batch size must '
            f'be an integer >= 1, got {bad[0]!r}')
  for name in ('batch_size', 'eval_batch_size'):
    value = p.Get(name) if name in p else None
    if value is not None and (not _IsInt(value) or value < 1):
      raise ConfigCheckError(f'input.{name}={value!r}: must be an integer '
                             '>= 1')
  temperature = p.temperature if 'temperature' in p else None
  if temperature is not None and (
      not isinstance(temperature, (int, float)) or isinstance(
          temperature, bool) or not 0 < temperature < math.inf):
    raise ConfigCheckError(
        f'input.temperature={temperature!r}: must be > 0 (1 samples '
        'languages by their share of the data; None samples uniformly)')


def CheckValues(model_params):
  """ConfigCheckError (one line naming the param, its value and the rule)
  for a value no mesh or job can make valid; needs no layer built."""
  _CheckTaskValues(model_params.task)
  _CheckInputValues(model_params.input)


# ----------------------------------------------------------- host memory
def HostMemoryBytes():
  """This host's available memory (MemAvailable, else physical memory);
  None if unknown."""
  try:
    with open('/proc/meminfo', encoding='ascii') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None


def DeclaredWeightBytes(task):
  """(values, bytes) of every weight `task` (built without variables)
  declares: one copy, no optimizer slots."""
  values = total = 0
  for layer in task.AllLayers():
    for wp in layer.weight_params.values():
      n = math.prod(int(d) for d in wp.shape)
      dtype = tf.as_dtype(wp.dtype or layer.params.dtype or tf.float32)
      values += n
      total += n * dtype.size
  return values, total


def _Bytes(n):
  """Binary units, one decimal: '65.0 TB'."""
  if n < 1024:
    return f'{n} bytes'
  for unit in ('KB', 'MB', 'GB', 'TB'):
    n /= 1024
    if n < 1024 or unit == 'TB':
      return f'{n:.1f} {unit}'
  return ''


def CheckHostMemory(task, available_bytes=None):
  """ConfigCheckError when one copy of the task's weights alone exceeds
  this host's available memory (`available_bytes`, default
  HostMemoryBytes()): allocating them would only end in an out-of-memory
  kill. Slots and activations are not counted: this refuses the obvious."""
  available = HostMemoryBytes() if available_bytes is None else (
      available_bytes)
  if available is None:
    return
  values, total = DeclaredWeightBytes(task)
  if total > available:
    raise ConfigCheckError(
        f"the model's weights take {_Bytes(total)} ({values:,} values) but "
        f'this host has {_Bytes(available)} of memory available; choose '
        'smaller sizes (e.g. task.model_dim) or a TPU slice (--strategy=tpu)')
