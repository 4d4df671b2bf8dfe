"""The lingshard trainer binary (Lingvo's `trainer.py`).

  python -m lingshard.trainer --model=toy.FFRegression --logdir=/tmp/run \
      --mode=train [--params_override="task.train.learning_rate=0.1"]

Modes:
  train           train to task.train.max_steps (resumes from the logdir)
  eval            loss / perplexity per language of the latest checkpoint on
                  --eval_dataset (Dev) -> logdir/eval_dev/
  decode          the task's decoder (BaseTask.CreateDecoder; translation:
                  beam search, BLEU / chrF per language)
                  -> logdir/decode_<split>/; with --decode_input=<glob>
                  --decode_output=<dir>: a batch job, one <dir>/<shard>
                  .hyp.txt per input shard, resumable by shard
  train_and_eval  train, evaluating every task.train.eval_interval_steps
  export          SavedModel of the task's export module
                  (BaseTask.CreateExportModule; translation: a `translate`
                  signature) -> logdir/export/<step>
  print_params    print the params text after overrides, each param
                  after its description (a `#` comment), and exit
Training, eval and decode run under --strategy and the model's mesh (eval
and decode print which); export on the host's default device.

Params: the registry's SingleTaskModel params (`task.*`, `input.*`), then
--params_file, --params_override, --max_steps, --seed, in that order; what
they changed is printed and the result written to logdir/params.txt once
the run has restored its checkpoint (or started fresh).

A training run holds logdir/trainer.lock (train/logdir_lock.py): a second
trainer on the same logdir is refused, naming the holder; eval, decode and
export may run beside it.

Exit codes: 0 ok; 1 a usage, configuration or data error (one line on
stderr: a flag out of range, a logdir under a file, a logdir held by
another trainer, an unreadable params file, missing corpus or vocabulary
files, a failed write; bad flags and data are found before anything is
written);
3 NaN/Inf in the loss or gradients (the message names the step and the last
good checkpoint, which is kept).
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import contextlib
import functools
import os
import signal
import sys
import uuid

from absl import app
from absl import flags
import tensorflow as tf

from lingshard import base_input
from lingshard import config_check
from lingshard import hyperparams
from lingshard import model_registry
from lingshard import platform as platform_lib
from lingshard.layers import base_layer
from lingshard.layers import pipeline
from lingshard.train import atomic
from lingshard.train import checkpointer
from lingshard.train import decode_loop
from lingshard.train import eval_loop
from lingshard.train import export
from lingshard.train import logdir_lock
from lingshard.train import overrides
from lingshard.train import state as state_lib
from lingshard.train import strategies
from lingshard.train import summaries
from lingshard.train import train_loop

MODES = ('train', 'eval', 'decode', 'train_and_eval', 'export',
         'print_params')


def DefineFlags(fv):
  """Defines the trainer's flags on FlagValues `fv`."""
  flags.DEFINE_string('model', None, 'Registered model key, e.g. '
                      'toy.FFRegression (see --list_models).', flag_values=fv)
  flags.DEFINE_bool('list_models', False,
                    'Print every registered model with its description.',
                    flag_values=fv)
  flags.DEFINE_string('logdir', None, 'Checkpoints, summaries, params.txt, '
                      'decodes and exports (local path or gs://).',
                      flag_values=fv)
  flags.DEFINE_enum('mode', 'train', MODES, 'What to do.', flag_values=fv)
  flags.DEFINE_string('params_override', '',
                      '"a.b=1;c.d=\'x\'": params assignments, ; separated.',
                      flag_values=fv)
  flags.DEFINE_string('params_file', None, 'A params text file (key : value '
                      'lines, e.g. a params.txt) applied before overrides.',
                      flag_values=fv)
  flags.DEFINE_integer('max_steps', None, 'Sets task.train.max_steps.',
                       flag_values=fv)
  flags.DEFINE_integer('seed', None, 'Sets task.random_seed (initialisation '
                       'and routing randomness) and the TF global seed.',
                       flag_values=fv)
  flags.DEFINE_enum('strategy', 'default', strategies.STRATEGIES,
                    'Distribution strategy.', flag_values=fv)
  flags.DEFINE_string('tpu', None, 'TPU name, or "local" on a TPU VM.',
                      flag_values=fv)
  flags.DEFINE_bool('jit', None, 'XLA-compile the step (default: on for tpu, '
                    'off otherwise).', flag_values=fv)
  flags.DEFINE_string('init_from_checkpoint', None, 'Warm start the weights '
                      'from this checkpoint (a prefix, or a run\'s logdir: '
                      'its latest) when the logdir has none; with '
                      'task.train.init_from_checkpoint_rules, the checkpoint '
                      'of the rules keyed \'\' (e.g. m4.TinyMoEUpcycled: '
                      'the dense run).', flag_values=fv)
  flags.DEFINE_integer('num_cpu_devices', 1, 'Split the host CPU into N '
                       'logical devices (MirroredStrategy on CPU).',
                       flag_values=fv)
  flags.DEFINE_enum('eval_dataset', 'Dev', model_registry.DATASETS,
                    'Dataset of eval, decode and train_and_eval.',
                    flag_values=fv)
  flags.DEFINE_string('export_dir', None,
                      'Export destination (default logdir/export/<step>).',
                      flag_values=fv)
  flags.DEFINE_bool('export_overwrite', False, 'Let export replace a '
                    'non-empty --export_dir that is not a lingshard export.',
                    flag_values=fv)
  flags.DEFINE_float('max_train_seconds', 0.0, 'Also stop training (with a '
                     'checkpoint) after this many seconds; 0 = no limit. Not '
                     'with multi_worker (workers would disagree).',
                     flag_values=fv)
  flags.DEFINE_string('eval_params_override', '', 'Overrides applied after '
                      '--params_override to the eval / decode dataset only, '
                      'e.g. input.file_pattern=data/ui_m4/dev_unseen_en.noph'
                      '.tsv.', flag_values=fv)
  flags.DEFINE_string('decode_input', None, '--mode=decode: a glob of input '
                      'shards in the eval input\'s format (translation: '
                      'lang<TAB>source<TAB>target TSV files, the target '
                      'unused); each is decoded into --decode_output.',
                      flag_values=fv)
  flags.DEFINE_string('decode_output', None, '--mode=decode with '
                      '--decode_input: directory of one <shard>.hyp.txt per '
                      'shard (a hypothesis per row); a rerun skips shards '
                      'whose output is complete.', flag_values=fv)
  flags.DEFINE_integer('test_inject_nan_at_step', None, 'Testing only: make '
                       'the loss of this step NaN.', flag_values=fv)


