"""Prove a model's sharding annotations on N virtual CPU devices.

  python -m lingshard.tools.spmd_check --model=toy.FFRegression --mesh=8
  python -m lingshard.tools.spmd_check --model=m4.TinyMoE --mesh=2,4 \\
      --expect=only:all-to-all,all-reduce --expect='no-all-gather:wi|wo'
  python -m lingshard.tools.spmd_check --model=m4.MoE128E12L --compile_only
  python -m lingshard.tools.spmd_check --model=m4.TinyMoE --mode=decode \\
      --mesh=8 --max_decode_len=8 --expect='no-all-gather:wi|wo'

Builds the model's XLA-compiled train step (loss and gradients), partitions
it with XLA's SPMD partitioner for prod(mesh) devices, runs it on that many
virtual host CPU devices, compares with the single-device TF run and prints
the report (parity, collectives, per-device FLOPs and memory, compile
time). `--compile_only` checks a paper-scale config before a pod is booked:
its real train step (with the optimizer update) on its own mesh (e.g. 128
devices), from shapes alone (spmd/compile_only.py): partitioned and
compiled, not run; the report gives per-device memory and collectives.
`--mode=decode` does the same for the model's decoding program (the
task's search over its incremental decoder as one XLA while loop, on the
first batch of its Dev input, random weights; spmd/decode_task.py): the
partitioned program must give the single-device one's hypotheses exactly
and its scores within tolerance; with `--compile_only`, that program on
the config's own mesh from shapes alone.
Exit status 1 on a mismatch or a failed --expect rule; bad input
(unknown model or --mode, a task that cannot decode, a mesh the devices
cannot hold or of more than 4096 devices, a config that does not fit the
mesh, jaxlib missing, the model's data not prepared) prints one line and exits 1, before any virtual device
is created when it can. See lingshard/spmd/expect.py for the rule syntax.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import sys

from absl import app
from absl import flags

from lingshard import cli

# Private flag values: tools can be imported together without clashes.
FLAGS = flags.FlagValues()
flags.DEFINE_string('model', None,
                    'Registered model key, e.g. toy.FFRegression.', flag_values=FLAGS)
flags.DEFINE_string('mesh', '8', 'Device mesh shape, comma separated (2,4).', flag_values=FLAGS)
flags.DEFINE_multi_string('expect', [], 'Communication rule (repeatable), '
                          'e.g. only:all-to-all,all-reduce or '
                          'no-all-gather:wi|wo.', flag_values=FLAGS)
flags.DEFINE_string('mode', 'train', 'train: the train step (loss and '
                    'gradients) | decode: the decoding program.',
                    flag_values=FLAGS)
flags.DEFINE_string('dataset', None, 'Train | Dev | Test input params '
                    '(default: Train; --mode=decode: Dev).', flag_values=FLAGS)
flags.DEFINE_integer('beam_size', None, '--mode=decode: beam size (1 = '
                     "greedy; default: the task's decode.beam_size).",
                     flag_values=FLAGS)
flags.DEFINE_integer('max_decode_len', None, '--mode=decode: most target '
                     "tokens (default: the task's decode.max_decode_len).",
                     flag_values=FLAGS)
flags.DEFINE_integer('step', 0, 'Value of the `step` fprop kwarg.', flag_values=FLAGS)
flags.DEFINE_bool('split_batch', True, 'Split dim 0 of every batch tensor '
                  'over mesh axis 0 (data parallel inputs).', flag_values=FLAGS)
flags.DEFINE_float('rtol', None, 'Override the per-dtype relative tolerance.', flag_values=FLAGS)
flags.DEFINE_bool('print_hlo', False, 'Also print the partitioned HLO.', flag_values=FLAGS)
flags.DEFINE_bool('compile_only', False, 'Partition and compile the train '
                  "step on the config's own mesh from shapes (no data, "
                  'nothing run); --mesh is not used.', flag_values=FLAGS)
flags.DEFINE_integer('bucket', -1, 'compile_only: the training bucket whose '
                     'batch shape is compiled (-1 = the longest).',
                     flag_values=FLAGS)


def CheckAndPrint(model_key, mesh, expect=(), dataset='Train', step=0,
                  split_batch=True, rtol=None, print_hlo=False,
                  printer=print):
  """Configures the devices, checks the model, prints; returns the result."""
  # Imported here so that --help and flag errors need neither TF nor jax.
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard.spmd import check
  from lingshard.spmd import expect as expect_lib
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  mesh_shape = check.MeshShape(mesh)  # Bounded: xla_runtime.DEVICE_LIMIT.
  expect_lib.ParseRules(expect)  # Bad rules fail before any compiling.
  # The config fits the mesh before its devices exist (they cost memory).
  check.ModelParams(model_key, mesh_shape, dataset)
  xla_runtime.ConfigureCpuDevices(int(np.prod(mesh_shape)))
  result = check.CheckModel(model_key, mesh_shape, dataset=dataset,
                            step=step, split_batch=split_batch,
                            expect=expect, rtol=rtol)
  if print_hlo:
    printer(result.hlo_text)
  printer(result.Report())
  return result


def RunCompileOnly(model_key, expect=(), dataset='Train', bucket=-1,
                   print_hlo=False, printer=print):
  """--compile_only: configures the config's device count, compiles."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard import model_registry
  from lingshard.spmd import compile_only
  from lingshard.spmd import expect as expect_lib
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  expect_lib.ParseRules(expect)
  mesh = model_registry.GetParams(model_key, dataset).task.device_mesh
  xla_runtime.ConfigureCpuDevices(max(int(np.size(mesh)), 1))
  result = compile_only.CompileModel(model_key, dataset=dataset,
                                     bucket=bucket, expect=expect)
  if print_hlo:
    printer(result.hlo_text)
  printer(result.Report())
  return result


