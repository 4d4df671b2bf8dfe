"""Pipeline schedules: which stage does what in each iteration.

A schedule is a small object (`PipelinedLayer.Params().schedule`, an
`InstantiableParams`) that the pipeline's runners read: the unrolled one
(pipeline.py) and the forward/backward `tf.while_loop`s (pipeline_loop).
It answers, for M micro-batches on K stages:

  NumIterations(m, k)   N, the iterations of one FProp;
  StageWork(t, m, k)    per stage (micro-batch, chunk) in iteration t
                        (micro-batch -1: the bubble; chunk r: the stage's
                        r-th group of layers, slots [r C, (r + 1) C));
  Entering(t, m, k)     (micro-batch, source) entering stage 0 in
                        iteration t: its paddings and extras are the
                        micro-batch's, its x the micro-batch's input
                        (source -1) or the last stage's output of
                        iteration `source` (< t: it goes round again);
  OutputIterations(m, k)  per micro-batch the iteration whose last-stage
                        output is its final output;
  Shift(layer, entering, state, t)  stage k + 1 gets stage k's tensor,
                        stage 0 `entering` (linear: a move of data);
  repeats               R, layer chunks per stage (the weight layout);
  Check(name, L, K, M)  one-line errors (M None: not known yet).

The aux of a stage counts only where StageWork gives a real micro-batch.
The layer partition: L layers are cut into K R chunks of consecutive
layers (pipeline_partition, by cost or `stage_splits` of K R counts);
stage k holds chunks k, k + K, ..., k + (R - 1) K, each padded to the
longest chunk C (a padded slot passes its input through).

`FillDrain` (GPipe §2.2) and `Circular(R)` (Praxis'
CircularLayerwiseShardablePipelined, MaxText's num_pipeline_repeats: a
micro-batch goes R times round the ring of stages) are the two here; a new
schedule subclasses one of them (tests/layers/test_pipeline_schedule.py).
"""

import numpy as np
import tensorflow as tf

from lingshard import hyperparams


class ScheduleError(ValueError):
  """A schedule that cannot run this pipeline (one line)."""


class Tables:
  """A schedule's answers for (m, k) as numpy tables (the loop runner
  indexes them with its iteration tensor): mb, chunk [N, K]; enter_mb,
  enter_src [N + 1]; outputs [M]."""

  def __init__(self, schedule, m, k):
    n = schedule.NumIterations(m, k)
    self.n, self.m, self.k = n, m, k
    work = [schedule.StageWork(t, m, k) for t in range(n)]
    self.mb = np.stack([np.asarray(w[0], np.int64) for w in work])
    self.chunk = np.stack([np.asarray(w[1], np.int64) for w in work])
    enter = [schedule.Entering(t, m, k) for t in range(n + 1)]
    self.enter_mb = np.array([e[0] for e in enter], np.int64)
    self.enter_src = np.array([e[1] for e in enter], np.int64)
    self.outputs = np.asarray(schedule.OutputIterations(m, k), np.int64)
    if any((s >= t) for t, s in enumerate(self.enter_src)):
      raise ScheduleError(f'schedule {schedule!r} feeds stage 0 an output '
                          'of the same or a later iteration')

  @property
  def recirculates(self):
    """Whether some x entering stage 0 is an earlier output."""
    return bool((self.enter_src >= 0).any())

  def Needed(self):
    """The iterations whose last-stage output is used."""
    return set(self.outputs.tolist()) | set(
        s for s in self.enter_src.tolist() if s >= 0)


class FillDrain:
  """GPipe's fill-drain (§2.2): N = M + K - 1, stage k runs micro-batch
  t - k, the last stage's output of iteration i + K - 1 is micro-batch i.

      for t in range(M + K - 1):
        stage k: micro-batch t - k (bubble outside [0, M)), its S layers
        state = Shift(input[t + 1] or bubble, out)
  """

  @classmethod
  def Params(cls):
    return hyperparams.InstantiableParams(cls)

  def __init__(self, params):
    self.params = params.Copy()

  @property
  def repeats(self):
    return 1

  def Check(self, name, num_layers, k, m=None):
    del name, num_layers, k, m

  def NumIterations(self, m, k):
    return m + k - 1

  def StageWork(self, t, m, k):
    mb = np.array([t - st if 0 <= t - st < m else -1 for st in range(k)],
                  np.int64)
    return mb, np.zeros([k], np.int64)

  def Entering(self, t, m, k):
    del k
    return (t if t < m else -1), -1

  def OutputIterations(self, m, k):
    return np.arange(m) + k - 1

  def Shift(self, layer, entering, state, t):
    """[entering, state[0], ..., state[K-2]]: a pad-and-slice along K
    (XLA SPMD: a collective-permute when K is split) and a select of stage
    0. `t` (the iteration the state enters) is unused here."""
    del t
    k, rank = layer.params.num_stages, state.shape.rank
    shifted = tf.pad(state, [[1, 0]] + [[0, 0]] * (rank - 1))[:k]
    first = np.zeros([k] + [1] * (rank - 1), bool)
    first[0] = True
    out = tf.where(tf.constant(first),
                   tf.broadcast_to(entering[tf.newaxis], tf.shape(state)),
                   shifted)
    return layer.ShardState(out)

  def __repr__(self):
    return type(self).__name__


class Circular(FillDrain):
  """Circular (interleaved) schedule, R repeats: stage k holds chunks k,
  k + K, ..., k + (R - 1) K and a micro-batch goes R times round the ring.
  N = R M + K - 1; bubble (K - 1) / (R M + K - 1).

      for t in range(R * M + K - 1):
        stage k: v = t - k; micro-batch v % M, its chunk v // M
        state = Shift(input[t + 1] if t + 1 < M else output[t + 1 - M + K - 1]
                      (the last stage's, after K - 1 stages), out)

  Micro-batch i's pass r enters stage 0 in iteration r M + i; its pass r - 1
  left the last stage in iteration (r - 1) M + i + K - 1, so M >= K.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('repeats', 2, 'R: layer chunks per stage (passes round the '
             'ring); L >= K R, M >= K.')
    return p

  @property
  def repeats(self):
    return int(self.params.repeats)

  def Check(self, name, num_layers, k, m=None):
    r = self.params.repeats
    if not isinstance(r, int) or r < 1:
      raise ScheduleError(f'{name}: schedule.repeats must be an int >= 1, '
                          f'got {r!r}')
    if num_layers < k * r:
      raise ScheduleError(
          f'{name}: the circular schedule cuts num_layers {num_layers} into '
          f'num_stages x repeats = {k} x {r} = {k * r} chunks; use at least '
          f'{k * r} layers or fewer repeats')
    if m is not None and r > 1 and m < k:
      raise ScheduleError(
          f'{name}: the circular schedule needs at least num_stages {k} '
          f'micro-batches (a micro-batch re-enters stage 0 after leaving '
          f'the last), got {m}')

  def NumIterations(self, m, k):
    return self.repeats * m + k - 1

  def StageWork(self, t, m, k):
    v = t - np.arange(k)
    real = (v >= 0) & (v < self.repeats * m)
    return (np.where(real, v % m, -1).astype(np.int64),
            np.where(real, v // m, 0).astype(np.int64))

  def Entering(self, t, m, k):
    if t >= self.repeats * m:
      return -1, -1
    return t % m, (-1 if t < m else t - m + k - 1)

  def OutputIterations(self, m, k):
    return (self.repeats - 1) * m + np.arange(m) + k - 1

  def __repr__(self):
    return f'Circular(R={self.repeats})'
