"""GShard's sharding annotation API (GShard §3.2, App. A.3) over xla_sharding.

Every function annotates a tensor with how XLA's SPMD partitioner should lay
it out across devices. Annotations are emitted whenever the code is traced
into a graph (tf.function, with or without jit_compile), on every backend:
with XLA they become `custom-call(..., custom_call_target="Sharding")` in the
HLO; without XLA the op is an identity. In eager mode they return the tensor
unchanged, but arguments are validated everywhere so a bad mapping fails on a
laptop, not on a pod.

`use_sharding_op=True` is always used: only the XlaSharding op survives into
HLO for intermediate tensors (an attribute on the producing op is dropped).

Split mappings (`split_dims_mapping`) give, per tensor dim, the mesh axis it
is split over or -1 (replicated along it); a mesh axis may be given by index
or by name when `mesh_axis_names` is passed. None entries mean -1.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.compiler.xla.experimental import xla_sharding

__all__ = [
    'ShardingError', 'replicate', 'split', 'shard', 'mesh_split',
    'auto_to_manual', 'manual_to_auto', 'ValidateDeviceMesh',
    'ResolveSplitDimsMapping',
]


class ShardingError(ValueError):
  """A sharding annotation that cannot be right for the tensor or mesh."""


def _Emit():
  """Annotations are real ops only when tracing a graph."""
  return not tf.executing_eagerly()


def _Rank(t):
  rank = t.shape.rank
  if rank is None:
    raise ShardingError(f'cannot annotate a tensor of unknown rank: {t!r}')
  return rank


def ValidateDeviceMesh(device_mesh):
  """Returns `device_mesh` as an int ndarray; ids must permute 0..N-1."""
  mesh = np.asarray(device_mesh)
  if mesh.ndim == 0 or mesh.size == 0:
    raise ShardingError(f'device mesh must be a non-empty array, got {mesh!r}')
  if not np.issubdtype(mesh.dtype, np.integer):
    raise ShardingError(f'device mesh ids must be integers, got {mesh.dtype}')
  if sorted(mesh.flatten().tolist()) != list(range(mesh.size)):
    raise ShardingError('device ids must be a permutation of 0..'
                        f'{mesh.size - 1}, got {mesh.flatten().tolist()}')
  return mesh.astype(np.int64)


def ResolveSplitDimsMapping(split_dims_mapping, mesh_ndim, rank,
                            mesh_axis_names=None):
  """Mesh axis indices (-1 = replicated) for each tensor dim, validated."""
  mapping = list(split_dims_mapping)
  if len(mapping) != rank:
    raise ShardingError(f'split_dims_mapping {list(split_dims_mapping)} has '
                        f'{len(mapping)} entries but the tensor has rank '
                        f'{rank}')
  out = []
  for axis in mapping:
    if axis is None:
      axis = -1
    elif isinstance(axis, str):
      if not mesh_axis_names or axis not in mesh_axis_names:
        raise ShardingError(f'mesh axis name {axis!r} is not one of '
                            f'{list(mesh_axis_names or [])}')
      axis = list(mesh_axis_names).index(axis)
    elif isinstance(axis, (bool, np.bool_)) or not isinstance(
        axis, (int, np.integer)):
      raise ShardingError(f'mesh axis must be an int, a name or None, got '
                          f'{axis!r}')
    axis = int(axis)
    if axis != -1 and not 0 <= axis < mesh_ndim:
      raise ShardingError(f'mesh axis {axis} is out of range for a '
                          f'{mesh_ndim}-D device mesh')
    if axis != -1 and axis in out:
      raise ShardingError(f'mesh axis {axis} is used twice in '
                          f'{list(split_dims_mapping)}')
    out.append(axis)
  return out


def replicate(t):
  """Every device holds the full tensor."""
  t = tf.convert_to_tensor(t)
  if not _Emit():
    return t
  return xla_sharding.replicate(t, use_sharding_op=True)


def split(t, split_dimension, num_partitions):
  """Splits dim `split_dimension` into `num_partitions` pieces (GShard §3.2).

  Uneven sizes are allowed (e.g. 15 over 2): XLA pads the last shard.
  """
  t = tf.convert_to_tensor(t)
  rank = _Rank(t)
  if not isinstance(split_dimension, (int, np.integer)) or not (
      -rank <= split_dimension < rank):
    raise ShardingError(f'split_dimension {split_dimension} is out of range '
                        f'for rank {rank}')
  if not isinstance(num_partitions, (int, np.integer)) or num_partitions < 1:
    raise ShardingError(f'num_partitions must be >= 1, got {num_partitions}')
  if not _Emit():
    return t
  return xla_sharding.split(t, int(split_dimension) % rank,
                            int(num_partitions), use_sharding_op=True)


def shard(t, device_assignment):
  """Tiles `t` by an ndarray of device ids with the tensor's rank (App A.3).

  `device_assignment[i0, i1, ...]` is the device holding tile (i0, i1, ...).
  """
  t = tf.convert_to_tensor(t)
  assignment = ValidateDeviceMesh(device_assignment)
  rank = _Rank(t)
  if assignment.ndim != rank:
    raise ShardingError(f'device_assignment has rank {assignment.ndim} but '
                        f'the tensor has rank {rank}')
  if not _Emit():
    return t
  return xla_sharding.tile(t, assignment, use_sharding_op=True)


def mesh_split(t, device_mesh, split_dims_mapping, mesh_axis_names=None):
  """Splits `t` over a logical device mesh (GShard §3.2 `mesh_split`).

  Args:
    t: the tensor.
    device_mesh: ndarray of device ids, or None (no annotation: returns t).
    split_dims_mapping: per tensor dim, a mesh axis (index or name) or -1.
      None means "no annotation".
    mesh_axis_names: optional names of the mesh axes.
  """
  t = tf.convert_to_tensor(t)
  if device_mesh is None or split_dims_mapping is None:
    return t
  mesh = ValidateDeviceMesh(device_mesh)
  mapping = ResolveSplitDimsMapping(split_dims_mapping, mesh.ndim, _Rank(t),
                                    mesh_axis_names)
  if not _Emit():
    return t
  return xla_sharding.mesh_split(t, mesh, mapping, use_sharding_op=True)


def _ManualSharding(t, device_mesh, split_dims_mapping, mesh_axis_names):
  mesh = ValidateDeviceMesh(device_mesh)
  mapping = ResolveSplitDimsMapping(split_dims_mapping, mesh.ndim, _Rank(t),
                                    mesh_axis_names)
  return xla_sharding.mesh_split_sharding(mesh, mapping).proto


def auto_to_manual(t, device_mesh, split_dims_mapping, mesh_axis_names=None):
  """Enters manual partitioning (GShard §3.2): returns the per-device shard.

  Inside, ops see the local shard shape (e.g. one group per device) and the
  partitioner leaves them alone; `manual_to_auto` goes back. In eager mode
  (no partitioner) the full tensor is the single device's shard.
  """
  t = tf.convert_to_tensor(t)
  sharding = _ManualSharding(t, device_mesh, split_dims_mapping,
                             mesh_axis_names)
  if not _Emit():
    return t
  t = xla_sharding.mesh_split(
      t, ValidateDeviceMesh(device_mesh),
      ResolveSplitDimsMapping(split_dims_mapping, np.asarray(device_mesh).ndim,
                              _Rank(t), mesh_axis_names),
      use_sharding_op=True)
  return xla_sharding.auto_to_manual_spmd_partition(
      t, sharding.SerializeToString())


def manual_to_auto(t, device_mesh, split_dims_mapping, full_shape,
                   mesh_axis_names=None):
  """Leaves manual partitioning: per-device shards -> one full tensor."""
  t = tf.convert_to_tensor(t)
  sharding = _ManualSharding(t, device_mesh, split_dims_mapping,
                             mesh_axis_names)
  if not _Emit():
    return t
  return xla_sharding.manual_to_auto_spmd_partition(
      t, sharding.SerializeToString(), full_shape=list(full_shape))
