"""Cloud TPU accelerator types, and whether a model fits one.

`Topology('v3-2048')` -> TpuTopology(devices=2048, hosts=256): the number
of TPU devices TensorFlow sees (TPUStrategy's cores) and of worker hosts:

- v2-N, v3-N: N TensorCores, each a device; 8 cores (4 chips) per host.
- v4-N, v5p-N: N TensorCores, two per chip fused into one device
  (megacore), so N/2 devices; 4 chips per host.
- v5litepod-N / v5e-N, v6e-N: N chips of one core; one host up to 8
  chips, 4 chips per host beyond.

`CheckModelOnTpu(params, accelerator_type)` refuses a model whose device
mesh does not tile the slice (each TPUStrategy replica spans the mesh,
strategies.DeviceAssignmentForMesh) or whose batch does not split over the
replicas (config_check.Validate), with one line.
"""

import dataclasses
import re

import numpy as np

from lingshard import config_check

_TYPE_RE = re.compile(r'(v2|v3|v4|v5p|v5litepod|v5e|v6e)-(\d+)')
EXAMPLES = 'v2-8, v3-2048, v4-32, v5p-16, v5litepod-8, v6e-16'


class TopologyError(ValueError):
  """An accelerator type that is unknown or does not fit the model."""


@dataclasses.dataclass(frozen=True)
class TpuTopology:
  accelerator_type: str
  devices: int
  hosts: int


def Topology(accelerator_type):
  """The TpuTopology of a Cloud TPU accelerator type (module docstring)."""
  m = _TYPE_RE.fullmatch(accelerator_type)
  if not m or int(m.group(2)) < 1:
    raise TopologyError(f'--accelerator_type {accelerator_type!r} is not a '
                        f'Cloud TPU type such as {EXAMPLES}')
  gen, n = m.group(1), int(m.group(2))
  if gen in ('v2', 'v3'):
    devices, hosts = n, max(n // 8, 1)
  elif gen in ('v4', 'v5p'):
    devices, hosts = max(n // 2, 1), max(n // 8, 1)
  else:
    devices, hosts = n, (1 if n <= 8 else n // 4)
  return TpuTopology(accelerator_type, devices, hosts)


def CheckModelOnTpu(params, model, accelerator_type):
  """(topology, replicas, mesh size) of `params` (model key `model`) on the
  slice; TopologyError with one line when it cannot run there."""
  topo = Topology(accelerator_type)
  mesh = params.task.device_mesh
  cores = 1 if mesh is None else int(np.asarray(mesh).size)
  if topo.devices % cores:
    raise TopologyError(
        f'{model} needs a multiple of {cores} TPU devices (its device mesh '
        f'{list(np.shape(mesh))}); a {accelerator_type} has {topo.devices} '
        f'on {topo.hosts} host(s)')
  replicas = topo.devices // cores
  try:
    config_check.Validate(params, num_replicas=replicas)
  except config_check.ConfigCheckError as e:
    raise TopologyError(f'{model} on a {accelerator_type} ({replicas} '
                        f'replica(s) of {cores} devices): {e}') from None
  return topo, replicas, cores