MODES = ('train', 'decode')


def DecodeAndPrint(model_key, mesh, expect=(), dataset='Dev', beam_size=None,
                   max_decode_len=None, rtol=None, print_hlo=False,
                   compile_only=False, printer=print):
  """--mode=decode: configures the devices (the mesh's, or with
  compile_only the config's own), checks or compiles the model's decoding
  program, prints; returns the result."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard.spmd import check
  from lingshard.spmd import decode_task
  from lingshard.spmd import expect as expect_lib
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  expect_lib.ParseRules(expect)
  if compile_only:
    _, task_p = decode_task.InferenceParams(model_key, None, dataset)
    xla_runtime.ConfigureCpuDevices(int(np.size(task_p.device_mesh)))
    result, what = decode_task.CompileDecode(
        model_key, dataset=dataset, beam_size=beam_size,
        max_decode_len=max_decode_len, expect=expect)
  else:
    mesh_shape = check.MeshShape(mesh)
    decode_task.InferenceParams(model_key, mesh_shape, dataset)
    xla_runtime.ConfigureCpuDevices(int(np.prod(mesh_shape)))
    result, what = decode_task.CheckDecode(
        model_key, mesh_shape, dataset=dataset, beam_size=beam_size,
        max_decode_len=max_decode_len, expect=expect, rtol=rtol)
  if print_hlo:
    printer(result.hlo_text)
  printer(what)
  printer(result.Report())
  return result


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not FLAGS.model:
    raise app.UsageError('--model is required (a registered model key)')
  # pylint: disable=g-import-not-at-top
  from lingshard import base_input
  from lingshard import config_check
  from lingshard.layers import pipeline
  from lingshard.spmd import check
  from lingshard.spmd import expect as expect_lib
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  if FLAGS.mode not in MODES:
    sys.exit(f'spmd_check: error: --mode must be one of {", ".join(MODES)}, '
             f'got {FLAGS.mode!r}')
  # pylint: disable=g-import-not-at-top
  from lingshard.spmd import decode_task
  # pylint: enable=g-import-not-at-top
  try:
    expect_lib.ParseRules(FLAGS.expect)
    if FLAGS.mode == 'decode':
      result = DecodeAndPrint(FLAGS.model, FLAGS.mesh, FLAGS.expect,
                              FLAGS.dataset or 'Dev', FLAGS.beam_size,
                              FLAGS.max_decode_len, FLAGS.rtol,
                              FLAGS.print_hlo, FLAGS.compile_only)
    elif FLAGS.compile_only:
      result = RunCompileOnly(FLAGS.model, FLAGS.expect,
                              FLAGS.dataset or 'Train', FLAGS.bucket,
                              FLAGS.print_hlo)
    else:
      check.MeshShape(FLAGS.mesh)
      result = CheckAndPrint(FLAGS.model, FLAGS.mesh, FLAGS.expect,
                             FLAGS.dataset or 'Train', FLAGS.step, FLAGS.split_batch,
                             FLAGS.rtol, FLAGS.print_hlo)
  except (LookupError, xla_runtime.JaxlibUnavailableError,
          xla_runtime.DeviceCountError, expect_lib.ExpectRuleError,
          check.MeshShapeError, base_input.InputError,
          pipeline.PipelineError, config_check.ConfigCheckError,
          decode_task.DecodeCheckError) as e:
    sys.exit(f'spmd_check: error: {e}')
  sys.exit(0 if result.ok else 1)


if __name__ == '__main__':
  cli.RunMain(main, FLAGS)