class ConfigError(ValueError):
  """A usage or configuration error: printed, exit code 1."""


def Printer(text):
  print(text, flush=True)


# ------------------------------------------------------------------ params
def BuildParams(cfg, dataset='Train', for_eval=False):
  """(params, diff text) of the model for `dataset` after all overrides
  (`for_eval`: also --eval_params_override)."""
  try:
    base = model_registry.GetParams(cfg.model, dataset)
  except LookupError as e:
    raise ConfigError(str(e)) from None
  params = base.Copy()
  if cfg.params_file:
    overrides.ApplyParamsFile(params, cfg.params_file, _ReadText)
  overrides.ApplyOverrides(params, cfg.params_override)
  # 'auto' MoE dispatch -> the platform's measured-fastest equal one.
  base_layer.ResolveParams(params.task,
                           platform=platform_lib.Platform(cfg.strategy))
  if for_eval:
    overrides.ApplyOverrides(params, cfg.eval_params_override,
                             '--eval_params_override')
  if cfg.max_steps is not None:
    params.task.train.max_steps = cfg.max_steps
  if cfg.seed is not None:
    params.task.random_seed = cfg.seed
  return params, hyperparams.TextDiff(base, params)


def _ReadText(path):
  """The text of a --params_file; OverrideError (one line) if it cannot be
  read or is not UTF-8 text."""
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      data = f.read()
  except tf.errors.OpError as e:
    why = e.message.split(f'{path}; ', 1)[-1]  # TF may prefix the path.
    raise overrides.OverrideError(f'--params_file {path}: {why}') from None
  nul = data.find(b'\0')
  try:
    text = data.decode('utf-8')
    offset = nul if nul >= 0 else None
  except UnicodeDecodeError as e:
    offset = min(e.start, nul) if nul >= 0 else e.start
  if offset is None:
    return text
  raise overrides.OverrideError(
      f'--params_file {path}: not a text file (binary data at byte '
      f'{offset}); pass a params text file of "key : value" lines, e.g. a '
      'logdir\'s params.txt')


def ListModels(printer):
  keys = model_registry.ListModels()
  width = max((len(k) for k in keys), default=0)
  for key in keys:
    printer(f'{key:<{width}}  {model_registry.Describe(key)}')


