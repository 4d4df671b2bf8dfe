"""Distribution strategies: default | mirrored | multi_worker | tpu.

- `default`: one device, no distribution.
- `mirrored`: data parallel over the local GPUs, or over the host's logical
  CPU devices when there are no GPUs (`ConfigureCpuDevices(n)` splits the
  CPU before TF starts; tests use 2).
- `multi_worker`: MultiWorkerMirroredStrategy; the cluster comes from the
  TF_CONFIG environment variable (none: a single local worker).
- `tpu`: TPUStrategy with `experimental_spmd_xla_partitioning=True` and a
  device assignment whose replicas each span the model's device mesh
  (`task.device_mesh.size` cores), so the XLA sharding annotations in the
  step drive SPMD partitioning inside each replica and data parallelism
  runs across replicas.

Eval and decode (`Replicated`) run their step under the same strategy,
mesh and compilation as training: the restored theta is the training
state's variables, the step is one tf.function, its batch split over the
replicas by rows as the train step's is.

Input: each worker process is one input pipeline (`InputContext`); the
trainer builds its input with `ParamsForHost` (that worker's examples and
share of the global batch) and `DistributeBatch` splits it over the
worker's local replicas; the step sums the replicas' shares of the global
loss itself (lingshard/train/step.py). The per-host dataset is a plain
tf.data iterator rather than `distribute_datasets_from_function`'s,
because only the former can be checkpointed (exact resume): TF 2.21's
DistributedIterator is not trackable.
"""

import dataclasses
import json
import os

import numpy as np
import tensorflow as tf

from lingshard import platform as platform_lib
from lingshard import sharding

STRATEGIES = ('default', 'mirrored', 'multi_worker', 'tpu')


class StrategyError(ValueError):
  """A strategy that cannot be built from the flags and the model."""


@dataclasses.dataclass
class StrategyInfo:
  """What the trainer needs to know about the strategy it runs under: this
  worker's role and input pipeline, and the program's facts (`program`,
  lingshard/platform.py; default: the `kind` run with the --jit default)."""
  kind: str
  is_chief: bool = True
  worker_id: int = 0
  # Input pipelines (one per worker process) and this process's index.
  num_input_pipelines: int = 1
  input_pipeline_id: int = 0
  program: platform_lib.Program = None

  def __post_init__(self):
    if self.program is None:
      self.program = platform_lib.ForStrategy(self.kind)

  @property
  def jit_step(self):
    """Wrap the step in tf.function(jit_compile=True)."""
    return self.program.jit_compile


def InputContext(strategy, info):
  """This process's tf.distribute.InputContext: one input pipeline per
  worker, each feeding its local replicas."""
  return tf.distribute.InputContext(
      num_input_pipelines=info.num_input_pipelines,
      input_pipeline_id=info.input_pipeline_id,
      num_replicas_in_sync=strategy.num_replicas_in_sync)


DefaultJit = platform_lib.DefaultJit


# Logical CPU devices are threads and buffers of one host: 4096 start in
# ~5 s here (0.7 GB) while --num_cpu_devices=100000 stalled; a
# data-parallel CPU run needs a handful, and no registered mesh exceeds 2048.
MAX_CPU_DEVICES = 4096


def ConfigureCpuDevices(n):
  """Splits the host CPU into `n` logical devices (before TF initialises);
  StrategyError beyond MAX_CPU_DEVICES (nothing created)."""
  if n > MAX_CPU_DEVICES:
    raise StrategyError(f'cannot split the host CPU into {n} logical devices: '
                        f'at most {MAX_CPU_DEVICES} (each costs host memory '
                        'and threads)')
  if n <= 1:
    return
  cpus = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])


def ParseTfConfig(text):
  """(task_type, task_index, num_workers, is_chief) from TF_CONFIG json."""
  try:
    config = json.loads(text)
    cluster = config['cluster']
    task = config['task']
    task_type, task_index = task['type'], int(task['index'])
  except (ValueError, KeyError, TypeError) as e:
    raise StrategyError(f'TF_CONFIG is not a valid cluster spec ({e}): '
                        f'{text!r}') from None
  if task_type not in cluster:
    raise StrategyError(f'TF_CONFIG task type {task_type!r} is not in the '
                        f'cluster {sorted(cluster)}')
  if not 0 <= task_index < len(cluster[task_type]):
    raise StrategyError(f'TF_CONFIG task index {task_index} is out of range '
                        f'for {len(cluster[task_type])} {task_type}(s)')
  num_workers = sum(len(cluster.get(k, [])) for k in ('chief', 'worker'))
  has_chief = bool(cluster.get('chief'))
  is_chief = (task_type == 'chief' or
              (not has_chief and task_type == 'worker' and task_index == 0))
  return task_type, task_index, num_workers, is_chief


