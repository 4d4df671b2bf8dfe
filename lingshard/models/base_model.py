"""`BaseTask` (a layer with a loss) and `SingleTaskModel` (task + input)."""

import numpy as np
import tensorflow as tf

from lingshard import hyperparams
from lingshard.layers import base_layer
from lingshard.optim import adafactor
from lingshard.optim import adam


def TrainParams():
  """Training hyper-parameters every task carries (used by the trainer).

  Read by lingshard/train: the optimizer and schedule (lingshard/optim),
  clipping, and the loop's checkpoint / summary / eval cadence.
  """
  p = hyperparams.Params()
  p.Define('optimizer', 'adam', 'sgd | adam | adafactor.')
  p.Define('learning_rate', 1e-3, 'Peak learning rate (Adafactor: the '
           'relative step size rho).')
  p.Define('lr_schedule', 'constant',
           'constant | rsqrt (linear warmup, then rsqrt decay) | rsqrt_decay '
           '(lr / sqrt(max(step, warmup_steps)), GShard).')
  p.Define('warmup_steps', 0, 'Warmup / decay-start steps of the schedule.')
  p.Define('clip_gradient_norm_to_value', 0.0,
           'Clip gradients to this global norm; 0 disables.')
  p.Define('adam', adam.Adam.Params(), 'Adam settings (optimizer=adam).')
  p.Define('adafactor', adafactor.Adafactor.Params(),
           'Adafactor settings (optimizer=adafactor).')
  p.Define('max_steps', 1000, 'Default number of training steps.')
  p.Define('save_interval_steps', 100, 'Checkpoint every N steps; 0 off.')
  p.Define('save_interval_secs', 0.0,
           'Also checkpoint when this many seconds passed since the last '
           'save; 0 off.')
  p.Define('max_checkpoints_to_keep', 5, 'Keep the K most recent.')
  p.Define('init_from_checkpoint_rules', {},
           'Lingvo\'s rules, applied when the logdir has no checkpoint: '
           '{checkpoint: ([(target regex, source %-format), ...], [ignore '
           'regex, ...])}; checkpoint = a prefix, a logdir, or \'\' = '
           '--init_from_checkpoint. Expert weights [E, ...] also load a '
           'dense [...] (sparse upcycling) or [E1, ...] (E a multiple of '
           'E1): lingshard/train/init_rules.py.')
  p.Define('init_from_checkpoint_require_all', False,
           'init_from_checkpoint_rules must load every weight or name it '
           'in an ignore rule.')
  p.Define('checkpoint_data_iterator', True,
           'Save the tf.data iterator in checkpoints (exact resume). If '
           'False, a resumed run skips `step` batches of a fresh iterator.')
  p.Define('summary_interval_steps', 10, 'Write summaries every N steps.')
  p.Define('log_interval_steps', 10, 'Print a progress line every N steps.')
  p.Define('eval_interval_steps', 500,
           'train_and_eval: evaluate on Dev every N steps (and at the end).')
  p.Define('eval_num_batches', 0,
           'Dev batches per evaluation; 0 = the whole (finite) dev set.')
  return p