# ------------------------------------------------------------------- modes
def RestoredTheta(params, logdir, strategy=None):
  """(theta variables, step) of logdir's latest checkpoint; the variables
  of `strategy` (its scope), as training creates them."""
  with (strategy or tf.distribute.get_strategy()).scope():
    state = state_lib.TrainState(params.task.Instantiate())
  ckpt = checkpointer.Checkpointer(os.path.join(logdir, 'train'), state,
                                   include_optimizer=False)
  step, _ = ckpt.Restore()
  if step is None:
    raise ConfigError(f'no checkpoint in {os.path.join(logdir, "train")}; '
                      'train first')
  return state.theta, step


def InferenceTask(params):
  """The task of eval/decode/export: built from the task class's
  `InferenceParams(task_params)`. Theta is the training task's."""
  task_p = params.task
  return task_p.cls.InferenceParams(task_p).Instantiate()


def _Evaluator(cfg, dataset, replicated=None):
  """The Evaluator of `dataset` (under `replicated`: strategies.Replicated).
  A throwaway instance of its input builds the dataset first, so that
  missing data raises base_input.InputError before anything is written."""
  params, _ = BuildParams(cfg, dataset, for_eval=True)
  params.input.Instantiate().GetDataset()
  return eval_loop.Evaluator(InferenceTask(params), params.input.Instantiate(),
                             params.task.train.eval_num_batches, replicated)


def _Replicated(cfg, params, mode, printer):
  """The training job's strategy and mesh (strategies.CreateStrategy: the
  same errors), for eval / decode; prints which."""
  strategy, info = strategies.CreateStrategy(
      cfg.strategy, cfg.tpu, params.task.device_mesh, cfg.jit,
      params.task.mesh_axis_names)
  replicated = strategies.Replicated(strategy, info)
  printer(f'{mode} under {replicated.Describe()}')
  return replicated


def _EvalHook(cfg, dataset, evaluator, theta_fn, printer):
  """Runs one evaluation; writes summaries, metrics-<step>.json, a line
  (the output directory is created by the first evaluation)."""
  out_dir = os.path.join(cfg.logdir, f'eval_{dataset.lower()}')
  writers = []

  def Hook(step):
    result = evaluator.Evaluate(theta_fn(), step)
    try:
      if not writers:
        writers.append(summaries.SummaryWriter(out_dir))
      writer = writers[0]
      writer.Write(step, {}, eval_loop.Scalars(result))
      writer.Flush()
      eval_loop.WriteJson(out_dir, result)
    except atomic.ERRORS as e:
      raise ConfigError(f'--logdir {cfg.logdir}: cannot write {out_dir}: '
                        f'{atomic.Reason(e)}; free space or choose another '
                        '--logdir') from None
    metrics = ' '.join(f'{k} {v:.6f}' for k, v in result['metrics'].items())
    printer(f'eval {dataset} step {step}: {metrics}')
    return result

  return Hook


def _WriteParamsText(logdir, params):
  """Writes logdir/params.txt (a temporary sibling renamed into place);
  ConfigError (one line) if it cannot: the previous file is kept."""
  path = os.path.join(logdir, 'params.txt')
  tmp = f'{path}.tmp{uuid.uuid4().hex}'
  try:
    tf.io.gfile.makedirs(logdir)
    with tf.io.gfile.GFile(tmp, 'w') as f:
      f.write(params.ToText())
    tf.io.gfile.rename(tmp, path, overwrite=True)
  except tf.errors.OpError as e:
    with contextlib.suppress(tf.errors.OpError):
      tf.io.gfile.remove(tmp)
    why = e.message.rsplit('; ', 1)[-1]  # TF may prefix the path.
    raise ConfigError(f'--logdir {logdir}: cannot write {path}: {why}; fix '
                      'that (e.g. free space) or choose another --logdir'
                      ) from None


