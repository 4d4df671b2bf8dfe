"""The training loop: state, the compiled step, checkpoints, summaries.

One iteration (`Trainer.Step`) drops the batch's string leaves
(base_input.NumericBatch: an XLA-compiled step cannot take strings), then
runs one tf.function (`Trainer.run_step`): split the batch over replicas, run the
pure `TrainStep.Replica` per replica, assign theta' and the optimizer state
to the variables, and count the update if it was finite. Then, on the host (one
read per step of [is_finite, examples, tokens]): stop on a non-finite step
(`NonFiniteError`; the step left the variables unchanged and the last good
checkpoint is kept), write summaries / the progress line / a checkpoint when
due, and evaluate when an evaluation hook is given.

Resume: the data order is part of the checkpoint (the tf.data iterator's
state) or, with `checkpoint_data_iterator=False`, a resumed run skips
`step` batches of a fresh iterator; either way batch k of a resumed run is
batch k of an uninterrupted one, and (seed, step) fix the randomness, so a
resumed run ends with the same bits as an uninterrupted one.
"""

import math
import os
import time

from absl import logging
import tensorflow as tf

from lingshard import base_input
from lingshard import sharding
from lingshard.train import checkpointer as checkpointer_lib
from lingshard.train import init_rules
from lingshard.train import state as state_lib
from lingshard.train import step as step_lib
from lingshard.train import strategies
from lingshard.train import summaries

NON_FINITE_EXIT_CODE = 3


class NonFiniteError(RuntimeError):
  """A step's loss, gradients or updated weights/slots were NaN or Inf."""

  def __init__(self, step, loss, grad_norm, checkpoint, learning_rate=None):
    self.step = step
    self.checkpoint = checkpoint
    kept = (f'the last good checkpoint is {checkpoint}' if checkpoint else
            'no checkpoint was saved yet')
    if math.isfinite(loss) and math.isfinite(grad_norm):
      what = 'the updated weights or optimizer slots'
      values = (f'loss={loss}, grad_norm={grad_norm}, '
                f'learning_rate={learning_rate}')
    else:
      what = 'loss or gradients'
      values = f'loss={loss}, grad_norm={grad_norm}'
    super().__init__(
        f'NaN/Inf in {what} at step {step} ({values}); the update was not '
        f'applied and training stopped; {kept}')


