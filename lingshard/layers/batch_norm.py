"""Batch normalisation: micro-batch statistics, moving averages kept by
the training step (GPipe §2.2).

`y = (x - mean) / sqrt(var + eps) * gamma + beta` over the last dim D, with
mean/var over every other position (paddings excluded). In training the
moments are the input's own: inside a GPipe pipeline that is one
micro-batch, on one replica (GPipe §2.2). At inference (`is_inference`:
eval, decode, export) they are the moving averages.

The moving averages are one non-trainable weight `moving` [3, D] of
zero-initialised exponential moving averages: rows (mean, variance, 1),
each `r <- decay r + (1 - decay) batch value`. Inference reads them
debiased (divided by the third row, 1 - decay^t after t updates, as Adam
debiases its moments), so the first update already gives the batch's
statistics and no row needs a non-zero initial value (a pipeline stacks
the weight with the plain initialiser); never updated: mean 0, variance 1.
FProp cannot assign the weight (theta is an input), so the training step
does, as for the MoE selection bias (layers/moe/bias_balance.py): in
training, the output carries the input's shifted moment sums to `moving`'s
gradient slot (a custom gradient that ignores the upstream gradient):

    slot = [n, sum(x - m0), sum((x - m0)^2)]    (each [D]; m0 = moving mean)

Sums of disjoint parts add, and gradients are summed over micro-batches,
replicas and SPMD shards, so the step receives the sums of the whole
mini-batch; `MovingAverage.Updated` (the weight's `update_rule`, rate
`1 - decay`) applies the update with the mini-batch's mean and population
variance (GPipe §2.2: moving averages over the whole mini-batch) (no change when n = 0, e.g. a pipeline's empty slots). The shift by m0 keeps
the one-pass variance accurate in float32. The weight is checkpointed and
restored with the others.

Per-replica statistics (`num_groups` G): the batch dim (dim 0) is cut
into G equal consecutive blocks and each block is normalised by its own
statistics. With the batch split over D data shards and G = D
(models/image_model.py sets it from its mesh) a block is one replica's
shard, so each replica normalises by its own shard of the (micro-)batch,
as a TPU replica's batch norm does by default (GPipe §2.2: statistics
per micro-batch, "and over replicas if necessary", i.e. synchronised
only when asked: G = 1 below). The grouping is written in the math
(`[B, ...] -> [G, B/G, ...]`, moments over every dim but G and D), not
left to the partitioner, for two reasons: the body of a pipeline has no
device mesh of its own, and the SPMD checker's single-device reference
(spmd/unsharded.py: the same program without annotations) must compute
what the partitioned program computes. Statistics of the whole batch
under data parallelism ("cross-replica", Lingvo's
enable_cross_replica_sum_on_tpu) are G = 1: the partitioner then
all-reduces the sums. The moving averages are the whole mini-batch's in
either case (the shifted sums add over blocks).

`FPropWithMoments` also returns the input's moments as NestedMap(count,
mean, m2) (m2 = sum of squared deviations) and `CombineMoments` merges
moments of disjoint parts exactly (Chan et al. 1979), so a pipeline can
report the moments of the whole mini-batch; `UpdatedMoving` is the same EMA
applied to theta from such moments.

Sharding: gamma, beta and `moving` [3, D] are replicated by default
(`weight_split_dims_mapping`; nothing is split); the output keeps the
input's layout (its batch over data).
"""

import tensorflow as tf

from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit

MOVING = 'moving'


def CombineMoments(a, b):
  """Moments of the union of two disjoint parts (Chan et al.'s update)."""
  count = a.count + b.count
  delta = b.mean - a.mean
  frac_b = tf.math.divide_no_nan(b.count, count)
  mean = a.mean + delta * frac_b
  m2 = a.m2 + b.m2 + tf.square(delta) * a.count * frac_b
  return NestedMap(count=count, mean=mean, m2=m2)


def _PerCount(total, count):
  """total / count, 0 where count is 0 (total is then 0 too): a count is
  a whole number, so max(count, 1) is exact. Not divide_no_nan: the SPMD
  partitioner split its select over other mesh axes."""
  return total / tf.maximum(count, 1.0)


def MergeGroups(groups):
  """The moments of the union of a GroupMoments' G blocks (count [],
  mean [D], m2 [D]): Chan et al.'s merge in closed form."""
  count = tf.reduce_sum(groups.count[:, 0])
  mean = tf.math.divide_no_nan(tf.reduce_sum(groups.count * groups.mean, 0),
                               count)
  m2 = tf.reduce_sum(groups.m2 + groups.count * tf.square(groups.mean - mean),
                     0)
  return NestedMap(count=count, mean=mean, m2=m2)


def Variance(moments):
  """Population variance m2 / count (0 for an empty part)."""
  return tf.math.divide_no_nan(moments.m2, moments.count)