def RunTrain(cfg, params, strategy, info, printer, with_eval=False):
  """Takes the logdir's lock (the chief; logdir_lock: one trainer per
  logdir), builds the trainer (and evaluator), which reads the inputs, and
  trains. params.txt is written (chief) once the run has restored its
  checkpoint or started fresh: bad data, a held logdir or a checkpoint that
  does not restore leave the logdir as it was."""
  lock = (logdir_lock.Hold(cfg.logdir) if info.is_chief else
          contextlib.nullcontext())
  try:
    with lock:
      trainer = train_loop.Trainer(
          params, cfg.logdir, strategy=strategy, info=info,
          init_from_checkpoint=cfg.init_from_checkpoint, printer=printer,
          inject_nan_at_step=cfg.test_inject_nan_at_step)
      hook = None
      if with_eval:
        hook = _EvalHook(cfg, cfg.eval_dataset, _Evaluator(
            cfg, cfg.eval_dataset, strategies.Replicated(strategy, info)),
                         lambda: trainer.state.theta, printer)
      on_start = (functools.partial(_WriteParamsText, cfg.logdir, params)
                  if info.is_chief else None)
      return trainer.Train(eval_hook=hook, max_seconds=cfg.max_train_seconds,
                           on_start=on_start)
  except logdir_lock.LockError as e:
    raise ConfigError(str(e)) from None


def RunEval(cfg, params, printer):
  replicated = _Replicated(cfg, params, 'eval', printer)
  theta, step = RestoredTheta(params, cfg.logdir, replicated.strategy)
  hook = _EvalHook(cfg, cfg.eval_dataset,
                   _Evaluator(cfg, cfg.eval_dataset, replicated),
                   lambda: theta, printer)
  return hook(step)


def RunDecode(cfg, params, printer):
  """Decodes --eval_dataset with the task's decoder; prints its report and
  returns its scores. With --decode_input: the batch decode job
  (RunDecodeShards)."""
  if cfg.decode_input:
    return RunDecodeShards(cfg, params, printer)
  dev, _ = BuildParams(cfg, cfg.eval_dataset, for_eval=True)
  task = InferenceTask(dev)
  input_generator = dev.input.Instantiate()
  replicated = _Replicated(cfg, params, 'decode', printer)  # Reads no data.
  decoder = task.CreateDecoder(input_generator, params.input.Instantiate())
  if decoder is None:
    raise ConfigError(f'--mode=decode: {type(task).__name__} has no decoder '
                      '(BaseTask.CreateDecoder returns None); use a task that '
                      'defines one, e.g. a translation model')
  decoder.Place(replicated)
  theta, step = RestoredTheta(params, cfg.logdir, replicated.strategy)
  records = decode_loop.DecodeDataset(
      decoder, theta, input_generator.GetDataset(),
      dev.task.train.eval_num_batches)
  out_dir = os.path.join(
      cfg.logdir, f'decode_{input_generator.SplitName(cfg.eval_dataset)}')
  try:
    scores, report = decoder.Finalize(records, out_dir, step)
  except atomic.ERRORS as e:
    raise ConfigError(f'--logdir {cfg.logdir}: cannot write {out_dir}: '
                      f'{atomic.Reason(e)}; it was left as it was: free space '
                      'or choose another --logdir') from None
  printer(report)
  return scores


def CheckDecodeFlags(cfg):
  """ConfigError (one line) for --decode_input / --decode_output misused."""
  if not (cfg.decode_input or cfg.decode_output):
    return
  if cfg.mode != 'decode':
    raise ConfigError(f'--decode_input / --decode_output are for '
                      f'--mode=decode, not --mode={cfg.mode}')
  if not (cfg.decode_input and cfg.decode_output):
    raise ConfigError('--decode_input and --decode_output go together: set '
                      'both (input shards, output directory)')


