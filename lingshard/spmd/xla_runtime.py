"""The standalone XLA runtime of the SPMD checker: jaxlib, and nothing else.

This is the ONLY module in lingshard that touches jaxlib/jax internals
(`jax._src...`) and TensorFlow's private XLA protos (`hlo_pb2`,
`xla_data_pb2`, see `HloProtos`). TensorFlow exports the HLO of a step; this module hands it
to XLA's SPMD partitioner (GShard §3.3) for N partitions, places the inputs
on N virtual host CPU devices by the partitioner's parameter shardings, runs
the program and reassembles the outputs. Private APIs are used as checked on
jaxlib 0.10.2; any other version fails early with one clear message, so a
jaxlib change breaks here and nowhere else.

The number of virtual CPU devices is fixed when the backend initialises:
`XLA_FLAGS=--xla_force_host_platform_device_count=N` or
`ConfigureCpuDevices(N)` before the first use.
"""

import functools
import math
import time

import numpy as np

PINNED_JAXLIB_VERSION = '0.10.2'
INSTALL_HINT = 'install the spmd extra: pip install -e .[spmd]'


# Virtual CPU devices cost host memory and threads (4096 took 0.6 GB and 8 s
# to start here; a --mesh of 100000 grew past 6 GB before any check ran);
# the largest registered mesh (m4.MoE2048E36L's) has 2048 devices.
MAX_CPU_DEVICES = 4096
DEVICE_LIMIT = (f'at most {MAX_CPU_DEVICES} virtual CPU devices (each costs '
                'host memory; the largest registered mesh, m4.MoE2048E36L\'s, '
                'has 2048)')


class JaxlibUnavailableError(ImportError):
  """jaxlib is missing or not the version this module was written for."""


class DeviceCountError(ValueError):
  """A mesh that does not fit the number of virtual CPU devices."""


def CheckJaxlibVersion(found):
  """Raises JaxlibUnavailableError unless `found` is the pinned version."""
  if found is None:
    raise JaxlibUnavailableError(
        f'lingshard.spmd needs jaxlib=={PINNED_JAXLIB_VERSION} (the '
        f'standalone XLA partitioner), but jaxlib is not installed; '
        f'{INSTALL_HINT}')
  if found != PINNED_JAXLIB_VERSION:
    raise JaxlibUnavailableError(
        f'lingshard.spmd needs jaxlib=={PINNED_JAXLIB_VERSION}, found jaxlib '
        f'{found}; {INSTALL_HINT}')


class _Jax:
  """The jax/jaxlib names this module uses, imported once."""

  def __init__(self):
    try:
      import jaxlib.version  # pylint: disable=g-import-not-at-top
      found = jaxlib.version.__version__
    except ImportError:
      found = None
    CheckJaxlibVersion(found)
    try:
      # pylint: disable=g-import-not-at-top
      import jax
      from jax._src import xla_bridge
      from jax._src.lib import _jax
      from jax._src.lib import xla_client
      from tensorflow.compiler.xla import xla_data_pb2
      from tensorflow.compiler.xla.service import hlo_pb2
      # pylint: enable=g-import-not-at-top
    except ImportError as e:
      raise JaxlibUnavailableError(
          f'lingshard.spmd needs jax=={PINNED_JAXLIB_VERSION} with jaxlib '
          f'{found} ({e}); {INSTALL_HINT}') from e
    self.version = found
    self.jax = jax
    self.xla_bridge = xla_bridge
    self.hlo_to_stablehlo = _jax.mlir.hlo_to_stablehlo
    self.xla_client = xla_client
    self.hlo_pb2 = hlo_pb2
    self.xla_data_pb2 = xla_data_pb2


@functools.cache
def _Load():
  return _Jax()


def ClearCache():
  """Forgets the loaded jax/jaxlib names: the next use imports and checks
  them again (tests that hide jaxlib)."""
  _Load.cache_clear()


def JaxlibVersion():
  """The (checked) jaxlib version string."""
  return _Load().version


def HloProtos():
  """(hlo_pb2, xla_data_pb2): TensorFlow's private XLA proto modules, loaded
  behind the same version check as jaxlib's internals."""
  j = _Load()
  return j.hlo_pb2, j.xla_data_pb2


def ParseHloModule(serialized_hlo):
  """The HloModuleProto of serialized bytes."""
  module = HloProtos()[0].HloModuleProto()
  module.ParseFromString(serialized_hlo)
  return module