def MovingMean(theta):
  """The debiased moving mean [D] (leading dims kept) of a BatchNormLayer
  theta; 0 before the first update."""
  moving = theta[MOVING]
  return tf.math.divide_no_nan(moving[..., 0, :], moving[..., 2, :])


def MovingVariance(theta):
  """The debiased moving variance [D]; 1 before the first update."""
  moving = theta[MOVING]
  total = moving[..., 2, :]
  return tf.where(total > 0, tf.math.divide_no_nan(moving[..., 1, :], total),
                  tf.ones_like(total))


def _Ema(moving, mean, var, count, rate):
  """`moving` [..., 3, D] moved by `rate` towards (mean, var, 1) where the
  count [..., D] of positions behind them is > 0."""
  rate = tf.cast(rate, moving.dtype)
  target = tf.stack([mean, var, tf.ones_like(mean)], axis=-2)
  new = moving + rate * (tf.cast(target, moving.dtype) - moving)
  count = count * tf.ones_like(moving[..., 0, :])
  return tf.where(count[..., tf.newaxis, :] > 0, new, moving)


class MovingAverage:
  """`update_rule` of `moving` (base_layer.WeightParams): the step's EMA
  from the mini-batch's shifted sums in the weight's gradient slot."""

  @staticmethod
  def Updated(moving, slot, rate):
    slot = tf.cast(slot, moving.dtype)
    n, s1, s2 = slot[..., 0, :], slot[..., 1, :], slot[..., 2, :]
    shift = tf.math.divide_no_nan(s1, n)  # mean_batch - m0
    var = tf.maximum(tf.math.divide_no_nan(s2, n) - tf.square(shift), 0.0)
    mean = MovingMean({MOVING: moving}) + shift
    return _Ema(moving, mean, var, n, rate)


def _CarrySums(y, moving, sums):
  """`y` unchanged; d/d(moving) = sums, whatever the upstream gradient."""
  sums = tf.stop_gradient(tf.cast(sums, moving.dtype))

  @tf.custom_gradient
  def Carry(y, moving):
    def Grad(dy):
      return dy, sums
    return tf.identity(y), Grad

  return Carry(y, moving)


