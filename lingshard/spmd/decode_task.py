"""The SPMD checker's decode mode: a model's real decoding program, sharded.

`CheckDecode(key, mesh_shape)` proves that the partitioned decoding program
of a registered translation model (N virtual CPU devices) gives the same
hypotheses (ids, exactly) and scores (float tolerance) as the single-device
program; `CompileDecode(key)` partitions and compiles it for the config's
own mesh from shapes alone and reports per-device memory.

The program is what `--mode=decode` runs per batch: the task of
`InferenceParams` (dropless one-token MoE routing, no dropout) and its
`Decode(theta, src.ids, src.paddings)`: the encoder once, then the whole
search (greedy, beam or flat beam, `p.decode`) as one XLA while loop over
the incremental decoder and its self-attention cache. Annotations are the
model's own: weights by their split mappings (`task.ShardTheta`: experts
over the expert axis), the source batch over the task's `batch_axes`, the
cache [B, S, N, H] batch-split (attention `cache_bsnh`). The params are
resolved for the TPU (`base_layer.ResolveParams(platform='tpu')`, as the
train check), so an MoE whose experts are split over a mesh decodes with
its `inference_dispatch_impl` as the TPU resolves it (MoEBase.ForPlatform:
'einsum', the all-to-all of GShard §3.2; 'sorted' would all-reduce each
block's gathered expert weights).

Weights are random (the inference task's initialisers): partitioning, not
training, is under test. The batch is the first of the model's Dev (or
Test) input, in its prepared format; compile_only uses its shape alone
(`input.eval_batch_size` x the longest bucket).
"""

import numpy as np
import tensorflow as tf

from lingshard import config_check
from lingshard import sharding
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from lingshard.spmd import compile_only
from lingshard.spmd import xla_runtime


class DecodeCheckError(ValueError):
  """A task or setting the decode check cannot run (one line)."""


def SearchFn(task, beam_size=None, max_decode_len=None):
  """The decoding program of `task` as a pure function of (theta, batch):
  `fn(theta, batch) -> NestedMap(ids [B, L], lengths [B], scores [B], ...)`
  (beam search adds topk_*), the search of `--mode=decode`'s decoder
  (`task.Decode`; beam_size / max_decode_len override `p.decode`). Theta is
  annotated with the weights' layouts; the batch is used as given.

  Raises:
    DecodeCheckError: the task cannot decode (no `Decode`, or not built
      with is_inference).
  """
  if not callable(getattr(task, 'Decode', None)):
    raise DecodeCheckError(
        f'{type(task).__name__} has no decoder (BaseTask.CreateDecoder '
        'returns None); --mode=decode needs a task that decodes, e.g. a '
        'translation model')
  if not task.params.is_inference:
    raise DecodeCheckError(f'{task.path}: decode needs the task of '
                           'InferenceParams (is_inference=True)')

  def Fn(theta, batch):
    return task.Decode(task.ShardTheta(theta), batch.src.ids,
                       batch.src.paddings, beam_size=beam_size,
                       max_decode_len=max_decode_len)

  return Fn


def _DecodeSettings(task, beam_size, max_decode_len):
  d = task.params.decode
  k = d.beam_size if beam_size is None else int(beam_size)
  length = d.max_decode_len if max_decode_len is None else int(max_decode_len)
  if k < 1 or length < 1:
    raise DecodeCheckError(f'beam_size and max_decode_len must be >= 1, got '
                           f'{k} and {length}')
  if k == 1:
    search = 'greedy'
  else:
    search = f'{"flat " if d.flat_beam else ""}beam search k={k}'
  return k, length, f'{search}, at most {length} tokens'


def InferenceParams(model_key, mesh_shape=None, dataset='Dev'):
  """(model params, inference task params) of a registered model for the
  TPU program on `mesh_shape` (None: the config's own mesh), validated by
  config_check (ConfigCheckError) without creating any device."""
  if mesh_shape is None:
    params, _ = compile_only.ConfigParams(model_key, dataset)
  else:
    params = check.ModelParams(model_key, mesh_shape, dataset)
  task_p = params.task
  if not callable(getattr(task_p.cls, 'Decode', None)):
    raise DecodeCheckError(
        f'{model_key}: {task_p.cls.__name__} has no decoder '
        '(BaseTask.CreateDecoder returns None); --mode=decode needs a task '
        'that decodes, e.g. a translation model')
  return params, task_p.cls.InferenceParams(task_p)


def _BatchAxisSize(task):
  """Devices the source batch dim is split over (the task's batch_axes)."""
  p = task.params
  if p.device_mesh is None:
    return 1
  return sharding.AxisSize(p.device_mesh, p.batch_axes, p.mesh_axis_names)