def RunDecodeShards(cfg, params, printer, share=None):
  """The batch decode job: each --decode_input shard of this worker's share
  (`share`: (index, workers), default the input pipelines of the run's
  StrategyInfo, multi_worker: TF_CONFIG's) is decoded with the latest
  checkpoint into --decode_output/<shard>.hyp.txt unless that file is
  complete (decode_loop.DecodeShards), under the training job's strategy
  and mesh (as RunDecode). Every shard is read and checked before the
  output directory is made; the checkpoint is restored when a shard needs
  decoding. Returns (decoded, skipped) input paths."""
  inputs = sorted(p for p in tf.io.gfile.glob(cfg.decode_input)
                  if not tf.io.gfile.isdir(p))
  if not inputs:
    raise ConfigError(f'--decode_input {cfg.decode_input}: no file matches')
  dev, _ = BuildParams(cfg, cfg.eval_dataset, for_eval=True)
  if 'file_pattern' not in dev.input:
    raise ConfigError(f'--decode_input: the input of {cfg.model} '
                      f'({dev.input.cls.__name__}) reads no files')
  out_dir = decode_loop.OutputDir(cfg.decode_output)
  replicated = _Replicated(cfg, params, 'decode', printer)  # Reads no data.
  worker, workers = share or (replicated.info.input_pipeline_id,
                              replicated.info.num_input_pipelines)
  try:
    pairs = decode_loop.WorkerShards(
        decode_loop.ShardOutputs(inputs, out_dir), worker, workers)
  except decode_loop.ShardError as e:
    raise ConfigError(str(e)) from None

  def Input(path):
    return dev.input.Copy().Set(file_pattern=path).Instantiate()

  def NumRows(path):
    try:
      return sum(Input(path).LanguageCounts().values())
    except base_input.InputError as e:
      raise ConfigError(f'--decode_input: {e}') from None

  rows = [NumRows(path) for path, _ in pairs]  # Each shard read and checked.
  loaded = []  # [(decoder, theta)], made for the first shard to decode.

  def Decode(path):
    if not loaded:
      task = InferenceTask(dev)
      decoder = task.CreateDecoder(Input(path))
      if decoder is None:
        raise ConfigError(f'--mode=decode: {type(task).__name__} has no '
                          'decoder (BaseTask.CreateDecoder returns None)')
      decoder.Place(replicated)
      theta, _ = RestoredTheta(params, cfg.logdir, replicated.strategy)
      loaded.append((decoder, theta))
    decoder, theta = loaded[0]
    return decoder.HypothesisLines(decode_loop.DecodeDataset(
        decoder, theta, Input(path).GetDataset()))

  try:
    decode_loop.MakeOutputDir(cfg.decode_output, out_dir)
    decoded, skipped = decode_loop.DecodeShards(pairs, rows, Decode, printer)
  except decode_loop.ShardError as e:
    raise ConfigError(str(e)) from None
  printer(f'worker {worker} of {workers}: {len(decoded)} shard(s) decoded, '
          f'{len(skipped)} complete, of {len(inputs)} matching '
          f'{cfg.decode_input}')
  return decoded, skipped


def RunExport(cfg, params, printer):
  """Saves the task's export module for the latest checkpoint."""
  try:  # Refuse a bad --export_dir before restoring and tracing.
    if cfg.export_dir:
      export.CheckExportDir(cfg.export_dir, cfg.export_overwrite, cfg.logdir)
  except export.ExportDirError as e:
    raise ConfigError(str(e)) from None
  theta, step = RestoredTheta(params, cfg.logdir)
  task = InferenceTask(params)
  module = task.CreateExportModule(theta, params.input.Instantiate())
  if module is None:
    raise ConfigError(f'--mode=export: {type(task).__name__} has no export '
                      'module (BaseTask.CreateExportModule returns None); use '
                      'a task that defines one, e.g. a translation model')
  out = cfg.export_dir or export.DefaultExportDir(cfg.logdir, step)
  try:
    out = export.Export(
        module, out, overwrite=cfg.export_overwrite, logdir=cfg.logdir,
        metadata={'model': cfg.model, 'step': int(step)})
  except export.ExportDirError as e:
    raise ConfigError(str(e)) from None
  printer(f'exported step {step} to {out}')
  return out


def CheckFlags(cfg):
  """ConfigError (one line) for numeric flags out of range."""
  if cfg.max_steps is not None and cfg.max_steps < 1:
    raise ConfigError(f'--max_steps={cfg.max_steps}: must be >= 1 (the step '
                      'to train to)')
  if cfg.max_train_seconds < 0:
    raise ConfigError(f'--max_train_seconds={cfg.max_train_seconds:g}: must '
                      'be >= 0 (0 = no limit)')
  if cfg.num_cpu_devices < 1:
    raise ConfigError(f'--num_cpu_devices={cfg.num_cpu_devices}: must be '
                      '>= 1')
  if cfg.num_cpu_devices > strategies.MAX_CPU_DEVICES:
    raise ConfigError(
        f'--num_cpu_devices={cfg.num_cpu_devices}: must be <= '
        f'{strategies.MAX_CPU_DEVICES} (each logical CPU device costs host '
        'memory and threads; data-parallel CPU runs need a handful)')


def CheckLogdir(logdir):
  """ConfigError (one line) if a local --logdir or its train/ is, or lies
  under, a file."""
  if '://' in logdir:
    return
  path = os.path.normpath(os.path.join(logdir, 'train'))
  while path and not os.path.exists(path):
    parent = os.path.dirname(path)
    path = '' if parent == path else parent
  if path and not os.path.isdir(path):
    raise ConfigError(f'--logdir {logdir}: {path} is a file, not a '
                      'directory; choose another --logdir')


