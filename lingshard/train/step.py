"""The training step: a pure function

    TrainStep(theta, opt_state, batch, step) -> (theta', opt_state', metrics)

of NestedMaps of tensors and the int64 number of updates done before this
one. It calls `task.LossAndGradients` (THE step math), sums the
replicas' shares of the global loss when there are several, clips by global norm, applies the optimizer
with the scheduled learning rate (weights with a `count_update_rate`
take their own `update_rule` instead, base_layer.WeightParams), and refuses the update (returns the inputs)
when the loss, the gradients, the new weights or the new optimizer slots are
not finite. Nothing in it reads or writes variables, so the same function is
compiled whole by XLA (`jit=True`) on one device, run per replica under
MirroredStrategy, and partitioned by SPMD on TPU. `TrainStep.__call__`
compiles it alone; the training loop calls the uncompiled
`TrainStep.Replica` inside its own single tf.function.

`metrics` holds the task's metrics as (value, weight) pairs plus
`learning_rate`, `grad_norm` (before clipping), `is_finite` (1.0 when the
update was applied, 0.0 when it was refused), `num_examples` and
`num_tokens` (non-padding target tokens, 0 if the batch has no
`tgt.paddings`), summed over replicas.
"""

import tensorflow as tf

from lingshard import base_input
from lingshard import sharding
from lingshard.nested_map import NestedMap
from lingshard.optim import base as optim_base
from lingshard.optim import schedules

RESERVED_METRICS = ('learning_rate', 'grad_norm', 'is_finite', 'num_examples',
                    'num_tokens')
OPTIMIZERS = ('sgd', 'adam', 'adafactor')


def CreateOptimizer(train_params):
  """The optimizer named by `train_params.optimizer`, with its settings."""
  name = train_params.optimizer
  if name == 'sgd':
    return optim_base.Sgd.Params().Instantiate()
  if name == 'adam':
    return train_params.adam.Instantiate()
  if name == 'adafactor':
    return train_params.adafactor.Instantiate()
  raise ValueError(f'Unknown optimizer {name!r}; one of {", ".join(OPTIMIZERS)}')