class BaseTask(base_layer.BaseLayer):
  """A layer that maps a batch to metrics, one of which is `loss`.

  Subclasses implement `ComputePredictions(theta, batch)` and
  `ComputeLoss(theta, predictions, batch)`, which returns
  `(metrics, per_example)`: metrics is a NestedMap of name -> (value,
  weight) scalars and must contain `loss`. `loss` is a mean over its
  weight (`LossWeight`: target tokens or examples) plus, optionally, the
  metric `aux_loss`: a part of `loss` that is not such a mean (GShard's
  aux loss is a mean over groups). Across replicas the step averages the
  first part weighted by tokens and `aux_loss` with equal weight per
  replica, so n replicas of a global batch train like one device.

  The trainer's other modes use three hooks: `InferenceParams` (the task
  of eval, decode and export), `CreateDecoder` (decode) and
  `CreateExportModule` (export); a task without a decoder or an export
  module cannot be decoded or exported.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('train', TrainParams(), 'Training hyper-parameters.')
    return p

  @classmethod
  def InferenceParams(cls, task_params):
    """A copy of `task_params` for eval, decode and export: here with
    is_inference=True. The task these params build runs on the training
    task's theta."""
    return task_params.Copy().Set(is_inference=True)

  def CreateDecoder(self, input_generator, train_input_generator=None):
    """The decoder of --mode=decode (a train/decode_loop.BaseDecoder) on
    `input_generator`, or None: this task cannot decode."""
    del input_generator, train_input_generator
    return None

  def CreateExportModule(self, theta, input_generator):
    """The tf.Module --mode=export saves (with `Signatures()`, see
    train/export.py) for weights `theta` and the training input, or None:
    this task cannot be exported."""
    del theta, input_generator
    return None

  def TokenIdsKey(self, layer_name):
    """The batch key ('src', 'tgt', 'ids', ...) of the token ids the layer
    `layer_name` (its path below the task) sees one per position, or None
    when this task does not say (tools/expert_usage.py)."""
    del layer_name
    return None

  def ComputePredictions(self, theta, input_batch, **kwargs):
    raise NotImplementedError(f'{type(self).__name__}.ComputePredictions')

  def ComputeLoss(self, theta, predictions, input_batch):
    raise NotImplementedError(f'{type(self).__name__}.ComputeLoss')

  def FProp(self, theta, input_batch, **kwargs):
    """Returns (metrics, per_example) for one batch.

    kwargs go to ComputePredictions: `step` (dropout and routing
    randomness) and `example_offset` (global index of the batch's first
    example: the trainer passes replica id x per-replica batch, so MoE
    routing keyed by global token is the same on any number of replicas).
    """
    predictions = self.ComputePredictions(theta, input_batch, **kwargs)
    metrics, per_example = self.ComputeLoss(theta, predictions, input_batch)
    if 'loss' not in metrics:
      raise KeyError(f'{type(self).__name__}.ComputeLoss must return a '
                     '"loss" metric')
    return metrics, per_example

  def LossWeight(self, input_batch):
    """The weight ComputeLoss gives `loss` (loss[1]) on `input_batch`, from
    the batch alone, so the step can sum it over replicas before the
    gradients: non-padding target tokens (`tgt.paddings`, else `paddings`),
    else the number of examples. Override with ComputeLoss."""
    tgt = input_batch.get('tgt', input_batch)
    if 'paddings' in tgt:
      return tf.reduce_sum(1.0 - tf.cast(tgt.paddings, tf.float32))
    return tf.cast(tf.shape(input_batch.Flatten()[0])[0], tf.float32)

  def LossAndGradients(self, theta, input_batch, objective=None,
                       **fprop_kwargs):
    """The pure step math: (metrics, per_example, grads) for explicit theta.

    `theta` may hold tensors (function arguments) or variables; the weights
    are sharding-annotated first so their layout reaches XLA. The trainer,
    the SPMD checker and export all call this; nothing else builds the
    model's math. `objective(metrics)` -> the scalar to differentiate
    (default `metrics.loss[0]`; the step passes a replica's share of the
    global loss).
    """
    leaves = theta.Flatten()
    with tf.GradientTape() as tape:
      tape.watch(leaves)
      metrics, per_example = self.FProp(self.ShardTheta(theta), input_batch,
                                        **fprop_kwargs)
      target = metrics.loss[0] if objective is None else objective(metrics)
    grads = tape.gradient(target, leaves,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    # Gathers (embeddings) give IndexedSlices; optimizers and the SPMD
    # checker take dense tensors.
    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
             for g in grads]
    return metrics, per_example, theta.Pack(grads)


class SingleTaskModel:
  """A task layer plus the input params it trains on."""

  @classmethod
  def Params(cls):
    p = hyperparams.InstantiableParams(cls)
    p.Define('task', None, 'Params of the task (a BaseTask).')
    p.Define('input', None, 'Params of the input generator.')
    return p

  def __init__(self, params):
    if params.task is None:
      raise ValueError('SingleTaskModel needs params.task')
    self.params = params.Copy().Freeze()
    self.task = params.task.Instantiate()

  def GetInput(self, input_context=None):
    """Instantiates the input generator from `params.input`; with a
    tf.distribute.InputContext, this input pipeline's share
    (`ParamsForHost`: its own examples, global batch / pipelines)."""
    p = self.params.input
    if p is None:
      raise ValueError('model params have no input set')
    if input_context is not None:
      p = p.cls.ParamsForHost(p, input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    return p.Instantiate()


def PipelineAxes(pp, params, batch_axis):
  """Pipeline params `pp` of a task on `params.device_mesh`, their unset
  mesh axes filled: the stage axis the mesh's last, the micro-batches'
  data axis `batch_axis`."""
  if params.device_mesh is not None:
    if pp.stage_mesh_axis is None:
      pp.stage_mesh_axis = int(np.ndim(params.device_mesh)) - 1
    if pp.batch_mesh_axis is None:
      pp.batch_mesh_axis = batch_axis
  return pp


def StageMesh(params):
  """A pipelined task's 1-D mesh [K] as [1, K] (a data axis of 1): the
  translation and image tasks build their layers from it.

  Every layer splits the batch over mesh axis 0 (the data axis); on a
  stages-only mesh that axis must not be the stage axis, or each micro-batch
  would have to be gathered from all stages.
  """
  if (params.pipeline_tpl is None or params.device_mesh is None or
      np.ndim(params.device_mesh) != 1):
    return params
  params = params.Copy()
  params.device_mesh = np.reshape(params.device_mesh, [1, -1])
  if params.mesh_axis_names is not None:
    names = list(params.mesh_axis_names)
    params.mesh_axis_names = [('replica' if 'data' in names else 'data')
                              ] + names
  return params
