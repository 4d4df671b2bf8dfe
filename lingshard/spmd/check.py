"""The SPMD checker: prove sharding annotations on N virtual CPU devices.

Given a step as a pure function of named inputs (theta, batch), the checker

1. exports its HLO (`tf.function(jit_compile=True)`,
   `experimental_get_compiler_ir(...)(stage='hlo_serialized')`) inside
   `sharding.SpmdPartitioning(N)` with every annotation, exactly what a TPU
   step would compile. The single-device reference is that HLO with its
   annotations removed (`unsharded`; a program with manual regions is
   exported again under `sharding.Unannotated`, where manual-partitioning
   calls are identities), compiled and run by the same XLA as the
   partitioned program (TF's own XLA differs from it by more than
   partitioning does: e.g. its exp/log approximations moved gradients of
   m4.TinyDense on a real batch by 1e-2 relative);
2. routes constants into manual regions (`manual_constants`), then
   partitions that HLO with XLA's SPMD partitioner (GShard §3.3) for
   N = prod(mesh_shape) devices and runs it on N virtual host CPU devices
   (`xla_runtime`, the only module touching jaxlib and TF's private XLA
   protos);
3. compares every output with the reference (dtype-aware tolerance) and
   reports the collectives, per-device FLOPs and memory, compile time, and
   `--expect` rule violations (`report`, `expect`).

Entry points:
  CheckModel(key, mesh_shape, ...)       a registered model's train step
  CheckTask(task, batch, mesh_shape, ...) an instantiated task
  CheckLayerParams(layer_params, mesh_shape, inputs, ...)  any layer
  CheckFunction(fn, inputs, mesh_shape, ...)  any annotated TF function
Each returns a `CheckResult`; `result.ok` / `result.AssertOk()`.

Model and layer steps are `task.LossAndGradients` (the trainer's step math)
returning NestedMap(loss, grads); gradients are annotated with their weight's
layout (`task.ShardTheta`), as a sharded optimizer would consume them.
"""

import dataclasses
import math
import time

import numpy as np
import tensorflow as tf

from lingshard import base_input
from lingshard import config_check
from lingshard import model_registry
from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.layers import kinks
from lingshard.nested_map import NestedMap
from lingshard.spmd import expect as expect_lib
from lingshard.spmd import layer_task
from lingshard.spmd import manual_constants
from lingshard.spmd import report
from lingshard.spmd import unsharded
from lingshard.spmd import xla_runtime

# (rtol, atol) per dtype: partitioned reductions sum in another order.
_TOLERANCES = {
    'float64': (1e-9, 1e-12),
    'float32': (1e-4, 1e-6),
    'bfloat16': (2e-2, 1e-3),
    'float16': (5e-3, 1e-4),
}
# A float output may differ beyond tolerance in at most this fraction of its
# elements: a discontinuity hit by rounding. Partitioned reductions move a
# ReLU pre-activation within rounding of 0 to its other side, which changes
# one token's contribution to one hidden unit: a column of one expert's wi
# gradient (measured: gpipe.TinyMoEPipelined on 2x2x2, AVX-512 host, 40 of
# 524,288 elements of a decoder wi gradient, all in hidden unit 130 of
# expert 5, max rel 2e-3; every other tensor within 5e-5). That token's
# input gradient moves too, hence every gradient upstream of the unit: in
# deeper models beyond this allowance (gpipe.TinyMoEPipelinedCircular on the
# full corpus: 6 such units, 36 tensors), which the comparison with relu's
# (and max pooling's) derivative smoothed (CheckFunction, layers/kinks.py)
# tells from a partitioning error. A routing choice
# flipped by rounding changes a whole expert's gradient, 1/E of wi: allowed
# only with E > 100. A partitioning error is shaped by the shards: it touches
# a shard's share or more (an all-reduce left out: every element); outputs
# of under 100 elements get no allowance at all.
ISOLATED_FRACTION = 0.01


class MeshShapeError(ValueError):
  """A mesh shape that is not a non-empty list of positive ints."""


class SpmdCheckError(AssertionError):
  """A partitioned run that does not match, or an unmet expectation."""


