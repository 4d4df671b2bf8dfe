"""The one answer to "which program is this?".

`Platform(strategy_kind)` is what the trainer's MoE dispatch and every
other platform-dependent params choice (`BaseLayer.ForPlatform`) read:
'tpu' for a TPUStrategy job; otherwise the host's GPU if it has one, else
its CPU. With no strategy (a layer built directly) a TPU host counts too.
Listing physical devices does not initialise TensorFlow's logical devices,
which a caller may still configure (e.g. virtual CPUs).

`Program` is everything else a training job's code asks about the program
it runs in, decided once from the flags and the model (`ForStrategy`, by
`strategies.CreateStrategy`) and read by the train loop (how the step is
compiled and annotated), the trainer and config_check (whether a replica
spans the device mesh, how many replicas): XLA-compiled or not, platform,
SPMD or not, mesh shape and axis names, replica count.
"""

import dataclasses

import numpy as np
import tensorflow as tf

PLATFORMS = ('cpu', 'gpu', 'tpu')


def Platform(strategy_kind=None):
  """'tpu' | 'gpu' | 'cpu' for a --strategy kind (None: this host)."""
  if strategy_kind == 'tpu':
    return 'tpu'
  kinds = ('gpu',) if strategy_kind is not None else ('tpu', 'gpu')
  for kind in kinds:
    if tf.config.list_physical_devices(kind.upper()):
      return kind
  return 'cpu'


def DefaultJit(strategy_kind, jit_flag):
  """--jit default: on for tpu, off elsewhere; an explicit flag wins."""
  return strategy_kind == 'tpu' if jit_flag is None else bool(jit_flag)


@dataclasses.dataclass(frozen=True)
class Program:
  """Facts of one training program (immutable; `ForStrategy` builds it).

  strategy: the --strategy kind ('default', 'mirrored', 'multi_worker',
    'tpu').
  platform: Platform(strategy).
  jit: the --jit choice (DefaultJit).
  mesh_shape / mesh_axis_names: the task's device mesh (None: no mesh).
  num_replicas: replicas in sync (the strategy's).
  """
  strategy: str = 'default'
  platform: str = 'cpu'
  jit: bool = False
  mesh_shape: tuple = None
  mesh_axis_names: tuple = None
  num_replicas: int = 1

  @property
  def xla_compiled(self):
    """XLA compiles the step: --jit, or a TPU replica function (its
    sharding annotations are kept: sharding.Function)."""
    return self.jit or self.strategy == 'tpu'

  @property
  def jit_compile(self):
    """The step is wrapped in tf.function(jit_compile=True); a TPU replica
    function is compiled whole already."""
    return self.jit and self.strategy != 'tpu'

  @property
  def jit_whole(self):
    """One XLA program for the whole step (the default strategy)."""
    return self.jit_compile and self.strategy == 'default'

  @property
  def jit_halves(self):
    """Across replicas only the step's halves are XLA programs, with the
    cross-replica sum between them (step.TrainStep.Replica)."""
    return self.jit_compile and not self.jit_whole

  @property
  def spmd(self):
    """Each replica spans the device mesh (default, TPU): its annotations
    are partitioned; mirrored / multi-worker replicas are single devices."""
    return self.strategy in ('default', 'tpu')


def ForStrategy(strategy_kind, jit_flag=None, device_mesh=None,
                mesh_axis_names=None, num_replicas=1):
  """The Program of a --strategy / --jit run of a model with this mesh."""
  mesh_shape = (None if device_mesh is None else
                tuple(int(d) for d in np.shape(device_mesh)))
  return Program(
      strategy=strategy_kind, platform=Platform(strategy_kind),
      jit=DefaultJit(strategy_kind, jit_flag), mesh_shape=mesh_shape,
      mesh_axis_names=(None if mesh_axis_names is None else
                       tuple(mesh_axis_names)),
      num_replicas=num_replicas)