def ConfigureCpuDevices(num_devices):
  """Sets the number of virtual CPU devices; only before the backend starts.

  A no-op if the backend already has exactly `num_devices` devices.
  DeviceCountError beyond MAX_CPU_DEVICES, before any device exists.
  """
  if not 1 <= num_devices <= MAX_CPU_DEVICES:
    raise DeviceCountError(f'cannot create {num_devices} virtual CPU devices: '
                           f'{DEVICE_LIMIT}')
  j = _Load()
  if j.xla_bridge.backends_are_initialized():
    have = NumCpuDevices()
    if have != num_devices:
      raise DeviceCountError(
          f'cannot switch to {num_devices} virtual CPU devices: the XLA '
          f'backend already started with {have}; set XLA_FLAGS='
          f'--xla_force_host_platform_device_count={num_devices} before '
          'anything initialises jax, or use a fresh process')
    return
  j.jax.config.update('jax_num_cpu_devices', int(num_devices))
  # Only host devices are used: skip probing for TPU/GPU plugins.
  j.jax.config.update('jax_platforms', 'cpu')


def NumCpuDevices():
  """Number of virtual host CPU devices (initialises the backend)."""
  return len(_Load().xla_bridge.get_backend('cpu').local_devices())


def CpuDevices(num_devices):
  """The first `num_devices` CPU devices; DeviceCountError if too few."""
  if num_devices < 1:
    raise DeviceCountError(f'need at least 1 device, got {num_devices}')
  devices = _Load().xla_bridge.get_backend('cpu').local_devices()
  if num_devices > len(devices):
    raise DeviceCountError(
        f'the mesh needs {num_devices} devices but only {len(devices)} '
        'virtual CPU devices exist; set XLA_FLAGS='
        f'--xla_force_host_platform_device_count={num_devices} (or more) '
        'before jax initialises, e.g. at the top of the test process')
  return list(devices[:num_devices])


# ------------------------------------------------------------------ tiles
def _Layout(op_sharding, shape, num_partitions):
  """(tiles per dim, tile shape, [index into the full array per partition]).

  Follows the partitioner's layout rule (GShard §3.3.3): a dim of size d
  split n ways has tiles of ceil(d/n); the last tiles are short (or empty)
  and padded. Partial-replication / subgroup dims of the tile assignment
  only say which devices hold copies, so they are dropped.
  """
  hs = _Load().xla_client.HloSharding.from_proto(op_sharding)
  rank = len(shape)
  if hs.is_replicated() or rank == 0:
    full = tuple(slice(0, d) for d in shape)
    return (1,) * rank, tuple(shape), [full] * num_partitions
  if hs.is_manual():
    raise RuntimeError(
        'the partitioner gave a program input/output the {manual} sharding: '
        'manual partitioning leaked out of an auto_to_manual ... '
        'manual_to_auto region (every value leaving it must pass through '
        'manual_to_auto)')
  if not hs.is_tiled():
    raise NotImplementedError(f'unsupported sharding {hs}')
  dims = list(hs.tile_assignment_dimensions())
  assignment = np.asarray(hs.tile_assignment_devices()).reshape(dims)
  tile = tuple(math.ceil(shape[i] / dims[i]) for i in range(rank))
  indices = []
  for p in range(num_partitions):
    coords = np.argwhere(assignment == p)[0][:rank]
    indices.append(tuple(slice(min(c * t, d), min((c + 1) * t, d))
                         for c, t, d in zip(coords, tile, shape)))
  return tuple(dims[:rank]), tile, indices


def _Shard(value, index, tile):
  """The tile of `value` at `index`, zero-padded to `tile` (XLA masks it)."""
  piece = value[index]
  pad = [(0, t - s) for t, s in zip(tile, piece.shape)]
  return np.pad(piece, pad) if any(b for _, b in pad) else piece


def _ShardingText(op_sharding):
  return str(_Load().xla_client.HloSharding.from_proto(op_sharding))