def _CheckTrainSteps(params):
  """ConfigError if task.train.max_steps (e.g. from --params_override) < 1."""
  train = params.task.train if 'train' in params.task else None
  if train is None or 'max_steps' not in train:
    return
  max_steps = train.max_steps
  if isinstance(max_steps, int) and max_steps < 1:
    raise ConfigError(f'task.train.max_steps is {max_steps}; it must be >= 1 '
                      '(the step to train to)')


def Execute(cfg, printer=Printer):
  """Runs the trainer for parsed flags `cfg`; raises ConfigError."""
  if cfg.list_models:
    ListModels(printer)
    return None
  if not cfg.model:
    raise ConfigError('--model is required (see --list_models)')
  CheckFlags(cfg)
  CheckDecodeFlags(cfg)
  params, diff = BuildParams(cfg)
  # Values that no job can make valid, in every mode, before anything.
  config_check.CheckValues(params)
  if cfg.mode in ('eval', 'decode', 'train_and_eval'):
    config_check.CheckValues(BuildParams(cfg, cfg.eval_dataset, True)[0])
  training = cfg.mode in ('train', 'train_and_eval')
  if not training:  # Training checks once it knows its replicas.
    task = config_check.Validate(params)
  if cfg.mode == 'print_params':
    printer(params.ToText(docs=True).rstrip('\n'))
    stages = config_check.StageShapeLines(task)
    if stages:  # Derived at build time: not params.
      printer('\n'.join(['# pipeline stages (derived):'] + stages))
    return params
  if diff:
    printer('Params changed from the registry defaults:\n' + diff.rstrip('\n'))
  if not cfg.logdir:
    raise ConfigError(f'--logdir is required for --mode={cfg.mode}')
  CheckLogdir(cfg.logdir)
  if not training and (cfg.mode == 'export' or cfg.strategy != 'tpu'):
    config_check.CheckHostMemory(task)  # Restored on this host (as train).
  strategies.ConfigureCpuDevices(cfg.num_cpu_devices)
  tf.random.set_seed(cfg.seed if cfg.seed is not None else 1234)
  if training:
    _CheckTrainSteps(params)
    strategy, info = strategies.CreateStrategy(
        cfg.strategy, cfg.tpu, params.task.device_mesh, cfg.jit,
        params.task.mesh_axis_names)
    program = info.program
    # Mirrored / multi-worker replicas are single devices (no partitioned
    # mesh); default and TPU runs hold to the mesh the pod job will use.
    task = config_check.Validate(params, program.num_replicas,
                                 info.num_input_pipelines, spmd=program.spmd)
    if program.strategy != 'tpu':  # TPU weights live on the slice.
      config_check.CheckHostMemory(task)
    printer(f'strategy {program.strategy}: {program.num_replicas} '
            f'replica(s), jit {"on" if program.jit_compile else "off"}')
    return RunTrain(cfg, params, strategy, info, printer,
                    with_eval=cfg.mode == 'train_and_eval')
  if cfg.mode == 'eval':
    return RunEval(cfg, params, printer)
  if cfg.mode == 'decode':
    return RunDecode(cfg, params, printer)
  return RunExport(cfg, params, printer)


INTERRUPTED = ('interrupted; every checkpoint the state file names is whole: '
               'rerun the same command to resume from the latest')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    Execute(flags.FLAGS)
  except train_loop.NonFiniteError as e:
    print(f'lingshard.trainer: {e}', file=sys.stderr, flush=True)
    sys.exit(train_loop.NON_FINITE_EXIT_CODE)
  except (ConfigError, overrides.OverrideError, strategies.StrategyError,
          checkpointer.CheckpointError, base_input.InputError,
          pipeline.PipelineError, config_check.ConfigCheckError) as e:
    print(f'lingshard.trainer: error: {e}', file=sys.stderr, flush=True)
    sys.exit(1)
  except KeyboardInterrupt:  # Ctrl-C: one line, then die by SIGINT as usual.
    print(f'lingshard.trainer: {INTERRUPTED}', file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def RunFromCommandLine():
  """Console entry point."""
  DefineFlags(flags.FLAGS)
  app.run(main)


if __name__ == '__main__':
  RunFromCommandLine()
