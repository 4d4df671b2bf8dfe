"""A feed-forward regression task and its synthetic input: the smallest real
model, used by the registry, the smoke run and the core tests."""

import numpy as np
import tensorflow as tf

from lingshard import base_input
from lingshard.layers import linear
from lingshard.models import base_model
from lingshard.nested_map import NestedMap


class FeedForwardRegression(base_model.BaseTask):
  """MLP `x [B, D] -> y [B, 1]` trained with mean squared error."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 8, 'Input features D.')
    p.Define('hidden_dims', [32, 32], 'Hidden layer widths.')
    p.Define('activation', 'relu', 'Hidden activation.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    dims = [p.input_dim] + list(p.hidden_dims) + [1]
    layers = []
    for i in range(len(dims) - 1):
      last = i == len(dims) - 2
      layers.append(linear.LinearLayer.Params().Set(
          input_dim=dims[i], output_dim=dims[i + 1],
          activation='none' if last else p.activation))
    self.CreateChildren('fc', layers)

  def ComputePredictions(self, theta, input_batch, **kwargs):
    del kwargs  # No randomness.
    x = input_batch.x
    for layer, layer_theta in zip(self.fc, theta.fc):
      x = layer.FProp(layer_theta, x)
    return NestedMap(y=x[:, 0])

  def ComputeLoss(self, theta, predictions, input_batch):
    err = tf.cast(predictions.y, tf.float32) - input_batch.y
    per_example = tf.square(err)
    n = tf.cast(tf.size(per_example), tf.float32)
    loss = tf.reduce_mean(per_example)
    metrics = NestedMap(loss=(loss, n), mse=(loss, n))
    return metrics, NestedMap(sq_err=per_example)


class RegressionInput(base_input.BaseInputGenerator):
  """Synthetic regression batches from a fixed random teacher.

  y = sum(sin(x @ A)) / sqrt(hidden) + noise, A ~ N(0, 1/D), with A and the stream of x
  determined by `seed`: the same params give the same batches.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('batch_size', 32, 'Examples per batch.')
    p.Define('input_dim', 8, 'Features per example.')
    p.Define('teacher_hidden', 16, 'Width of the teacher projection.')
    p.Define('noise_stddev', 0.01, 'Label noise.')
    p.Define('seed', 301, 'Seed of the teacher and of the example stream.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params.Freeze()
    rng = np.random.RandomState(p.seed)
    # Scaled so x @ A has unit variance: sin() stays smooth and learnable.
    self._teacher = (rng.normal(size=[p.input_dim, p.teacher_hidden]) /
                     np.sqrt(p.input_dim)).astype(np.float32)

  def _Batch(self, index):
    p = self.params
    seed = tf.stack([tf.constant(p.seed, tf.int64), index])
    x = tf.random.stateless_normal([p.batch_size, p.input_dim], seed)
    h = tf.sin(tf.matmul(x, self._teacher))
    noise = tf.random.stateless_normal([p.batch_size], seed + 1,
                                       stddev=p.noise_stddev)
    y = tf.reduce_sum(h, axis=1) / np.sqrt(p.teacher_hidden) + noise
    return NestedMap(x=x, y=y)

  def GetDataset(self):
    """An endless dataset of batches (batch i depends only on seed and i)."""
    return tf.data.Dataset.range(2**62).map(self._Batch)

  def GetBatch(self, index):
    return self._Batch(tf.constant(index, tf.int64))
