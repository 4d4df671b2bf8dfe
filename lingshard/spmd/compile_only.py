"""A model's real train step, partitioned and compiled from shapes alone.

`CompileModel(key)` checks a registered config before a pod is booked: it
builds the config's train step (TrainStep.Pure: forward, backward, the
optimizer update, the finiteness guard) from `tf.TensorSpec`s of its weights,
optimizer slots and one training bucket's batch (`BatchSpec`), so no weight
or example is ever allocated or read; XLA's SPMD partitioner (GShard §3.3)
partitions it for the config's own device mesh (e.g. 128 or 2,048 virtual
CPU devices) and the CPU backend compiles it. The result is a
check.CheckResult that was not run (`matches` None): per-device argument,
temp and output memory by XLA's accounting, FLOPs and every collective.
"""

import time

import numpy as np
import tensorflow as tf

from lingshard import config_check
from lingshard import model_registry
from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from lingshard.spmd import expect as expect_lib
from lingshard.spmd import manual_constants
from lingshard.spmd import xla_runtime
from lingshard.train import step as step_lib


def Specs(tree):
  """A NestedMap of tf.TensorSpec like `tree` (tensors or WeightParams)."""
  return tree.Transform(lambda w: tf.TensorSpec(w.shape, w.dtype))


def TrainStepArgs(task, batch_spec):
  """(train_step, NestedMap of the step's argument specs: theta,
  opt_state, batch, step)."""
  train_step = step_lib.TrainStep(task)
  theta = Specs(task.DeclaredWeights())
  init = sharding.Function(train_step.InitOptState, xla_compiled=False)
  opt_out = init.get_concrete_function(theta).structured_outputs
  opt_state = tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype), opt_out)
  return train_step, NestedMap(theta=theta, opt_state=opt_state,
                               batch=batch_spec,
                               step=tf.TensorSpec([], tf.int64))


def CompileTrainStep(task, batch_spec, num_devices, *, name=None,
                     expect=(), mesh_shape=None):
  """Partitions + compiles `task`'s train step for `num_devices` from
  specs; returns a check.CheckResult (not run) reporting `mesh_shape`
  (default [num_devices])."""
  train_step, args = TrainStepArgs(task, batch_spec)

  def Step(a):
    theta, opt_state, metrics = train_step.Pure(a.theta, a.opt_state,
                                                a.batch, a.step)
    return NestedMap(theta=theta, opt_state=opt_state, metrics=metrics)

  return CompileFunction(Step, args, num_devices, name=name or task.path,
                         expect=expect, mesh_shape=mesh_shape)


def CompileFunction(fn, args, num_devices, *, name, expect=(),
                    mesh_shape=None):
  """Partitions + compiles `fn(args) -> NestedMap` for `num_devices` from
  `args`, a NestedMap of tf.TensorSpec; returns a check.CheckResult (not
  run) reporting `mesh_shape` (default [num_devices])."""
  rules = expect_lib.ParseRules(expect)
  items = args.FlattenItems()
  structure = {}

  def Flat(*leaves):  # The compiler IR API takes a flat list of specs.
    out = fn(args.Pack(list(leaves)))
    structure['out'] = out
    return out.Flatten()

  start = time.perf_counter()
  with sharding.SpmdPartitioning(num_devices):
    traced = sharding.Function(Flat, xla_compiled=True, jit_compile=True)
    hlo = traced.experimental_get_compiler_ir(*[v for _, v in items])(
        stage='hlo_serialized')
  export_seconds = time.perf_counter() - start
  program_size = check.ProgramSize(hlo)
  hlo = manual_constants.RouteConstantsIntoManualRegions(hlo)
  exe = xla_runtime.CompileSpmd(hlo, num_devices)
  output_names = [k for k, _ in structure['out'].FlattenItems()]
  return check.Result(name, mesh_shape or [num_devices], exe,
                      hlo, [k for k, _ in items], output_names, rules, None,
                      export_seconds, 0.0, program_size)


def ConfigParams(model_key, dataset='Train'):
  """(params, task built without variables) of a registered config for
  the TPU program on its own mesh, validated by config_check
  (ConfigCheckError) without creating any device; a config without a mesh
  is a ConfigCheckError."""
  params = model_registry.GetParams(model_key, dataset)
  base_layer.ResolveParams(params.task, platform='tpu')  # The TPU program.
  if params.task.device_mesh is None:
    raise config_check.ConfigCheckError(
        f'{model_key}: task.device_mesh is None; compile_only compiles a '
        'config for its own mesh')
  return params, config_check.Validate(params)


def CompileModel(model_key, *, dataset='Train', bucket=-1, expect=()):
  """A registered config's train step on its own device mesh, compiled
  from specs (module docstring). Raises the registry's LookupError, the
  config check's error, base_input.InputError for an input that cannot
  describe its batch, DeviceCountError when the virtual CPU devices are
  not the mesh's (xla_runtime.ConfigureCpuDevices first)."""
  params, task = ConfigParams(model_key, dataset)
  mesh = params.task.device_mesh
  num = int(np.size(mesh))
  xla_runtime.CpuDevices(num)
  batch_spec = params.input.Instantiate().BatchSpec(bucket)
  return CompileTrainStep(task, batch_spec, num, name=model_key,
                          expect=expect, mesh_shape=np.shape(mesh))