@dataclasses.dataclass
class TensorError:
  """Partitioned-vs-reference error of one output.

  max_rel is max|got - ref| / max|ref| (normwise, so near-zero entries do
  not dominate). `beyond` counts the elements with |got - ref| > rtol *
  max|ref| + atol; ok iff the non-finite entries agree and `beyond` is 0,
  or at most ISOLATED_FRACTION of the elements of a float output (see its
  comment); integer and bool outputs must match exactly.
  """
  name: str
  dtype: str
  shape: tuple
  max_abs: float
  max_rel: float
  rtol: float
  atol: float
  ok: bool
  beyond: int = 0
  size: int = 0


@dataclasses.dataclass
class CheckResult:
  """Everything one check measured. `ok` = matches and no violations.

  FLOPs / bytes / memory are XLA's analyses of the per-device program;
  program_size / partitioned_size count HLO instructions of the exported
  (single-program) module and of the partitioned per-device module;
  exported_hlo is the serialized module handed to the partitioner.
  `matches` is None when the run was not compared (compare=False).
  `outputs` are the partitioned run's outputs by name (numpy; empty when
  not run), e.g. to compare with another program's. `kink_errors` (None
  unless the plain comparison failed in a program with ReLUs or max
  pooling) compares both programs again with their derivatives smoothed
  (layers/kinks.py); its match makes `matches` True: the plain mismatch
  was gradients switched on or off at pre-activations within rounding of
  0 (pooling inputs within rounding of their window's max).
  """
  name: str
  mesh_shape: tuple
  num_partitions: int
  jaxlib_version: str
  errors: list
  max_abs_error: float
  max_rel_error: float
  matches: bool
  collectives: list
  flops: float
  transcendentals: float
  bytes_accessed: float
  memory: dict
  export_seconds: float
  compile_seconds: float
  run_seconds: float
  input_shardings: dict
  output_shardings: dict
  hlo_text: str
  exported_hlo: bytes
  program_size: int
  partitioned_size: int
  expectations: list
  violations: list
  outputs: dict = dataclasses.field(default_factory=dict)
  kink_errors: list = None

  @property
  def ok(self):
    return self.matches is not False and not self.violations

  def CollectiveCounts(self):
    """{kind: count} over all report.KINDS (zeros included)."""
    return {k: v[0] for k, v in report.CountByKind(self.collectives).items()}

  def CollectivesOf(self, kind):
    """The collectives of one kind."""
    return [c for c in self.collectives if c.kind == kind]

  def Report(self, max_detail=40):
    """The text report (as printed by the CLI), listing <= max_detail ops."""
    return report.FormatReport(self, max_detail)

  def AssertOk(self):
    """Raises SpmdCheckError (with the report) unless ok."""
    if not self.ok:
      raise SpmdCheckError(self.Report())


def MeshShape(mesh_shape):
  """A validated tuple of positive ints from an int, sequence or '2,4'."""
  value = mesh_shape
  if isinstance(value, str):
    try:
      value = [int(p) for p in value.split(',') if p.strip()]
    except ValueError:
      raise MeshShapeError(f'mesh shape must be a comma list of positive '
                           f'ints, got {mesh_shape!r}') from None
  if isinstance(value, (int, np.integer)):
    value = [value]
  value = tuple(value)
  if not value or not all(isinstance(d, (int, np.integer)) and
                          not isinstance(d, bool) and d >= 1 for d in value):
    raise MeshShapeError(f'mesh shape must be positive ints, got '
                         f'{mesh_shape!r}')
  num = math.prod(int(d) for d in value)  # Exact: no int64 overflow.
  if num > xla_runtime.MAX_CPU_DEVICES:
    raise MeshShapeError(f'mesh shape {mesh_shape!r} needs {num} devices; '
                         f'{xla_runtime.DEVICE_LIMIT}')
  return tuple(int(d) for d in value)