class TrainStep:
  """The pure step of a task (see the module docstring).

  Args:
    task: a BaseTask; its `params.train` gives optimizer, schedule, clipping.
    jit: XLA-compile the step (`tf.function(jit_compile=True)`). With several
      replicas (`Replica(..., jit_halves=True)`) the loss/gradient half and
      the update half are XLA clusters of their own, with the cross-replica
      sum between them.
    inject_nan_at_step: testing only: the loss of update number k (1-based)
      is made NaN, to exercise the non-finite guard.
  """

  def __init__(self, task, jit=False, inject_nan_at_step=None):
    self.task = task
    tp = task.params.train
    self.train_params = tp
    self.optimizer = CreateOptimizer(tp)
    schedules.LearningRate(tp.lr_schedule, tp.learning_rate, tp.warmup_steps,
                           0)  # Validates the schedule name now.
    self.inject_nan_at_step = inject_nan_at_step
    # Per theta leaf: None, or the rate of a weight updated by its own
    # rule from its gradient slot (e.g. the MoE selection bias's counts,
    # layers/moe/bias_balance.py), not by the optimizer.
    declared = task.DeclaredWeights().Flatten()
    self.count_update_rates = [wp.count_update_rate for wp in declared]
    self._update_rules = [wp.update_rule for wp in declared]
    for rate, rule in zip(self.count_update_rates, self._update_rules):
      if rate is not None and rule is None:
        raise ValueError('a weight with count_update_rate needs an '
                         'update_rule (base_layer.WeightParams)')
    # No autograph (sharding.Function): a configuration error raised while
    # tracing (e.g. pipeline.PipelineError) reaches the trainer as itself.
    self._compiled = sharding.Function(self.Pure, xla_compiled=jit,
                                       jit_compile=jit)
    self._jit_grads = sharding.Function(self.LossAndGrads, xla_compiled=True,
                                        jit_compile=True)
    self._jit_update = sharding.Function(self.Update, xla_compiled=True,
                                         jit_compile=True)

  def InitOptState(self, theta):
    """Initial optimizer state for theta (tensors shaped like the slots)."""
    return self.optimizer.InitState(theta)

  def __call__(self, theta, opt_state, batch, step):
    """The step compiled as one tf.function, on one replica (string leaves
    of `batch` dropped by base_input.NumericBatch)."""
    return self._compiled(theta, opt_state, base_input.NumericBatch(batch),
                          step)

  def Replica(self, theta, opt_state, batch, step, jit_halves=False):
    """The uncompiled step of one replica, for use inside the caller's
    tf.function (`batch` already numeric). `jit_halves`: compile the
    loss/gradient and update halves as XLA clusters (several replicas
    cannot share one XLA program)."""
    total_weight = _GlobalLossWeight(self.task, batch)
    if not jit_halves:
      return self.Pure(theta, opt_state, batch, step, total_weight)
    metrics, grads = self._jit_grads(theta, batch, step, total_weight)
    metrics, grads = CrossReplicaSum(metrics, grads)
    return self._jit_update(theta, opt_state, grads, metrics, step)

  def Pure(self, theta, opt_state, batch, step, total_weight=None):
    """The uncompiled step (what `__call__` compiles)."""
    metrics, grads = self.LossAndGrads(theta, batch, step, total_weight)
    metrics, grads = CrossReplicaSum(metrics, grads)
    return self.Update(theta, opt_state, grads, metrics, step)

  def LossAndGrads(self, theta, batch, step, total_weight=None):
    """Task metrics (float32, plus example/token counts) and gradients.

    With several replicas (`total_weight`: the loss weights summed over
    them) the gradients and `loss` are this replica's share of the global
    loss (`ReplicaObjective`); CrossReplicaSum adds the shares up.
    """
    step = tf.cast(step, tf.int64)
    objective = None
    if total_weight is not None:
      num_replicas = tf.distribute.get_replica_context().num_replicas_in_sync
      def objective(m):
        return ReplicaObjective(m, total_weight, num_replicas)
    metrics, _, grads = self.task.LossAndGradients(
        theta, batch, objective=objective, step=step,
        example_offset=ExampleOffset(batch))
    out = NestedMap()
    for name, (value, weight) in metrics.items():
      if name in RESERVED_METRICS:
        raise ValueError(f'task metric {name!r} clashes with a trainer metric '
                         f'({", ".join(RESERVED_METRICS)})')
      out[name] = (tf.cast(value, tf.float32), tf.cast(weight, tf.float32))
    if objective is not None:
      out.loss = (tf.cast(objective(metrics), tf.float32), out.loss[1])
    if self.inject_nan_at_step is not None:
      bad = tf.equal(step + 1, self.inject_nan_at_step)
      loss, weight = out.loss
      out.loss = (tf.where(bad, tf.constant(float('nan')), loss), weight)
    num_examples, num_tokens = CountBatch(batch)
    out.num_examples = (num_examples, tf.constant(1.0))
    out.num_tokens = (num_tokens, tf.constant(1.0))
    return out, grads

  def Update(self, theta, opt_state, grads, metrics, step):
    """Clip, schedule, optimizer update; a step whose loss, gradients, new
    weights or new slots are not finite changes nothing."""
    tp = self.train_params
    step = tf.cast(step, tf.int64)
    grad_leaves = [tf.cast(g, tf.float32) for g in grads.Flatten()]
    counts = {}
    for i, rate in enumerate(self.count_update_rates):
      if rate is not None:  # Counts, not a gradient: no optimizer, no norm.
        counts[i] = grad_leaves[i]
        grad_leaves[i] = tf.zeros_like(grad_leaves[i])
    grad_norm = tf.linalg.global_norm(grad_leaves)
    if tp.clip_gradient_norm_to_value > 0:
      grad_leaves, _ = tf.clip_by_global_norm(
          grad_leaves, tp.clip_gradient_norm_to_value, use_norm=grad_norm)
    lr = schedules.LearningRate(tp.lr_schedule, tp.learning_rate,
                                tp.warmup_steps, step)
    new_theta, new_state = self.optimizer.Apply(
        theta, grads.Pack(grad_leaves), opt_state, lr, step)
    if counts:
      leaves, old = new_theta.Flatten(), theta.Flatten()
      for i, c in counts.items():
        leaves[i] = self._update_rules[i].Updated(
            old[i], c, self.count_update_rates[i])
      new_theta = new_theta.Pack(leaves)
    ok = tf.reduce_all(tf.stack([
        tf.math.is_finite(metrics.loss[0]), tf.math.is_finite(grad_norm),
        _AllFinite(new_theta.Flatten() + tf.nest.flatten(new_state))]))
    def Keep(new, old):
      return tf.where(ok, new, old)

    new_theta = new_theta.Pack(
        [Keep(n, o) for n, o in zip(new_theta.Flatten(), theta.Flatten())])
    new_state = tf.nest.map_structure(Keep, new_state, opt_state)
    out = NestedMap(metrics)
    one = tf.constant(1.0)
    out.learning_rate = (lr, one)
    out.grad_norm = (grad_norm, one)
    out.is_finite = (tf.cast(ok, tf.float32), one)
    return new_theta, new_state, out