class BatchNormLayer(base_layer.BaseLayer):
  """Normalises the last dim D of `[..., D]` inputs by batch statistics."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Normalised dim D.')
    p.Define('epsilon', 1e-3, 'Added to the variance.')
    p.Define('decay', 0.99, 'Moving averages: m <- decay m + (1 - decay) '
             'batch value, once per training step.')
    p.Define('num_groups', 1, 'G: training statistics per block of B/G '
             'consecutive examples of the batch dim (per data replica when '
             'G = the data shards; module docstring); 1 = the whole batch.')
    for name in ('beta', 'gamma'):
      p.weight_split_dims_mapping.Define(name, [-1], f'{name} [D].')
    p.weight_split_dims_mapping.Define(MOVING, [-1, -1], 'moving [3, D].')
    p.activation_split_dims_mapping.Define(
        'grouped', [base_layer.BATCH], 'Mapping of the leading dims of the '
        'grouped input [G, B/G, ..., D] (num_groups > 1): G over data, each '
        'block on its replica; the other dims are not split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'num_groups')
    if not 0.0 <= p.decay < 1.0:
      raise ValueError(f'{p.name}: decay must be in [0, 1), got {p.decay!r}')
    d = p.input_dim
    for name, value in (('beta', 0.0), ('gamma', 1.0)):
      self.CreateVariable(name, base_layer.WeightParams(
          [d], init=WeightInit.Constant(value)))
    self.CreateVariable(MOVING, base_layer.WeightParams(
        [3, d], init=WeightInit.Constant(0.0), trainable=False,
        count_update_rate=1.0 - float(p.decay), update_rule=MovingAverage))

  def Moments(self, inputs, paddings=None):
    """NestedMap(count [], mean [D], m2 [D]) over the non-padded positions.

    inputs [..., D]; paddings None or [...] (inputs' leading dims, 1.0 = pad).
    """
    x = tf.cast(inputs, tf.float32)
    axes = list(range(x.shape.rank - 1))
    w = self._Weights(x, paddings)
    count = tf.reduce_sum(w * tf.ones_like(x[..., :1]))
    mean = tf.math.divide_no_nan(tf.reduce_sum(w * x, axes), count)
    m2 = tf.reduce_sum(w * tf.square(x - mean), axes)
    return NestedMap(count=count, mean=mean, m2=m2)

  def GroupMoments(self, inputs, paddings=None):
    """NestedMap(count [G, D], mean [G, D], m2 [G, D]): the moments of
    each of the G blocks of B/G consecutive examples (`num_groups`).

    inputs [B, ..., D] (B static, divisible by G); paddings None or
    [B, ...]. Variance() and CombineMoments() apply per block.
    """
    x = self._Grouped(tf.cast(inputs, tf.float32))  # [G, B/G, ..., D]
    axes = list(range(1, x.shape.rank - 1))
    w = self._Weights(x, None if paddings is None else
                      self._Grouped(paddings))
    shard = self._ShardGroups
    # count [G, D] (equal over D), not [G, 1]: an unannotated broadcast
    # in the division lets the partitioner split D over other mesh axes.
    count = shard(tf.reduce_sum(w * tf.ones_like(x), axes))
    mean = shard(_PerCount(shard(tf.reduce_sum(w * x, axes)), count))
    dx = shard(x - shard(self._PerBlock(mean, x)))
    m2 = shard(tf.reduce_sum(w * tf.square(dx), axes))
    return NestedMap(count=count, mean=mean, m2=m2)

  def _Grouped(self, t):
    """[B, ...] -> [G, B/G, ...] (consecutive blocks)."""
    t = tf.convert_to_tensor(t)
    g, b = self.params.num_groups, t.shape[0]
    if b is None or b % g:
      raise ValueError(f'{self.path}: num_groups {g} does not divide the '
                       f'batch {b}; use a divisor of it')
    return self._ShardGroups(tf.reshape(t, [g, b // g] +
                                        t.shape.as_list()[1:]))

  def _ShardGroups(self, t):
    """t [G, ...] annotated by activation_split_dims_mapping.grouped."""
    p = self.params
    lead = p.activation_split_dims_mapping.grouped
    if lead is None or p.device_mesh is None:
      return t
    lead = [p.batch_axes if a == base_layer.BATCH else a for a in lead]
    return sharding.mesh_split(t, p.device_mesh,
                               lead + [-1] * (t.shape.rank - len(lead)),
                               p.mesh_axis_names)

  @staticmethod
  def _PerBlock(t_gd, x):
    """[G, D] -> [G, 1, ..., 1, D], broadcastable against grouped x."""
    return tf.reshape(t_gd, [t_gd.shape[0]] + [1] * (x.shape.rank - 2) +
                      [t_gd.shape[-1]])

  @staticmethod
  def _Weights(x, paddings):
    if paddings is None:
      return tf.ones_like(x[..., :1])
    return 1.0 - tf.cast(paddings, tf.float32)[..., tf.newaxis]

  def FPropWithMoments(self, theta, inputs, paddings=None):
    """(outputs [..., D], the input's Moments).

    Training: normalised by the input's moments, and the output carries
    their shifted sums to `moving`'s gradient slot (module docstring);
    inference: normalised by the moving averages in theta.
    """
    p = self.params
    x = tf.cast(inputs, tf.float32)
    if p.is_inference or p.num_groups == 1:
      moments = self.Moments(inputs, paddings)
      if p.is_inference:
        mean, var = MovingMean(theta), MovingVariance(theta)
      else:
        mean, var = moments.mean, Variance(moments)
      y = (x - mean) * tf.math.rsqrt(var + p.epsilon)
    else:  # Each block by its own statistics (module docstring).
      groups = self.GroupMoments(inputs, paddings)
      moments = MergeGroups(groups)
      xg = self._Grouped(x)
      mean = self._ShardGroups(self._PerBlock(groups.mean, xg))
      var = self._ShardGroups(self._PerBlock(
          _PerCount(groups.m2, groups.count), xg))
      y = tf.reshape(self._ShardGroups(
          (xg - mean) * tf.math.rsqrt(var + p.epsilon)), x.shape)
    y = y * tf.cast(theta.gamma, tf.float32) + tf.cast(theta.beta, tf.float32)
    if not p.is_inference:
      y = _CarrySums(y, theta[MOVING], self._ShiftedSums(
          x, paddings, tf.cast(MovingMean(theta), tf.float32), moments.count))
    return tf.cast(y, self.fprop_dtype), moments

  def _ShiftedSums(self, x, paddings, m0, count):
    """[3, D]: (n, sum(x - m0), sum((x - m0)^2)) over non-padded positions."""
    axes = list(range(x.shape.rank - 1))
    w = self._Weights(x, paddings)
    dx = tf.stop_gradient(x) - tf.stop_gradient(m0)
    return tf.stack([count * tf.ones_like(m0), tf.reduce_sum(w * dx, axes),
                     tf.reduce_sum(w * tf.square(dx), axes)])

  def FProp(self, theta, inputs, paddings=None):
    """inputs [..., D] -> [..., D]; see FPropWithMoments."""
    return self.FPropWithMoments(theta, inputs, paddings)[0]

  @staticmethod
  def UpdatedMoving(theta, moments, decay):
    """theta with `moving` moved to the moments: m <- decay m + (1-decay) x."""
    out = theta.copy()
    out[MOVING] = _Ema(theta[MOVING], moments.mean, Variance(moments),
                       moments.count, 1.0 - decay)
    return out