def Compare(name, ref, got, rtol=None, atol=None):
  """TensorError of `got` against `ref` (see TensorError)."""
  ref, got = np.asarray(ref), np.asarray(got)
  dtype = ref.dtype.name
  if dtype in _TOLERANCES:
    rtol = _TOLERANCES[dtype][0] if rtol is None else rtol
    atol = _TOLERANCES[dtype][1] if atol is None else atol
  else:  # Integers and bools must match exactly.
    rtol, atol = 0.0, 0.0
  if ref.shape != got.shape:
    return TensorError(name, dtype, ref.shape, math.inf, math.inf, rtol, atol,
                       False, ref.size, ref.size)
  r64, g64 = ref.astype(np.float64), got.astype(np.float64)
  finite = np.isfinite(r64) & np.isfinite(g64)
  # Elsewhere both must hold the same inf, or both NaN.
  nonfinite_off = int(np.count_nonzero(~(finite | (r64 == g64) |
                                         (np.isnan(r64) & np.isnan(g64)))))
  diff = np.abs(r64[finite] - g64[finite])
  max_abs = float(diff.max()) if diff.size else 0.0
  scale = float(np.abs(r64[finite]).max()) if diff.size else 0.0
  if scale > 0:
    max_rel = max_abs / scale
  else:
    max_rel = 0.0 if max_abs == 0 else math.inf
  beyond = int(np.count_nonzero(diff > rtol * scale + atol)) + nonfinite_off
  allowed = (int(ISOLATED_FRACTION * ref.size) if dtype in _TOLERANCES
             else 0)
  ok = not nonfinite_off and beyond <= allowed
  return TensorError(name, dtype, ref.shape, max_abs, max_rel, rtol, atol, ok,
                     beyond, int(ref.size))


def _AsNestedMap(out):
  if isinstance(out, NestedMap):
    return out
  if isinstance(out, dict):
    return NestedMap(out)
  return NestedMap(out=out)


def CheckFunction(fn, inputs, mesh_shape, *, name='function', expect=(),
                  rtol=None, atol=None, compare=True, run=None):
  """Partitions `fn` for prod(mesh_shape) devices and checks it.

  Args:
    fn: `fn(inputs) -> NestedMap | dict | tensor` of TF ops with sharding
      annotations (lingshard.sharding). Its annotations must use exactly
      prod(mesh_shape) devices.
    inputs: NestedMap (or dict) of numpy arrays: the program's parameters
      (names appear in the report as 'in:<dotted name>').
    mesh_shape: int, sequence or '2,4'.
    name: shown in the report.
    expect: `--expect` rule strings (see expect.py).
    rtol, atol: override the per-dtype tolerance.
    compare: False = partition and analyse only (no TF reference run, no
      partitioned run; `matches` is None), e.g. for benchmarks.
    run: run the partitioned program (default: `compare`); run=True with
      compare=False fills `outputs` without building the reference (one
      compile), e.g. to compare with another program's outputs.

  Returns:
    CheckResult.
  """
  mesh_shape = MeshShape(mesh_shape)
  num = int(np.prod(mesh_shape))
  rules = expect_lib.ParseRules(expect)
  xla_runtime.CpuDevices(num)  # Fails early if the mesh does not fit.
  inputs = _AsNestedMap(inputs)
  items = inputs.FlattenItems()
  input_names = [k for k, _ in items]
  values = [np.asarray(v) for _, v in items]
  structure = {}

  def Flat(*args):
    out = _AsNestedMap(fn(inputs.Pack(list(args))))
    structure['out'] = out
    return [tf.convert_to_tensor(t) for t in out.Flatten()]

  tensors = [tf.constant(v) for v in values]
  start = time.perf_counter()
  with kinks.Tracking() as traced:
    hlo = _Export(Flat, tensors, num)
  export_seconds = time.perf_counter() - start
  ref = None
  if compare:
    shapes = [tuple(t.shape) for t in structure['out'].Flatten()]
    ref = xla_runtime.CompileSpmd(_ReferenceHlo(Flat, tensors, hlo),
                                  1).Run(values, shapes)
    ref = [np.asarray(r) for r in ref]
  output_names = [k for k, _ in structure['out'].FlattenItems()]
  program_size = ProgramSize(hlo)

  # Constants must enter manual regions like any tensor (see the module).
  hlo = manual_constants.RouteConstantsIntoManualRegions(hlo)
  exe = xla_runtime.CompileSpmd(hlo, num)
  if len(exe.parameter_shardings) != len(values):
    raise RuntimeError(f'the exported program has '
                       f'{len(exe.parameter_shardings)} parameters for '
                       f'{len(values)} inputs')
  run_seconds = 0.0
  errors, got = [], []
  if compare if run is None else run:
    start = time.perf_counter()
    got = exe.Run(values, [tuple(t.shape)
                           for t in structure['out'].Flatten()])
    run_seconds = time.perf_counter() - start
  kink_errors = None
  if compare:
    errors = [Compare(n, r, g, rtol, atol)
              for n, r, g in zip(output_names, ref, got)]
    if traced['kinks'] and not all(e.ok for e in errors):
      kink_errors = _SmoothedKinkErrors(Flat, tensors, num, values, shapes,
                                        output_names, rtol, atol)
  return Result(name, mesh_shape, exe, hlo, input_names, output_names,
                rules, errors if compare else None, export_seconds,
                run_seconds, program_size,
                outputs=dict(zip(output_names, got)),
                kink_errors=kink_errors)


