"""`BaseTask` (a layer with a loss) and `SingleTaskModel` (task + input)."""

from lingshard import hyperparams
from lingshard.layers import base_layer


def TrainParams():
  """Training hyper-parameters every task carries (used by the trainer)."""
  p = hyperparams.Params()
  p.Define('optimizer', 'adam', 'sgd | adam | adafactor.')
  p.Define('learning_rate', 1e-3, 'Peak learning rate.')
  p.Define('lr_schedule', 'constant',
           'constant | rsqrt (linear warmup, then rsqrt decay).')
  p.Define('warmup_steps', 0, 'Warmup / decay-start steps of the schedule.')
  p.Define('clip_gradient_norm_to_value', 0.0,
           'Clip gradients to this global norm; 0 disables.')
  p.Define('max_steps', 1000, 'Default number of training steps.')
  p.Define('save_interval_steps', 100, 'Checkpoint every N steps.')
  p.Define('summary_interval_steps', 10, 'Write summaries every N steps.')
  return p


class BaseTask(base_layer.BaseLayer):
  """A layer that maps a batch to metrics, one of which is `loss`.

  Subclasses implement `ComputePredictions(theta, batch)` and
  `ComputeLoss(theta, predictions, batch)`, which returns
  `(metrics, per_example)`: metrics is a NestedMap of name -> (value,
  weight) scalars and must contain `loss`.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('train', TrainParams(), 'Training hyper-parameters.')
    return p

  def ComputePredictions(self, theta, input_batch, **kwargs):
    raise NotImplementedError(f'{type(self).__name__}.ComputePredictions')

  def ComputeLoss(self, theta, predictions, input_batch):
    raise NotImplementedError(f'{type(self).__name__}.ComputeLoss')

  def FProp(self, theta, input_batch, **kwargs):
    """Returns (metrics, per_example) for one batch.

    kwargs (e.g. `step` for routing randomness) go to ComputePredictions.
    """
    predictions = self.ComputePredictions(theta, input_batch, **kwargs)
    metrics, per_example = self.ComputeLoss(theta, predictions, input_batch)
    if 'loss' not in metrics:
      raise KeyError(f'{type(self).__name__}.ComputeLoss must return a '
                     '"loss" metric')
    return metrics, per_example

  def LossAndGradients(self, theta, input_batch, **fprop_kwargs):
    """The pure step math: (metrics, per_example, grads) for explicit theta.

    `theta` may hold tensors (function arguments) or variables; the weights
    are sharding-annotated first so their layout reaches XLA. The trainer,
    the SPMD checker and export all call this; nothing else builds the
    model's math.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    leaves = theta.Flatten()
    with tf.GradientTape() as tape:
      tape.watch(leaves)
      metrics, per_example = self.FProp(self.ShardTheta(theta), input_batch,
                                        **fprop_kwargs)
    grads = tape.gradient(metrics.loss[0], leaves,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
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

  def GetInput(self):
    """Instantiates the input generator from `params.input`."""
    if self.params.input is None:
      raise ValueError('model params have no input set')
    return self.params.input.Instantiate()
