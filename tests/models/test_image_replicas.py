"""Batch norm under data parallelism (GPipe §2.2): each data replica
normalises its own shard of each micro-batch, the moving averages are the
whole mini-batch's (layers/batch_norm.py num_groups, models/image_model.py
bn_statistics)."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import batch_norm
from lingshard.layers import pipeline
from lingshard.models import image_model
from lingshard.nested_map import NestedMap
from lingshard.train import step as train_step
from tests.models import image_testlib

# B examples, data x stage mesh [D, K], M micro-batches: each replica's
# share of a micro-batch is B / (M D) = 4 examples.
_B, _D, _K, _M, _DECAY = 16, 2, 2, 2, 0.7


def _Bn(**kwargs):
  return batch_norm.BatchNormLayer.Params().Set(
      name='bn', input_dim=3, **kwargs).Instantiate()


def _NumpyNorm(x, eps):
  axes = tuple(range(x.ndim - 1))
  return (x - x.mean(axes)) / np.sqrt(x.var(axes) + eps)


def test_groups_normalise_each_block_by_its_own_statistics():
  rng = np.random.RandomState(0)
  x = rng.normal(2.0, 3.0, size=[6, 2, 2, 3]).astype(np.float32)
  x[3:] += 5.0  # The second block's statistics differ from the first's.
  pad = np.zeros([6, 2, 2], np.float32)
  pad[1] = 1.0  # Example 1 is padding: out of block 0's statistics.
  layer = _Bn(num_groups=2, epsilon=1e-3)
  y, moments = layer.FPropWithMoments(layer.theta, x, pad)
  groups = layer.GroupMoments(x, pad)
  for g, rows in enumerate(([0, 2], [3, 4, 5])):
    keep = x[rows].reshape(-1, 3)
    np.testing.assert_allclose(groups.mean.numpy()[g], keep.mean(0),
                               rtol=1e-5)
    np.testing.assert_allclose(batch_norm.Variance(groups).numpy()[g],
                               keep.var(0), rtol=1e-5)
    np.testing.assert_allclose(y.numpy()[rows], _NumpyNorm(
        x[rows], 1e-3), rtol=1e-4, atol=1e-4)
  # The returned moments are still the whole input's (pipeline aux).
  keep = x[[0, 2, 3, 4, 5]].reshape(-1, 3)
  assert float(moments.count) == keep.shape[0]
  np.testing.assert_allclose(moments.mean.numpy(), keep.mean(0), rtol=1e-5)
  np.testing.assert_allclose(batch_norm.Variance(moments).numpy(),
                             keep.var(0), rtol=1e-5)


def test_groups_that_do_not_divide_the_batch_are_one_line_errors():
  layer = _Bn(num_groups=4)
  with pytest.raises(ValueError, match=r'^bn: num_groups 4 does not divide '
                     r'the batch 6; use a divisor of it$'):
    layer.FProp(layer.theta, np.zeros([6, 3], np.float32))


def _Params(mesh, bn_statistics='per_replica'):
  p = image_model.ImageClassifier.Params().Set(
      name='model', image_shape=(8, 8, 1), num_classes=5, channels=4,
      num_blocks=2, bn_decay=_DECAY, bn_statistics=bn_statistics)
  p.pipeline_tpl = pipeline.PipelinedLayer.Params().Set(
      num_stages=_K, num_micro_batches=_M, remat=True)
  if mesh:
    p.device_mesh = np.arange(_D * _K).reshape(_D, _K)
  p.train.Set(optimizer='sgd', learning_rate=0.0)
  return p


def _Batch():
  rng = np.random.RandomState(3)
  image = rng.normal(1.0, 2.0, size=[_B, 8, 8, 1]).astype(np.float32)
  image[_B // 2:] *= 3.0  # Replica 1's shard: other statistics.
  return NestedMap(image=image,
                   label=rng.randint(0, 5, size=[_B]).astype(np.int32))


def _Reference(task, theta, batch, stem_blocks, body_blocks):
  """The plain model with every batch norm on the rows of one block at a
  time: the stem on each of `stem_blocks`, the body on each of
  `body_blocks` (lists of rows; each list covers all B rows). Returns
  (loss, the stem's conv outputs, per body block [L] aux.moments)."""
  x, stem_in = np.zeros([_B, 4, 4, 4], np.float32), []
  for rows in stem_blocks:
    image = tf.gather(batch.image, rows)
    stem_in.append(task.stem.conv.FProp(theta.stem.conv, image))
    x[rows] = task.pool.FProp(None, task.stem.FProp(theta.stem, image))
  y, moments = np.zeros_like(x), []
  for rows in body_blocks:
    h, mb = tf.constant(x[rows]), []
    for block_theta in task.body.LayerThetas(theta.body):
      h, aux = task.body.body.FProp(block_theta, h)
      mb.append(aux.moments)
    y[rows] = h
    moments.append(mb)
  logits = task.logits.FProp(theta.logits, task.gap.FProp(None, y))
  metrics, _ = task.ComputeLoss(theta, NestedMap(logits=logits), batch)
  return metrics.loss[0].numpy(), tf.concat(stem_in, 0).numpy(), moments


def _Rows(d, i):
  """Replica d's rows of micro-batch i (micro-batches are blocked within
  each data shard: layers/pipeline_run.py)."""
  size = _B // (_M * _D)
  start = d * _B // _D + i * size
  return list(range(start, start + size))


def test_replicas_normalise_their_own_shards_and_moving_is_the_mini_batch():
  task = _Params(mesh=True).Instantiate()
  assert task.stem.bn.params.num_groups == _D
  assert task.body.body.a.bn.params.num_groups == _D
  # The reference's layers: no mesh, every batch norm on what it is given.
  plain = _Params(mesh=False).Instantiate()
  theta, batch = task.theta, _Batch()
  stepper = train_step.TrainStep(task)
  new, _, out = stepper(theta, stepper.InitOptState(theta), batch,
                        tf.constant(0, tf.int64))
  shards = [list(range(d * _B // _D, (d + 1) * _B // _D)) for d in range(_D)]
  per_replica = [_Rows(d, i) for d in range(_D) for i in range(_M)]
  want, stem_in, moments = _Reference(plain, theta, batch, shards,
                                      per_replica)
  np.testing.assert_allclose(out.loss[0].numpy(), want, rtol=1e-5)
  # Statistics of the whole batch (stem) and of whole micro-batches (body)
  # give another loss (the check above can fail); they are what
  # bn_statistics='cross_replica' computes on the same mesh.
  micro_batches = [sum((_Rows(d, i) for d in range(_D)), []) for i in range(_M)]
  whole, _, _ = _Reference(plain, theta, batch, [list(range(_B))],
                           micro_batches)
  assert abs(whole - want) > 1e-3 * abs(want)
  cross = _Params(mesh=True, bn_statistics='cross_replica').Instantiate()
  assert cross.stem.bn.params.num_groups == 1
  metrics, _ = cross.FProp(theta, batch)
  np.testing.assert_allclose(metrics.loss[0].numpy(), whole, rtol=1e-5)

  # GPipe §2.2: every moving average moved to the whole mini-batch's
  # statistics, whatever the blocks (the shifted sums add).
  def Want(mean, var):
    return (1 - _DECAY) * np.stack([mean, var, np.ones_like(mean)])

  h = stem_in.reshape(-1, stem_in.shape[-1])
  np.testing.assert_allclose(new.stem.bn.moving.numpy(),
                             Want(h.mean(0), h.var(0)), rtol=1e-4, atol=1e-5)
  new_layers = task.body.LayerThetas(new.body)
  for index in range(2):
    for key in ('a', 'b'):
      mean, var = image_testlib.WholeBatch([mb[index][key] for mb in moments])
      np.testing.assert_allclose(new_layers[index][key].bn.moving.numpy(),
                                 Want(mean, var), rtol=1e-4, atol=1e-5)