def _Export(flat, tensors, num):
  """The serialized HLO of `flat` traced with its annotations for `num`
  partitions. No autograph (sharding.Function): errors raised while
  tracing (e.g. ShardingError) reach the caller unwrapped."""
  with sharding.SpmdPartitioning(num):
    exported = sharding.Function(flat, xla_compiled=True, jit_compile=True)
    return exported.experimental_get_compiler_ir(*tensors)(
        stage='hlo_serialized')


def _SmoothedKinkErrors(flat, tensors, num, values, shapes, names, rtol,
                        atol):
  """The comparison once more, both programs traced again with relu's
  and max pooling's derivatives smoothed (layers/kinks.py): a
  pre-activation within rounding of 0 (a pooling input within rounding of
  its window's max) then no longer switches a gradient on or off between
  them, while a partitioning error stays."""
  with kinks.Tracking(smooth=True):
    hlo = _Export(flat, tensors, num)
    ref_hlo = _ReferenceHlo(flat, tensors, hlo)
  ref = xla_runtime.CompileSpmd(ref_hlo, 1).Run(values, shapes)
  exe = xla_runtime.CompileSpmd(
      manual_constants.RouteConstantsIntoManualRegions(hlo), num)
  got = exe.Run(values, shapes)
  return [Compare(n, np.asarray(r), g, rtol, atol)
          for n, r, g in zip(names, ref, got)]


def _ReferenceHlo(flat, tensors, hlo):
  """The single-device program: the exported `hlo` without its annotations
  (unsharded.py), or, if it has manual regions, `flat` traced again
  without annotations (manual-partitioning calls are then identities)."""
  try:
    return unsharded.StripShardings(hlo)
  except unsharded.ManualRegionError:
    pass
  with sharding.Unannotated():
    return sharding.Function(
        flat, xla_compiled=True, jit_compile=True
    ).experimental_get_compiler_ir(*tensors)(stage='hlo_serialized')


def Result(name, mesh_shape, exe, hlo, input_names, output_names, rules,
           errors, export_seconds, run_seconds, program_size, outputs=None,
           kink_errors=None):
  """The CheckResult of compiled program `exe` (from exported `hlo`);
  errors None = not compared (matches None); kink_errors: the comparison
  with the kinks smoothed, if one was made (CheckResult)."""
  collectives = report.ParseCollectives(exe.hlo_text, input_names,
                                        output_names)
  cost = exe.CostAnalysis()
  compared = errors is not None
  errors = errors or []
  return CheckResult(
      name=name, mesh_shape=tuple(mesh_shape),
      num_partitions=int(np.prod(mesh_shape)),
      jaxlib_version=xla_runtime.JaxlibVersion(), errors=errors,
      max_abs_error=max([e.max_abs for e in errors], default=0.0),
      max_rel_error=max([e.max_rel for e in errors], default=0.0),
      matches=(all(e.ok for e in errors) or (
          kink_errors is not None and all(e.ok for e in kink_errors))
               if compared else None),
      kink_errors=kink_errors,
      collectives=collectives, flops=cost.get('flops', 0.0),
      transcendentals=cost.get('transcendentals', 0.0),
      bytes_accessed=cost.get('bytes accessed', 0.0),
      memory=exe.MemoryStats(), export_seconds=export_seconds,
      compile_seconds=exe.compile_seconds, run_seconds=run_seconds,
      input_shardings=dict(zip(input_names, exe.parameter_shardings)),
      output_shardings=dict(zip(output_names, exe.output_shardings)),
      hlo_text=exe.hlo_text, exported_hlo=hlo, program_size=program_size,
      partitioned_size=report.InstructionCount(exe.hlo_text),
      expectations=[str(r) for r in rules],
      violations=expect_lib.Check(rules, collectives),
      outputs={n: np.asarray(g) for n, g in (outputs or {}).items()})