def ComputationShape(topology_mesh_shape, num_cores):
  """Per-replica core block [x, y, z, cores_per_chip] of `num_cores` cores.

  Fills the cores of a chip first, then x, y, z in turn, one prime factor
  at a time, so a replica is a compact block of the physical mesh. A prime
  factor always fits some dim (num_cores divides the topology's core
  count), so the only error is a mesh that does not divide the topology.
  """
  topo = [int(d) for d in topology_mesh_shape]
  total = int(np.prod(topo))
  if num_cores < 1 or total % num_cores:
    raise StrategyError(f'a device mesh of {num_cores} cores does not divide '
                        f'the TPU topology {topo} ({total} cores)')
  shape = [1] * len(topo)
  remaining = num_cores
  order = [len(topo) - 1] + list(range(len(topo) - 1))
  factor = 2
  while remaining > 1:
    while remaining % factor:
      factor += 1
    dim = next(d for d in order if topo[d] % (shape[d] * factor) == 0)
    shape[dim] *= factor
    remaining //= factor
  return shape


def DeviceAssignmentForMesh(topology, device_mesh):
  """A DeviceAssignment with replicas of `device_mesh.size` cores each.

  The mesh's device ids are the logical core ids of one replica's
  computation, which is what XLA's sharding annotations refer to.
  """
  cores_per_replica = 1 if device_mesh is None else int(
      np.asarray(device_mesh).size)
  shape = ComputationShape(topology.mesh_shape, cores_per_replica)
  num_replicas = int(np.prod(topology.mesh_shape)) // cores_per_replica
  return tf.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=shape, num_replicas=num_replicas)


def CreateStrategy(kind, tpu=None, device_mesh=None, jit=None,
                   mesh_axis_names=None):
  """Builds the strategy `kind`; returns (strategy, StrategyInfo) whose
  `program` holds the run's facts (platform.ForStrategy)."""
  if kind not in STRATEGIES:
    raise StrategyError(f'Unknown --strategy {kind!r}; one of '
                        f'{", ".join(STRATEGIES)}')
  info = StrategyInfo(kind=kind)
  strategy, num_replicas = _Create(kind, tpu, device_mesh, info)
  info.program = platform_lib.ForStrategy(
      kind, jit, device_mesh, mesh_axis_names, num_replicas=num_replicas)
  return strategy, info