class Executable:
  """An SPMD-partitioned XLA program loaded on N virtual CPU devices.

  Attributes:
    num_partitions: N.
    compile_seconds: wall time of partitioning + compilation.
    hlo_text: the partitioned (per-device) HLO module after optimisation.
    parameter_shardings / output_shardings: HloSharding strings, in order.
  """

  def __init__(self, exe, devices, compile_seconds):
    self._exe = exe
    self._devices = devices
    self.num_partitions = len(devices)
    self.compile_seconds = compile_seconds
    # Unpartitioned programs (N = 1) report no shardings: all replicated.
    replicated = _Load().xla_client.HloSharding.replicate().to_proto()
    self._param_protos = list(exe.get_parameter_shardings() or [
        replicated] * len(exe.get_parameter_layouts()))
    self._output_protos = list(exe.get_output_shardings() or [
        replicated] * len(exe.get_output_layouts()))
    self.parameter_shardings = [_ShardingText(p) for p in self._param_protos]
    self.output_shardings = [_ShardingText(p) for p in self._output_protos]
    self.hlo_text = exe.hlo_modules()[0].to_string()

  def CostAnalysis(self):
    """XLA's per-device cost analysis: {'flops', 'transcendentals', ...}."""
    cost = self._exe.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else {}
    return {k: float(v) for k, v in dict(cost).items()}

  def MemoryStats(self):
    """Per-device buffer bytes: argument, output, temp, alias, code."""
    m = self._exe.get_compiled_memory_stats()
    return {
        'argument': int(m.argument_size_in_bytes),
        'output': int(m.output_size_in_bytes),
        'temp': int(m.temp_size_in_bytes),
        'alias': int(m.alias_size_in_bytes),
        'generated_code': int(m.generated_code_size_in_bytes),
    }

  def Run(self, args, output_shapes):
    """Runs on host arrays `args`; returns full numpy outputs.

    Args:
      args: numpy arrays, one per entry parameter, full (unpartitioned).
      output_shapes: the full shape of each output (per-device results are
        tiles, possibly padded, that are put back together here).
    """
    j = _Load()
    if len(args) != len(self._param_protos):
      raise ValueError(f'the program takes {len(self._param_protos)} '
                       f'arguments, got {len(args)}')
    device_list = j.xla_client.DeviceList(tuple(self._devices))
    placed = []
    for value, proto in zip(args, self._param_protos):
      value = np.asarray(value)
      counts, tile, indices = _Layout(proto, value.shape,
                                      self.num_partitions)
      pieces = [j.jax.device_put(_Shard(value, index, tile), device)
                for index, device in zip(indices, self._devices)]
      # A padded global shape divides evenly, as jax arrays require.
      placed.append(j.jax.make_array_from_single_device_arrays(
          tuple(t * c for t, c in zip(tile, counts)),
          j.xla_client.GSPMDSharding(device_list, proto), pieces))
    results = self._exe.execute_sharded(placed)
    per_device = results.disassemble_into_single_device_arrays()
    outputs = []
    for shards, proto, shape in zip(per_device, self._output_protos,
                                    output_shapes):
      shape = tuple(shape)
      _, _, indices = _Layout(proto, shape, self.num_partitions)
      out = None
      for index, shard, device in zip(indices, shards, self._devices):
        if shard.device != device:
          raise RuntimeError(f'output shard on {shard.device}, expected '
                             f'{device}')
        host = np.asarray(shard)
        if out is None:
          out = np.zeros(shape, host.dtype)
        out[index] = host[tuple(slice(0, s.stop - s.start) for s in index)]
      outputs.append(out)
    return outputs


# LLVM optimisation level of the checker's CPU code (XLA's
# xla_backend_optimization_level; XLA's default is 2). What the checker
# proves is HLO-level (partitioning, collectives, buffer sizes, and parity
# of the partitioned program with the single-device one, both compiled
# alike); only the host machine code differs, and at 0 the partitioned
# gpipe.TinyMoEPipelined check takes ~18% less CPU time (its programs run
# once, on kilobyte-sized tensors).
BACKEND_OPTIMIZATION_LEVEL = 0


def CompileSpmd(serialized_hlo, num_partitions,
                backend_optimization_level=BACKEND_OPTIMIZATION_LEVEL):
  """Partitions and compiles an HLO module for `num_partitions` devices.

  Args:
    serialized_hlo: HloModuleProto bytes (TF's `stage='hlo_serialized'`),
      with GShard sharding annotations (custom-call "Sharding").
    num_partitions: N; runs on the first N virtual CPU devices.
    backend_optimization_level: LLVM's level for the CPU code (see
      BACKEND_OPTIMIZATION_LEVEL); the HLO passes are XLA's either way.

  Entry parameters and outputs without a sharding take the one the
  partitioner propagates to them (as TPU input pipelines and sharded
  variables would), rather than being forced replicated.
  """
  j = _Load()
  devices = CpuDevices(num_partitions)
  client = j.xla_bridge.get_backend('cpu')
  module = j.hlo_to_stablehlo(serialized_hlo)
  options = j.xla_client.CompileOptions()
  build = options.executable_build_options
  build.num_replicas = 1
  build.num_partitions = num_partitions
  build.use_spmd_partitioning = True
  build.debug_options.xla_backend_optimization_level = int(
      backend_optimization_level)
  build.use_shardy_partitioner = False  # GSPMD: the GShard partitioner.
  build.allow_spmd_sharding_propagation_to_parameters = [True]
  build.allow_spmd_sharding_propagation_to_output = [True]
  build.device_assignment = j.xla_client.DeviceAssignment.create(
      np.asarray([[d.id for d in devices]]))
  start = time.perf_counter()
  exe = client.compile_and_load(
      module, j.xla_client.DeviceList(tuple(devices)), options)
  return Executable(exe, devices, time.perf_counter() - start)