def ProgramSize(serialized_hlo):
  """Number of HLO instructions of a serialized HloModuleProto."""
  module = xla_runtime.ParseHloModule(serialized_hlo)
  return sum(len(c.instructions) for c in module.computations)


def _Numpy(t):
  return t.numpy() if hasattr(t, 'numpy') else np.asarray(t)


def _BatchSplit(mesh, batch_axes=0, mesh_axis_names=None):
  """Annotates every batch tensor's dim 0 over the task's batch axes (its
  layers' logical 'batch' axis; mesh axis 0 by default): data parallel."""

  def Split(t):
    if t.shape.rank is None or t.shape.rank == 0:
      return t
    return sharding.mesh_split(t, mesh,
                               [batch_axes] + [-1] * (t.shape.rank - 1),
                               mesh_axis_names)

  return Split


def CheckTask(task, batch, mesh_shape, *, name=None, step=0,
              fprop_kwargs=None, split_batch=True, expect=(), rtol=None,
              atol=None, compare=True):
  """Checks `task.LossAndGradients` on one batch.

  Outputs compared: `loss`, `grads.<weight path>` and `per_example.*`.

  Args:
    task: an instantiated BaseTask; its device_mesh (if any) must have
      prod(mesh_shape) devices.
    batch: NestedMap of numpy arrays / tensors; string leaves are dropped
      (base_input.NumericBatch).
    mesh_shape: as CheckFunction.
    name: for the report (default: the task's path).
    step: the `step` fprop kwarg (int64 scalar constant in the program);
      None passes no step.
    fprop_kwargs: more kwargs for LossAndGradients (constants).
    split_batch: annotate dim 0 of every batch tensor as split over the
      task's `batch_axes` (data parallelism, GShard: inputs split on the
      batch/group dim; mesh axis 0 unless the task says otherwise); False
      leaves the layout to the model's own annotations.
    expect, rtol, atol, compare: as CheckFunction.
  """
  mesh_shape = MeshShape(mesh_shape)
  num = int(np.prod(mesh_shape))
  mesh = task.params.device_mesh
  if mesh is not None and np.size(mesh) != num:
    raise ValueError(f'{task.path}: device_mesh has {np.size(mesh)} devices '
                     f'but the mesh shape {list(mesh_shape)} has {num}')
  if mesh is None:
    mesh = np.arange(num).reshape(mesh_shape)
  tp = task.params
  split = (_BatchSplit(mesh, tp.batch_axes if tp.device_mesh is not None
                       else 0, tp.mesh_axis_names)
           if split_batch else (lambda t: t))
  kwargs = dict(fprop_kwargs or {})

  def Step(inputs):
    kw = {k: _Constant(v) for k, v in kwargs.items()}
    if step is not None:
      kw['step'] = tf.constant(step, tf.int64)
    batch_in = inputs.batch.Transform(split)
    metrics, per_example, grads = task.LossAndGradients(inputs.theta,
                                                        batch_in, **kw)
    return NestedMap(loss=metrics.loss[0], grads=task.ShardTheta(grads),
                     per_example=per_example)

  inputs = NestedMap(theta=task.theta.Transform(_Numpy),
                     batch=base_input.NumericBatch(batch).Transform(_Numpy))
  return CheckFunction(Step, inputs, mesh_shape, name=name or task.path,
                       expect=expect, rtol=rtol, atol=atol,
                       compare=compare)


def _Constant(v):
  """A kwarg value as an in-program constant (numpy dtypes kept)."""
  if isinstance(v, (np.ndarray, np.generic)):
    return tf.constant(v)
  return v


def _WithMesh(params, mesh_shape):
  """A copy of layer/task params with device_mesh of shape mesh_shape."""
  p = params.Copy()
  if p.device_mesh is None or np.shape(p.device_mesh) != tuple(mesh_shape):
    p.device_mesh = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape)
  return p


def FirstBatch(input_generator):
  """The first batch of an input generator's dataset, as numpy arrays."""
  element = next(iter(input_generator.GetDataset().take(1)))
  return _AsNestedMap(element).Transform(_Numpy)