def _Create(kind, tpu, device_mesh, info):
  """(the strategy `kind`, its replicas in sync); fills `info`'s worker
  fields (multi_worker)."""
  if kind == 'default':
    return tf.distribute.get_strategy(), 1
  if kind == 'mirrored':
    gpus = tf.config.list_logical_devices('GPU')
    if gpus:
      strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
    else:
      cpus = [d.name for d in tf.config.list_logical_devices('CPU')]
      strategy = tf.distribute.MirroredStrategy(
          cpus, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return strategy, strategy.num_replicas_in_sync
  if kind == 'multi_worker':
    text = os.environ.get('TF_CONFIG')
    if text:
      task_type, index, num_workers, is_chief = ParseTfConfig(text)
      info.is_chief, info.worker_id = is_chief, index
      # Pipeline ids follow TF's worker order: the chief (if any) first.
      has_chief = 'chief' in json.loads(text)['cluster']
      info.num_input_pipelines = num_workers
      info.input_pipeline_id = (0 if task_type == 'chief' else
                                index + int(has_chief))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return strategy, strategy.num_replicas_in_sync
  if not tpu:
    raise StrategyError('--strategy=tpu needs --tpu (a TPU name, or "local" '
                        'on a TPU VM)')
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  topology = tf.tpu.experimental.initialize_tpu_system(resolver)
  assignment = DeviceAssignmentForMesh(topology, device_mesh)
  # Each replica spans the mesh's cores: the assignment's replicas.
  return tf.distribute.TPUStrategy(
      resolver, experimental_device_assignment=assignment,
      experimental_spmd_xla_partitioning=True), assignment.num_replicas


def DistributeBatch(strategy, batch, num_input_pipelines=1):
  """Splits this worker's batch (dim 0) evenly over its local replicas.

  With one input pipeline the batch is the global batch; with one per
  worker (InputContext) it is the worker's share, and worker w's replicas
  (global ids w n_local ... (w + 1) n_local - 1) take its pieces in order,
  so replica r always holds global rows [r b, (r + 1) b).
  """
  n = strategy.num_replicas_in_sync
  if n == 1:
    return batch
  local = n // num_input_pipelines
  for key, t in batch.FlattenItems():
    size = t.shape[0]
    if size is not None and size % local:
      raise StrategyError(f'batch.{key} has {size} examples, not divisible by '
                          f'{local} replicas')

  def Slice(ctx):
    i = ctx.replica_id_in_sync_group % local
    return tf.nest.map_structure(lambda t: tf.split(t, local)[i], batch)

  return strategy.experimental_distribute_values_from_function(Slice)


def _Read(theta):
  """Theta's values (variables are read inside the program: a mirrored
  variable gives its replica's copy)."""
  return theta.Transform(tf.convert_to_tensor)


class Replicated:
  """An inference step (eval's forward pass, a decoder's search) run as
  the train loop runs the train step: under `strategy`, the batch's rows
  split evenly over the replicas (DistributeBatch; the step annotates the
  weights and activations itself, e.g. task.ShardTheta), XLA-compiled and
  annotated as `info.program` says (`jit` adds XLA compilation: a task's
  own choice, e.g. the decoder's `decode.jit`). With the default strategy
  the step is one tf.function of `fn` itself, as before strategies came
  to eval.
  """

  def __init__(self, strategy=None, info=None):
    self.strategy = strategy or tf.distribute.get_strategy()
    self.info = info or StrategyInfo(kind='default')
    self.program = self.info.program

  def Describe(self):
    """'strategy default: 1 replica(s) on mesh 8 (x)' (the mesh each replica
    spans: platform.Program.spmd), 'strategy mirrored: 2 replica(s) of one
    device, mesh 8 (x) not partitioned', '..., no mesh'."""
    p = self.program
    head = f'strategy {p.strategy}: {p.num_replicas} replica(s)'
    if p.mesh_shape is None:
      return f'{head}, no mesh'
    names = f' ({", ".join(p.mesh_axis_names)})' if p.mesh_axis_names else ''
    mesh = f'mesh {"x".join(str(d) for d in p.mesh_shape)}{names}'
    if p.spmd:
      return f'{head} on {mesh}'
    return f'{head} of one device, {mesh} not partitioned'

  def Function(self, fn, jit=False):
    """`fn(theta, batch, *args)` as one compiled program (traced once per
    input shapes). `theta`: tensors or variables (read in the program);
    `batch`: a NestedMap of [B, ...] tensors split by rows; `args` go to
    every replica. The returned callable gives a list of `fn`'s outputs on
    consecutive row blocks of the batch, one per local replica, or one
    output of the whole batch when B does not split evenly over them (each
    replica then runs it whole)."""
    p = self.program
    jit = bool(jit or p.jit_compile) and p.strategy != 'tpu'
    if p.strategy == 'default':  # One program, no replica function.
      return sharding.Function(
          lambda theta, batch, *args: [fn(_Read(theta), batch, *args)],
          xla_compiled=jit or p.xla_compiled, jit_compile=jit)
    # Across replicas each replica's step is an XLA program of its own
    # (as the train step's halves: step.TrainStep.Replica).
    step = (sharding.Function(fn, xla_compiled=True, jit_compile=True)
            if jit else fn)
    strategy = self.strategy
    pipelines = self.info.num_input_pipelines

    def Outer(theta, batch, *args):
      local = strategy.num_replicas_in_sync // pipelines
      rows = batch.Flatten()[0].shape[0]
      even = rows is not None and rows % local == 0
      split = DistributeBatch(strategy, batch, pipelines) if even else batch
      out = strategy.experimental_local_results(strategy.run(
          lambda th, b, *a: step(_Read(th), b, *a),
          args=(theta, split) + args))
      return list(out) if even else [out[0]]

    return sharding.Function(Outer, xla_compiled=jit or p.xla_compiled)