class Trainer:
  """Trains one SingleTaskModel params.

  Args:
    model_params: SingleTaskModel params (task + train input).
    logdir: checkpoints and summaries go to `<logdir>/train`.
    strategy / info: from strategies.CreateStrategy (default: one device).
    init_from_checkpoint: warm start theta from this checkpoint (a prefix,
      or a run's logdir: its latest) when the logdir has none of its own;
      with task.train.init_from_checkpoint_rules, the checkpoint of the
      rules keyed '' (train/init_rules.py).
    printer: where progress lines go.
    inject_nan_at_step: testing only (see step.TrainStep).
  """

  def __init__(self, model_params, logdir, strategy=None, info=None,
               init_from_checkpoint=None, printer=print,
               inject_nan_at_step=None):
    self._strategy = strategy or tf.distribute.get_strategy()
    self._info = info or strategies.StrategyInfo(kind='default')
    self._printer = printer
    self._init_from = init_from_checkpoint
    self.params = model_params
    tp = model_params.task.train
    self.train_params = tp
    self.train_dir = os.path.join(logdir, 'train')
    with self._strategy.scope():
      self.model = model_params.Instantiate()
      self.task = self.model.task
      self.train_step = step_lib.TrainStep(
          self.task, jit=self._info.jit_step,
          inject_nan_at_step=inject_nan_at_step)
      self.state = state_lib.TrainState(self.task, self.train_step)
    # This worker's input pipeline: its own examples (InputContext).
    self._dataset = self.model.GetInput(strategies.InputContext(
        self._strategy, self._info)).GetDataset()
    self._iterator = iter(self._dataset)
    self.checkpointer = checkpointer_lib.Checkpointer(
        self.train_dir, self.state,
        iterator=self._iterator if tp.checkpoint_data_iterator else None,
        max_to_keep=tp.max_checkpoints_to_keep,
        save_interval_steps=tp.save_interval_steps,
        save_interval_secs=tp.save_interval_secs,
        is_chief=self._info.is_chief, worker_id=self._info.worker_id)
    # Refuse bad rules (or a missing --init_from_checkpoint they need)
    # before anything is written.
    self._init_rules = init_rules.Rules(
        tp.init_from_checkpoint_rules, tp.init_from_checkpoint_require_all,
        init_from_checkpoint)
    if self._init_rules and self.checkpointer.LatestPath() is None:
      self._init_rules.CheckFlag()
    self._writer = None  # Created after a successful Restore.
    # One tf.function per step. XLA compiles all of it on the default
    # strategy; across replicas only the step's halves (jit_halves).
    program = self._info.program
    self._jit_halves = program.jit_halves
    # Annotated when XLA compiles the step (--jit, TPU); a graph TF runs op
    # by op is traced without sharding ops (sharding.Function).
    self.run_step = sharding.Function(
        self._RunStep, xla_compiled=program.xla_compiled,
        jit_compile=program.jit_whole)

  # ------------------------------------------------------------ the step
  def Step(self, batch):
    """Runs one step on `batch` (an input batch, string leaves and all).

    The string leaves are dropped before the tf.function: an XLA-compiled
    step (--jit) cannot take a string argument.
    """
    return self.run_step(base_input.NumericBatch(batch))

  def _RunStep(self, batch):
    """Runs one step on the variables; returns replica 0's metrics."""
    strategy = self._strategy
    state = self.state

    def Replica(local_batch):
      theta, opt_state = state.Values()
      return self.train_step.Replica(theta, opt_state, local_batch,
                                     state.step.read_value(),
                                     jit_halves=self._jit_halves)

    new_theta, new_opt, metrics = strategy.run(
        Replica, args=(strategies.DistributeBatch(
            strategy, batch, self._info.num_input_pipelines),))
    state.Assign(new_theta, new_opt)
    metrics = strategy.experimental_local_results(metrics)[0]
    state.step.assign_add(tf.cast(metrics.is_finite[0] > 0, tf.int64))
    return metrics

  # ------------------------------------------------------------- the loop
  def Restore(self):
    """Resumes from the logdir's latest checkpoint, else initialises from
    init_from_checkpoint_rules or warm-starts (--init_from_checkpoint) or
    keeps the initial values. Returns the step to continue from."""
    step, data_restored = self.checkpointer.Restore()
    if step is None:
      if self._init_rules:
        self._init_rules.Apply(self.state.ThetaByPath(),
                               init_rules.ExpertWeights(self.task))
      elif self._init_from:
        self.checkpointer.WarmStart(init_rules.ResolveCheckpoint(
            self._init_from, '--init_from_checkpoint'))
      return 0
    if not data_restored and step:
      # No iterator state saved: the order is reproduced by skipping.
      logging.warning('Checkpoint has no data iterator state; skipping %d '
                      'batches of a fresh iterator.', step)
      self._iterator = iter(self._dataset.skip(step))
    return step

  def Train(self, max_steps=None, eval_hook=None, max_seconds=0.0,
            on_start=None):
    """Trains to `max_steps` (default: task.train.max_steps).

    `on_start()` runs once the run has restored its checkpoint (or started
    fresh), before anything is written (the trainer writes params.txt
    there): a run that cannot resume leaves its logdir as it was.
    `eval_hook(step)` runs every `eval_interval_steps` and at the end.
    `max_seconds` > 0 also stops (with a checkpoint) at the first step that
    ends past that many seconds of this call: a time budget for demos. Each
    worker measures its own time, so do not use it with multi_worker.
    Returns the last step's metrics as numpy. Raises NonFiniteError,
    checkpointer.CheckpointError, and ValueError for a negative max_steps.
    """
    tp = self.train_params
    max_steps = tp.max_steps if max_steps is None else max_steps
    if max_steps < 0:
      raise ValueError(f'max_steps is {max_steps}; it must be >= 0 (set '
                       'task.train.max_steps or --max_steps)')
    start = time.time()
    step = self.Restore()
    if on_start is not None:
      on_start()
    if self._writer is None:
      # Only now: a logdir whose checkpoints cannot be read is left as is.
      self._writer = summaries.SummaryWriter(self.train_dir,
                                             enabled=self._info.is_chief)
    meter = summaries.Throughput(step)
    metrics_np = {}
    if step >= max_steps:
      self._printer(f'step {step} >= max_steps {max_steps}: nothing to train')
    while step < max_steps:
      metrics = self.Step(next(self._iterator))
      finite, examples, tokens = (float(x) for x in tf.stack([
          metrics.is_finite[0], metrics.num_examples[0],
          metrics.num_tokens[0]]).numpy())
      if not finite:
        m = summaries.MetricsToNumpy(metrics)
        raise NonFiniteError(step + 1, float(m['loss'][0]),
                             float(m['grad_norm'][0]),
                             self.checkpointer.LatestPath(),
                             float(m['learning_rate'][0]))
      step += 1
      meter.Add(examples, tokens)
      out_of_time = bool(max_seconds) and time.time() - start >= max_seconds
      last = step == max_steps or out_of_time
      log_due = last or (tp.log_interval_steps and
                         step % tp.log_interval_steps == 0)
      summary_due = last or (tp.summary_interval_steps and
                             step % tp.summary_interval_steps == 0)
      if log_due or summary_due:
        metrics_np = summaries.MetricsToNumpy(metrics)
        rates = meter.Rates(step)
        if summary_due:
          self._writer.Write(step, metrics_np, {
              'steps_per_sec': rates['steps_per_sec'],
              'examples_per_sec': rates['examples_per_sec'],
              'tokens_per_sec': rates['tokens_per_sec']})
        if log_due:
          left = (max_seconds - (time.time() - start)
                  if max_seconds else None)
          self._printer(summaries.ProgressLine(
              step, max_steps, float(metrics_np['loss'][0]), rates,
              seconds_left=left))
      self.checkpointer.MaybeSave(step)
      if eval_hook and tp.eval_interval_steps and (
          step % tp.eval_interval_steps == 0) and not last:
        eval_hook(step)
      if out_of_time:
        self._printer(f'time budget of {max_seconds:g}s reached at step {step}')
        break
    self.checkpointer.Save(step)
    self._writer.Flush()
    if eval_hook:
      eval_hook(step)
    return metrics_np

  def ThetaValues(self):
    """The current theta as tensors (for eval / export)."""
    return self.state.theta.Transform(lambda v: v.read_value())