def ModelParams(model_key, mesh_shape, dataset='Train'):
  """The checked model's params on mesh `mesh_shape`, validated by
  config_check (ConfigCheckError) without creating any device: callers
  check them before configuring the virtual devices."""
  params = model_registry.GetParams(model_key, dataset)
  params.task = _WithMesh(params.task, MeshShape(mesh_shape))
  # The partitioned program proves the TPU job: its 'auto' MoE dispatch.
  base_layer.ResolveParams(params.task, platform='tpu')
  config_check.Validate(params)
  return params


def CheckModel(model_key, mesh_shape, *, dataset='Train', step=0,
               split_batch=True, expect=(), rtol=None, atol=None,
               compare=True):
  """Checks a registered model's train step on mesh `mesh_shape`.

  The task params' device_mesh is set to arange(N).reshape(mesh_shape)
  unless it already has that shape (children inherit it). Raises the
  registry's LookupError for an unknown key.
  """
  mesh_shape = MeshShape(mesh_shape)
  params = ModelParams(model_key, mesh_shape, dataset)
  xla_runtime.CpuDevices(int(np.prod(mesh_shape)))
  model = params.Instantiate()
  batch = FirstBatch(model.GetInput())
  return CheckTask(model.task, batch, mesh_shape, name=model_key, step=step,
                   split_batch=split_batch, expect=expect, rtol=rtol,
                   atol=atol, compare=compare)


def CheckLayerParams(layer_params, mesh_shape, inputs, *, fprop_kwargs=None,
                     input_split_dims_mapping=None, grad_outputs=None,
                     name=None, seed=1234, expect=(), rtol=None, atol=None,
                     compare=True):
  """Checks forward + backward of any layer on mesh `mesh_shape`.

  The layer is wrapped in `layer_task.LayerTask` (loss linear in its float
  outputs, fixed random cotangents) and checked like a model.

  Args:
    layer_params: the layer's Params (its device_mesh is set to
      arange(N).reshape(mesh_shape) unless it already has that shape).
    mesh_shape: as CheckFunction.
    inputs: list of numpy arrays, the positional FProp inputs after theta.
    fprop_kwargs: FProp kwargs, made program constants (numpy scalars keep
      their dtype, e.g. `{'step': np.int64(3)}`).
    input_split_dims_mapping: optional list (per input) of split mappings
      annotating the inputs (e.g. [[0, -1, -1], [0, -1]]).
    grad_outputs: names of the outputs the loss differentiates (e.g.
      ['out[0]', 'out[1].aux_loss'] for an MoE layer, leaving its metrics
      out of the backward pass); None = all float outputs.
    name: for the report (default: the layer class name).
    seed: seed of the cotangents.
    expect, rtol, atol, compare: as CheckFunction.

  Returns:
    CheckResult with outputs `loss`, `grads.layer.<weight>` and every layer
    output as `per_example.out...`.
  """
  mesh_shape = MeshShape(mesh_shape)
  xla_runtime.CpuDevices(int(np.prod(mesh_shape)))
  layer_p = _WithMesh(layer_params, mesh_shape)
  task_p = layer_task.LayerTask.Params().Set(
      name='layer_task', layer=layer_p, grad_outputs=grad_outputs,
      input_split_dims_mapping=input_split_dims_mapping)
  task_p.device_mesh = layer_p.device_mesh
  task_p.mesh_axis_names = layer_p.mesh_axis_names
  task = task_p.Instantiate()
  arrays = [np.asarray(x) for x in inputs]
  kwargs = dict(fprop_kwargs or {})
  # One eager forward pass gives the output shapes for the cotangents.
  eager = task.layer.FProp(task.layer.theta, *[tf.constant(a) for a in arrays],
                           **{k: _Constant(v) for k, v in kwargs.items()})
  rng = np.random.RandomState(seed)
  cotangents = [rng.normal(size=t.shape).astype(np.float32)
                for _, t in layer_task.FloatOutputs(eager)]
  batch = NestedMap(inputs=arrays, cotangents=cotangents)
  return CheckTask(task, batch, mesh_shape,
                   name=name or type(task.layer).__name__, step=None,
                   fprop_kwargs=kwargs, split_batch=False, expect=expect,
                   rtol=rtol, atol=atol, compare=compare)