def _CheckBatch(task, rows, where):
  shards = _BatchAxisSize(task)
  if rows % shards:
    raise DecodeCheckError(
        f'{where}: the decode batch of {rows} sentences must be a multiple '
        f'of the {shards} devices its batch dim is split over (set '
        'input.eval_batch_size)')


def _Split(task):
  p = task.params

  def Split(t):
    if p.device_mesh is None or t.shape.rank == 0:
      return t
    return sharding.mesh_split(t, p.device_mesh,
                               [p.batch_axes] + [-1] * (t.shape.rank - 1),
                               p.mesh_axis_names)

  return Split


def _Program(task, k, length):
  search = SearchFn(task, k, length)
  split = _Split(task)

  def Fn(inputs):
    batch = NestedMap(src=inputs.src.Transform(split))
    return search(inputs.theta, batch)

  return Fn


def _Numpy(t):
  return t.numpy() if hasattr(t, 'numpy') else np.asarray(t)


def CheckDecode(model_key, mesh_shape, *, dataset='Dev', beam_size=None,
                max_decode_len=None, expect=(), rtol=None, atol=None,
                output_fn=None):
  """Checks a registered model's decoding program on mesh `mesh_shape`
  against the single-device one, on the first batch of its `dataset`
  input (module docstring). Returns (check.CheckResult, description).

  `output_fn(outputs) -> outputs` (tests) changes the partitioned
  program's outputs after the search, as a partitioning error would.
  """
  mesh_shape = check.MeshShape(mesh_shape)
  params, task_p = InferenceParams(model_key, mesh_shape, dataset)
  xla_runtime.CpuDevices(int(np.prod(mesh_shape)))
  task = task_p.Instantiate()
  k, length, what = _DecodeSettings(task, beam_size, max_decode_len)
  input_generator = params.input.Instantiate()
  batch = check.FirstBatch(input_generator)
  rows, src_len = batch.src.ids.shape
  full = max(int(input_generator.EvalBatchSize()), rows)
  # A short batch (a small split's only one) is decoded as --mode=decode's
  # MtDecoder does: its last row repeated up to the eval batch size.
  src = NestedMap(ids=batch.src.ids, paddings=batch.src.paddings).Transform(
      lambda a: np.concatenate([a, np.repeat(a[-1:], full - rows, 0)]))
  _CheckBatch(task, full, f'{model_key} {dataset}')
  program = _Program(task, k, length)
  if output_fn is not None:
    def Perturbed(inputs):
      return output_fn(program(inputs))
    fn = Perturbed
  else:
    fn = program
  inputs = NestedMap(theta=task.theta.Transform(_Numpy), src=src)
  name = f'{model_key} decode'
  result = check.CheckFunction(fn, inputs, mesh_shape, name=name,
                               expect=expect, rtol=rtol, atol=atol)
  copies = (f' (+ {full - rows} copies of its last, as --mode=decode pads '
            'a short batch)' if full > rows else '')
  return result, (f'decode: {what}; {dataset} batch of {rows} sentences'
                  f'{copies} x {src_len} source tokens')


def DecodeBatchSpec(input_generator):
  """The source batch a decoding program reads: [eval batch, the longest
  bucket] ids and paddings (shapes only)."""
  p = input_generator.params
  rows = int(input_generator.EvalBatchSize())
  length = int(p.bucket_upper_bounds[-1])
  return NestedMap(src=NestedMap(ids=tf.TensorSpec([rows, length], tf.int32),
                                 paddings=tf.TensorSpec([rows, length],
                                                        tf.float32)))


def CompileDecode(model_key, *, dataset='Dev', beam_size=None,
                  max_decode_len=None, expect=()):
  """A registered config's decoding program on its own mesh, partitioned
  and compiled from specs (nothing allocated, nothing run). Returns
  (check.CheckResult not run, description). Raises as CompileModel, and
  DecodeCheckError."""
  params, task_p = InferenceParams(model_key, None, dataset)
  num = int(np.size(task_p.device_mesh))
  xla_runtime.CpuDevices(num)
  try:
    task = task_p.Instantiate()
  except ValueError as e:  # A layer's own check of its params (one line).
    raise config_check.ConfigCheckError(str(e).splitlines()[0]) from None
  k, length, what = _DecodeSettings(task, beam_size, max_decode_len)
  spec = DecodeBatchSpec(params.input.Instantiate())
  rows, src_len = spec.src.ids.shape
  _CheckBatch(task, rows, f'{model_key} {dataset}')
  args = NestedMap(theta=compile_only.Specs(task.DeclaredWeights()),
                   src=spec.src)
  result = compile_only.CompileFunction(
      _Program(task, k, length), args, num, name=f'{model_key} decode',
      expect=expect, mesh_shape=np.shape(task_p.device_mesh))
  return result, (f'decode: {what}; {dataset} batch of {rows} sentences x '
                  f'{src_len} source tokens (shapes only)')
