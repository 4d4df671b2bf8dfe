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
or by name when `mesh_axis_names` is passed. None entries mean -1. In
`mesh_split` an entry may also be a tuple of mesh axes: the dim is split
over all of them, the first major (e.g. MoE groups over `('data',
'expert')` of a data x expert mesh: GShard §3.2 splits groups over every
device).

Inside `tf.vectorized_map` (a pipeline's stages, run vectorised over a
leading stage dim K), the traced function sees per-stage tensors but the
program holds [K, ...] ones; `VectorizedOver(mesh_axis)` makes `mesh_split`
annotate the [K, ...] tensor (the stage dim over `mesh_axis`), which is
what pfor's XlaSharding converter carries into the vectorised program.

Every `tf.function` in lingshard is built by `Function(fn, xla_compiled)`,
which says whether XLA compiles the program: a graph TensorFlow executes op
by op (xla_compiled=False, not on TPU) is traced `Unannotated()`, where an
annotation would only cost time; the trainer, evaluator, decoder, export,
SPMD checker and smoke tool all build their programs with it.

Manual partitioning (`auto_to_manual` ... `manual_to_auto`, GShard §3.2)
changes shapes, so it can only be emitted into a program that the SPMD
partitioner will see. Code that builds such a program (the SPMD checker, a
TPU step) traces it inside `SpmdPartitioning(num_partitions)`; everywhere
else (single-device runs, eager) the two calls are identities and the
manual region sees the whole tensor as the one device's shard. Code inside
a manual region must therefore take shapes from its (local) inputs.
"""

import contextlib
import contextvars
import functools

import numpy as np
import tensorflow as tf
from tensorflow.python.compiler.xla.experimental import xla_sharding

__all__ = [
    'ShardingError', 'replicate', 'split', 'shard', 'mesh_split',
    'auto_to_manual', 'manual_to_auto', 'SpmdPartitioning',
    'PartitionCount', 'Unannotated', 'ForProgram', 'Function', 'AxisSize',
    'MergedMeshAxis',
    'ValidateDeviceMesh', 'ResolveSplitDimsMapping', 'VectorizedOver',
]

# Number of partitions of the program being traced, or None (single device).
_PARTITIONS = contextvars.ContextVar('lingshard_spmd_partitions',
                                     default=None)
# True inside Unannotated(): annotations are identities.
_UNANNOTATED = contextvars.ContextVar('lingshard_unannotated', default=False)
# Inside VectorizedOver(axis): the mesh axis (or -1) of the leading dim that
# tf.vectorized_map adds to every traced tensor; None outside.
_VECTORIZED = contextvars.ContextVar('lingshard_vectorized', default=None)


class ShardingError(ValueError):
  """A sharding annotation that cannot be right for the tensor or mesh."""


@contextlib.contextmanager
def SpmdPartitioning(num_partitions):
  """Traces code for an SPMD program of `num_partitions` devices.

  Inside, `auto_to_manual` / `manual_to_auto` emit the shape-changing XLA
  custom calls, and every annotation must use exactly `num_partitions`
  devices (XLA rejects a tile assignment of another size).
  """
  if not isinstance(num_partitions, (int, np.integer)) or num_partitions < 1:
    raise ShardingError(f'num_partitions must be >= 1, got {num_partitions}')
  token = _PARTITIONS.set(int(num_partitions))
  try:
    yield
  finally:
    _PARTITIONS.reset(token)


@contextlib.contextmanager
def Unannotated():
  """Traces code without annotations (every call returns its input).

  For a single-device program compiled by an XLA that would reject another
  program's tile assignments (the SPMD checker's reference run).
  """
  token = _UNANNOTATED.set(True)
  try:
    yield
  finally:
    _UNANNOTATED.reset(token)


@contextlib.contextmanager
def VectorizedOver(mesh_axis):
  """Traces the function of a `tf.vectorized_map` over a leading dim that
  is split over `mesh_axis` (index, name or None = replicated).

  Inside, `mesh_split(t, mesh, mapping)` of a per-iteration tensor `t`
  annotates the vectorised tensor [K] + t.shape by [mesh_axis] + mapping:
  pfor's converter copies an XlaSharding op's sharding unchanged onto the
  stacked tensor, so the annotation must already have its rank. (The
  unvectorised trace of the body, which would carry the rank mismatch, is
  dead code XLA prunes.) Manual partitioning cannot be vectorised
  (auto_to_manual raises).
  """
  token = _VECTORIZED.set(-1 if mesh_axis is None else mesh_axis)
  try:
    yield
  finally:
    _VECTORIZED.reset(token)


def ForProgram(xla_compiled):
  """Context for tracing a program: annotated if XLA will compile it.

  A graph TensorFlow executes op by op (no jit_compile, not on TPU) never
  meets the partitioner, and each XlaSharding op in it runs as an on-demand
  XLA program of its own (measured in scripts/bench_step.py's graph-mode
  profile: 220 per m4.TinyMoE train step, ~8 ms of its 69 ms); such graphs
  are traced Unannotated(). Programs XLA compiles keep every annotation.
  The caller knows which (the train loop: platform.Program.xla_compiled,
  true for a TPU replica function too).
  """
  if xla_compiled:
    return contextlib.nullcontext()
  return Unannotated()


def Function(fn=None, *, xla_compiled, **tf_function_kwargs):
  """`tf.function(fn, **tf_function_kwargs)` traced under
  `ForProgram(xla_compiled)`: the one way lingshard builds a tf.function.

  `xla_compiled` says whether XLA will compile the program (jit_compile,
  a TPU replica function, an exported HLO); it does not set jit_compile,
  which stays a tf.function argument. The context is entered at trace
  time (every trace, including `get_concrete_function`), so it holds
  whoever calls the function. A function nested in another's trace keeps
  the outer program's choice (ForProgram(True) adds nothing). Usable as a
  decorator, also of methods: `@sharding.Function(xla_compiled=False,
  input_signature=[...])`.

  Autograph is off unless asked for (`autograph=True`): step code is plain
  TF (Lingvo style), so a configuration error surfaces as itself, not
  wrapped in autograph's StagingError, and tracing skips autograph's
  source conversion (measured: it was ~40% of an m4.TinyMoE eval run).
  """
  if fn is None:
    return functools.partial(Function, xla_compiled=xla_compiled,
                             **tf_function_kwargs)

  @functools.wraps(fn)
  def Traced(*args, **kwargs):
    with ForProgram(xla_compiled):
      return fn(*args, **kwargs)

  tf_function_kwargs.setdefault('autograph', False)
  return tf.function(Traced, **tf_function_kwargs)


def PartitionCount():
  """Partitions of the program being traced (None outside SpmdPartitioning)."""
  return _PARTITIONS.get()


def _Emit():
  """Annotations are real ops only when tracing a graph."""
  return not tf.executing_eagerly() and not _UNANNOTATED.get()


def _EmitManual():
  return _Emit() and _PARTITIONS.get() is not None


def _CheckDeviceCount(num_devices):
  n = _PARTITIONS.get()
  if n is not None and num_devices != n:
    raise ShardingError(f'the annotation uses {num_devices} devices but the '
                        f'program is partitioned for {n}')


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


def _MeshAxis(axis, mesh_ndim, mesh_axis_names):
  """One mesh axis (index or name; None = -1) as an int in [-1, ndim)."""
  if axis is None:
    return -1
  if isinstance(axis, str):
    if not mesh_axis_names or axis not in mesh_axis_names:
      raise ShardingError(f'mesh axis name {axis!r} is not one of '
                          f'{list(mesh_axis_names or [])}')
    return list(mesh_axis_names).index(axis)
  if isinstance(axis, (bool, np.bool_)) or not isinstance(
      axis, (int, np.integer)):
    raise ShardingError(f'mesh axis must be an int, a name or None, got '
                        f'{axis!r}')
  axis = int(axis)
  if axis != -1 and not 0 <= axis < mesh_ndim:
    raise ShardingError(f'mesh axis {axis} is out of range for a '
                        f'{mesh_ndim}-D device mesh')
  return axis


def AxisSize(device_mesh, axes, mesh_axis_names=None):
  """Devices along `axes` of `device_mesh`: one mesh axis (an index or a
  name; None or -1: replicated, 1) or a tuple of them (the product of
  their sizes); 1 without a mesh. The one definition of a mesh axis size
  (layers' batch, group and expert axes, the pipeline's stage and data
  axes, config_check)."""
  if device_mesh is None:
    return 1
  mesh = np.asarray(device_mesh)
  entries = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
  indices = [_MeshAxis(a, mesh.ndim, mesh_axis_names) for a in entries]
  used = [i for i in indices if i != -1]
  if len(set(used)) != len(used):
    raise ShardingError(f'a mesh axis is used twice in {axes!r}')
  return int(np.prod([mesh.shape[i] for i in used], dtype=np.int64))


def MergedMeshAxis(device_mesh, axes, mesh_axis_names=None):
  """(mesh, index): `device_mesh` with the mesh axes of tuple `axes` merged
  into one (the first major, as a tuple entry of a split mapping lays a
  dim out) and that axis' index, for code that needs one mesh axis (a
  manual-partitioning axis); a single axis: the mesh as is and its index.
  The merged mesh has no axis names."""
  mesh = ValidateDeviceMesh(device_mesh)
  if not isinstance(axes, (tuple, list)):
    return mesh, _MeshAxis(axes, mesh.ndim, mesh_axis_names)
  merged, mapping, _ = _MergeTupleAxes(mesh, [tuple(axes)], mesh_axis_names)
  return merged, mapping[0]


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
    axis = _MeshAxis(axis, mesh_ndim, mesh_axis_names)
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

  Piece i goes to device i. Uneven sizes are allowed (e.g. 15 over 2): XLA
  pads the last shard (GShard §3.3.3).
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
  _CheckDeviceCount(int(num_partitions))
  return xla_sharding.split(t, int(split_dimension) % rank,
                            int(num_partitions), use_sharding_op=True)


def shard(t, device_assignment):
  """Tiles `t` by an ndarray of device ids with the tensor's rank (App A.3).

  `device_assignment[i0, i1, ...]` is the device holding tile (i0, i1, ...);
  e.g. a [3, 16, 64] tensor with an assignment of shape [1, 2, 4] has tiles
  of [3, 8, 16].
  """
  t = tf.convert_to_tensor(t)
  assignment = ValidateDeviceMesh(device_assignment)
  rank = _Rank(t)
  if assignment.ndim != rank:
    raise ShardingError(f'device_assignment has rank {assignment.ndim} but '
                        f'the tensor has rank {rank}')
  if not _Emit():
    return t
  _CheckDeviceCount(assignment.size)
  return xla_sharding.tile(t, assignment, use_sharding_op=True)


def mesh_split(t, device_mesh, split_dims_mapping, mesh_axis_names=None,
               manual_mesh_axis=None):
  """Splits `t` over a logical device mesh (GShard §3.2 `mesh_split`).

  Args:
    t: the tensor.
    device_mesh: ndarray of device ids, or None (no annotation: returns t).
    split_dims_mapping: per tensor dim, a mesh axis (index or name), a
      tuple of mesh axes (split over all, the first major) or -1. None
      means "no annotation".
    mesh_axis_names: optional names of the mesh axes.
    manual_mesh_axis: inside a region made manual on this one mesh axis by
      `auto_to_manual(..., manual_mesh_axis=a)`, annotations must name it
      here (a subgroup sharding); the mapping may not use it.
  """
  t = tf.convert_to_tensor(t)
  if device_mesh is None or split_dims_mapping is None:
    return t
  mesh = ValidateDeviceMesh(device_mesh)
  split_dims_mapping = list(split_dims_mapping)
  rank = _Rank(t)
  vectorized = _VECTORIZED.get()
  if vectorized is not None:
    if manual_mesh_axis is not None:
      raise ShardingError('manual partitioning cannot run inside '
                          'VectorizedOver (a vectorised pipeline stage)')
    split_dims_mapping = [vectorized] + split_dims_mapping
    rank += 1
  mesh, split_dims_mapping, mesh_axis_names = _MergeTupleAxes(
      mesh, split_dims_mapping, mesh_axis_names)
  mapping = ResolveSplitDimsMapping(split_dims_mapping, mesh.ndim, rank,
                                    mesh_axis_names)
  manual = _ManualAxis(manual_mesh_axis, mesh, mapping, mesh_axis_names,
                       must_use=False)
  if not _Emit():
    return t
  _CheckDeviceCount(mesh.size)
  if manual is not None:
    if not _EmitManual():
      return t  # No manual region exists outside SpmdPartitioning.
    return xla_sharding.mesh_split(t, mesh, mapping, use_sharding_op=True,
                                   manual_mesh_dims=[manual])
  return xla_sharding.mesh_split(t, mesh, mapping, use_sharding_op=True)


def _MergeTupleAxes(mesh, split_dims_mapping, mesh_axis_names):
  """(mesh, mapping, names) with each tuple entry's mesh axes merged into
  one axis (transposed next to each other, the first major), so that the
  mapping holds single axes only. Unchanged when no entry is a tuple."""
  if not any(isinstance(a, tuple) for a in split_dims_mapping):
    return mesh, split_dims_mapping, mesh_axis_names
  tuples = {}  # Tensor dim -> its mesh axes (ints).
  for dim, entry in enumerate(split_dims_mapping):
    if isinstance(entry, tuple):
      axes = [_MeshAxis(a, mesh.ndim, mesh_axis_names) for a in entry]
      if not axes or -1 in axes:
        raise ShardingError(f'a tuple of mesh axes must name axes, got '
                            f'{entry!r} in {split_dims_mapping}')
      tuples[dim] = axes
  used = [a for axes in tuples.values() for a in axes]
  groups = list(tuples.values()) + [[a] for a in range(mesh.ndim)
                                    if a not in used]
  order = [a for g in groups for a in g]
  if len(set(order)) != len(order):
    raise ShardingError(f'a mesh axis is used twice in {split_dims_mapping}')
  merged = np.transpose(mesh, order).reshape(
      [int(np.prod([mesh.shape[a] for a in g])) for g in groups])
  group_of = {tuple(g): i for i, g in enumerate(groups)}
  mapping = []
  for dim, entry in enumerate(split_dims_mapping):
    if dim in tuples:
      mapping.append(group_of[tuple(tuples[dim])])
      continue
    axis = _MeshAxis(entry, mesh.ndim, mesh_axis_names)
    if axis != -1 and axis in used:
      raise ShardingError(f'mesh axis {entry!r} is used twice in '
                          f'{split_dims_mapping}')
    mapping.append(-1 if axis == -1 else group_of[(axis,)])
  return merged, mapping, None


def _ManualAxis(manual_mesh_axis, mesh, mapping, mesh_axis_names, must_use):
  """The manual mesh axis as an int (or None), validated against mapping."""
  if manual_mesh_axis is None:
    return None
  axis = _MeshAxis(manual_mesh_axis, mesh.ndim, mesh_axis_names)
  if axis == -1:
    raise ShardingError('manual_mesh_axis must name a mesh axis, got -1')
  if must_use and axis not in mapping:
    raise ShardingError(f'manual_mesh_axis {axis} must split a tensor dim; '
                        f'split_dims_mapping is {mapping}')
  if not must_use and axis in mapping:
    raise ShardingError(f'mesh axis {axis} is manual here and cannot also '
                        f'split a dim: {mapping}')
  return axis


def _ManualSpec(t, device_mesh, split_dims_mapping, mesh_axis_names,
                manual_mesh_axis):
  """(mesh, mapping, serialized full sharding, single_dim) for manual ops."""
  mesh = ValidateDeviceMesh(device_mesh)
  mapping = ResolveSplitDimsMapping(split_dims_mapping, mesh.ndim, _Rank(t),
                                    mesh_axis_names)
  axis = _ManualAxis(manual_mesh_axis, mesh, mapping, mesh_axis_names,
                     must_use=True)
  single_dim = -1 if axis is None else mapping.index(axis)
  proto = xla_sharding.mesh_split_sharding(mesh, mapping).proto
  return mesh, mapping, proto.SerializeToString(), single_dim


def auto_to_manual(t, device_mesh, split_dims_mapping, mesh_axis_names=None,
                   manual_mesh_axis=None):
  """Enters manual partitioning (GShard §3.2): returns the per-device shard.

  `t` (full shape) is laid out by `split_dims_mapping`; the result has the
  shard shape (ceil(d / n) along split dims), e.g. one group per device,
  and the partitioner leaves the ops on it alone until `manual_to_auto`.

  Args:
    t: full-shape tensor.
    device_mesh, split_dims_mapping, mesh_axis_names: as `mesh_split`.
    manual_mesh_axis: None = manual on every mesh axis (devices along mesh
      axes the mapping does not use hold identical shards). A mesh axis =
      manual on that axis only; the dims split over the other axes stay
      automatically partitioned (annotate them inside with
      `mesh_split(..., manual_mesh_axis=...)`).

  Outside `SpmdPartitioning` (one device) this is an identity: the full
  tensor is the one device's shard.
  """
  t = tf.convert_to_tensor(t)
  mesh, mapping, proto, single_dim = _ManualSpec(
      t, device_mesh, split_dims_mapping, mesh_axis_names, manual_mesh_axis)
  if not _EmitManual():
    return t
  _CheckDeviceCount(mesh.size)
  t = xla_sharding.mesh_split(t, mesh, mapping, use_sharding_op=True)
  return xla_sharding.auto_to_manual_spmd_partition(t, proto,
                                                    single_dim=single_dim)


def manual_to_auto(t, device_mesh, split_dims_mapping, full_shape,
                   mesh_axis_names=None, manual_mesh_axis=None):
  """Leaves manual partitioning: per-device shards -> one full tensor.

  Args:
    t: the shard (shape ceil(full / n) along split dims).
    device_mesh, split_dims_mapping, mesh_axis_names: layout of the result,
      as `mesh_split`; same manual_mesh_axis as the `auto_to_manual`.
    full_shape: shape of the full result.
    manual_mesh_axis: see `auto_to_manual`.

  Outside `SpmdPartitioning` this is an identity (shape checked).
  """
  t = tf.convert_to_tensor(t)
  mesh, mapping, proto, single_dim = _ManualSpec(
      t, device_mesh, split_dims_mapping, mesh_axis_names, manual_mesh_axis)
  full_shape = [int(d) for d in full_shape]
  if len(full_shape) != len(mapping):
    raise ShardingError(f'full_shape {full_shape} has {len(full_shape)} dims '
                        f'but the tensor has rank {len(mapping)}')
  emit = _EmitManual()
  local = list(full_shape)
  if emit:
    for i, axis in enumerate(mapping):
      if axis != -1 and (single_dim == -1 or i == single_dim):
        local[i] = -(-full_shape[i] // mesh.shape[axis])
  if not t.shape.is_compatible_with(local):
    raise ShardingError(f'manual shard has shape {t.shape.as_list()} but '
                        f'full_shape {full_shape} split by {mapping} over '
                        f'mesh {list(mesh.shape)} gives shards of {local}')
  if not emit:
    return tf.ensure_shape(t, full_shape) if _Emit() else t
  _CheckDeviceCount(mesh.size)
  return xla_sharding.manual_to_auto_spmd_partition(
      t, proto, full_shape=full_shape, single_dim=single_dim)