def _AllFinite(tensors):
  """Scalar bool: every element of every floating-point tensor is finite."""
  flags = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors
           if t.dtype.is_floating]
  return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


def ExampleOffset(batch):
  """Global index of this replica's first example (int64 scalar).

  strategies.DistributeBatch gives replica r rows [r b, (r + 1) b) of the
  global batch, so r b; 0 with one replica. Tasks key routing randomness by
  global token (layers/rng.py), so replicas route as one device would.
  """
  ctx = tf.distribute.get_replica_context()
  if ctx is None or ctx.num_replicas_in_sync == 1:
    return tf.constant(0, tf.int64)
  leaves = batch.Flatten()
  rows = tf.shape(leaves[0], out_type=tf.int64)[0]
  return tf.cast(ctx.replica_id_in_sync_group, tf.int64) * rows


def CountBatch(batch):
  """(examples, non-padding target tokens) of a batch, float32 scalars.

  Targets are `batch.tgt.paddings` (translation) or, without `tgt`,
  `batch.paddings` (a language model's words).
  """
  leaves = batch.Flatten()
  examples = tf.cast(tf.shape(leaves[0])[0], tf.float32) if leaves else 0.0
  tokens = tf.constant(0.0)
  tgt = batch.get('tgt', batch)
  if isinstance(tgt, NestedMap) and 'paddings' in tgt:
    tokens = tf.reduce_sum(1.0 - tf.cast(tgt.paddings, tf.float32))
  return tf.cast(examples, tf.float32), tokens


def _GlobalLossWeight(task, batch):
  """The task's loss weights summed over replicas; None with one."""
  ctx = tf.distribute.get_replica_context()
  if ctx is None or ctx.num_replicas_in_sync == 1:
    return None
  return ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                        tf.cast(task.LossWeight(batch), tf.float32))


def ReplicaObjective(metrics, total_weight, num_replicas):
  """Replica r's share of the global loss (what it differentiates).

  loss_r = xent_r + aux_r, xent_r a mean over the replica's weight w_r
  (tokens or examples), aux_r (`aux_loss`, optional) a mean over its
  groups. One device on the global batch has loss = sum_r w_r xent_r / W +
  mean_r aux_r (W = sum_r w_r; the groups are the replicas' groups), so
  share_r = (w_r / W) (loss_r - aux_r) + aux_r / n and the global loss and
  its gradient are the sums of the shares over replicas.
  """
  loss, weight = (tf.cast(x, tf.float32) for x in metrics.loss)
  aux = (tf.cast(metrics.aux_loss[0], tf.float32) if 'aux_loss' in metrics
         else tf.constant(0.0))
  return (tf.math.divide_no_nan(weight, total_weight) * (loss - aux) +
          aux / float(num_replicas))


def IsCount(name):
  """Metrics named `num_*` or `*_num_tokens` are counts (weight 1)."""
  return name.startswith('num_') or name.endswith('_num_tokens')


def CrossReplicaSum(metrics, grads):
  """Global metrics and gradients from the replicas' shares.

  Gradients (of each replica's `ReplicaObjective`) and `loss` (the shares)
  are summed; counts (`IsCount`) are summed; every other metric is the
  mean over replicas weighted by its weight (per-expert sums such as
  `importance` and `load`, and CVs, are thus replica means). Identity with
  a single replica.
  """
  ctx = tf.distribute.get_replica_context()
  if ctx is None or ctx.num_replicas_in_sync == 1:
    return metrics, grads
  names = sorted(metrics)
  weighted = [metrics[n][0] * metrics[n][1] for n in names]
  weights = [metrics[n][1] for n in names]
  s_loss, s_weighted, s_weights, s_grads = ctx.all_reduce(
      tf.distribute.ReduceOp.SUM,
      (metrics.loss[0], weighted, weights, grads.Flatten()))
  out = NestedMap()
  for name, v, w in zip(names, s_weighted, s_weights):
    if IsCount(name):
      out[name] = (v, metrics[name][1])  # Weight 1: the sum of counts.
    elif name == 'loss':
      out[name] = (s_loss, w)
    else:
      out[name] = (tf.math.divide_no_nan(v, w), w)
  return out, grads.Pack(s_grads)
