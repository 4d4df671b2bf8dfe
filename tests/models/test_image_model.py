"""ImageClassifier: pipelined == unpipelined per micro-batch (GPipe §2.2
batch norm), moving averages from the train step, eval reads them."""

import numpy as np
import tensorflow as tf

from lingshard.layers import batch_norm
from lingshard.layers import pipeline
from lingshard.models import image_model
from lingshard.nested_map import NestedMap
from lingshard.train import step as train_step
from tests.models import image_testlib

_B, _K, _M = 8, 2, 4


def _Params(pipelined=False, **kwargs):
  p = image_model.ImageClassifier.Params().Set(
      name='model', image_shape=(8, 8, 1), num_classes=6, channels=4,
      num_blocks=3, bn_decay=0.7, label_smoothing=0.1).Set(**kwargs)
  if pipelined:
    p.pipeline_tpl = pipeline.PipelinedLayer.Params().Set(
        num_stages=_K, num_micro_batches=_M, remat=True)
  return p


def _Batch(seed=0):
  rng = np.random.RandomState(seed)
  return NestedMap(
      image=rng.normal(1.0, 2.0, size=[_B, 8, 8, 1]).astype(np.float32),
      label=rng.randint(0, 6, size=[_B]).astype(np.int32))


def _Reference(task, theta, body_thetas, batch):
  """The plain model with its body run on each micro-batch in turn: the
  stem and head see the whole batch. Returns (loss, the body BNs' moments
  per micro-batch: [M][L] NestedMap(a=, b=))."""
  x = task.pool.FProp(None, task.stem.FProp(theta.stem, batch.image))
  size = _B // _M
  outs, moments = [], []
  for m in range(_M):
    h, mb = x[m * size:(m + 1) * size], []
    for block_theta in body_thetas:
      h, aux = task.body.body.FProp(block_theta, h)
      mb.append(aux.moments)
    outs.append(h)
    moments.append(mb)
  logits = task.logits.FProp(theta.logits,
                             task.gap.FProp(None, tf.concat(outs, 0)))
  metrics, _ = task.ComputeLoss(theta, NestedMap(logits=logits), batch)
  return metrics.loss[0], moments


def test_pipelined_equals_per_micro_batch_plain_and_step_updates_moving():
  params = _Params(pipelined=True)
  params.train.Set(optimizer='sgd', learning_rate=0.1)
  task = params.Instantiate()
  theta = task.theta
  # A previous moving state (debiased mean 1, variance 4 on every BN).
  old = np.array([[0.5], [2.0], [0.5]], np.float32)
  for leaf in theta.Flatten():
    if leaf.shape[-2:-1] == [3] and 'moving' in leaf.name:
      leaf.assign(np.broadcast_to(old, leaf.shape))
  batch = _Batch()
  metrics, _, grads = task.LossAndGradients(theta, batch)
  with tf.GradientTape() as tape:
    tape.watch(theta.Flatten())
    body_thetas = task.body.LayerThetas(theta.body)
    want_loss, moments = _Reference(task, theta, body_thetas, batch)
  want = tape.gradient(want_loss, theta, unconnected_gradients='zero')
  np.testing.assert_allclose(metrics.loss[0].numpy(), want_loss.numpy(),
                             rtol=1e-5)
  got_layers = task.body.LayerThetas(grads.body)
  # Per-layer gradients of the stack: the reference's are on the same
  # stacked variables, read per layer.
  want_layers = task.body.LayerThetas(want.body)
  pairs = []
  for name, got_part, want_part in (
      [('stem', grads.stem, want.stem), ('logits', grads.logits, want.logits)]
      + [(f'body.{i}', g, w) for i, (g, w) in
         enumerate(zip(got_layers, want_layers))]):
    pairs += [(f'{name}.{key}', g, w) for (key, g), (_, w) in
              zip(got_part.FlattenItems(), want_part.FlattenItems())]
  for key, g, w in pairs:  # Normwise, as tests/layers/test_pipeline.py.
    scale = max(1.0, float(np.abs(w.numpy()).max()))
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-4,
                               atol=2e-5 * scale, err_msg=key)
  # One train step: every BN's moving rows = decay old + (1 - decay) (the
  # whole mini-batch's mean, variance, 1).
  stepper = train_step.TrainStep(task)
  new, _, out = stepper(theta, stepper.InitOptState(theta), batch,
                        tf.constant(0, tf.int64))
  assert float(out.is_finite[0]) == 1.0

  def Want(mean, var):
    return 0.7 * old + 0.3 * np.stack([mean, var, np.ones_like(mean)])

  new_layers = task.body.LayerThetas(new.body)
  for index in range(3):
    for key in ('a', 'b'):
      mean, var = image_testlib.WholeBatch([mb[index][key] for mb in moments])
      np.testing.assert_allclose(new_layers[index][key].bn.moving.numpy(),
                                 Want(mean, var), rtol=1e-4, atol=1e-5)
  # The stem's BN saw the whole batch: numpy over conv(x)'s positions.
  h = task.stem.conv.FProp(theta.stem.conv, batch.image).numpy()
  h = h.reshape(-1, h.shape[-1])
  np.testing.assert_allclose(new.stem.bn.moving.numpy(),
                             Want(h.mean(0), h.var(0)), rtol=1e-4, atol=1e-5)
  # The optimizer moved the trainable weights but not `moving` itself.
  assert not np.allclose(new.stem.conv.w.numpy(), theta.stem.conv.w.numpy())


def test_eval_after_a_step_uses_the_moving_averages():
  # decay 0 and lr 0: after one step the moving averages are this batch's
  # statistics, so the eval task on the same batch gives the training
  # forward's logits; with the initial (0, 1) statistics it would not.
  params = _Params(bn_decay=0.0)
  params.train.Set(optimizer='sgd', learning_rate=0.0)
  task = params.Instantiate()
  theta, batch = task.theta, _Batch(1)
  train_logits = task.ComputePredictions(theta, batch).logits.numpy()
  eval_task = image_model.ImageClassifier.InferenceParams(
      task.params).Instantiate()
  before = eval_task.ComputePredictions(theta, batch).logits.numpy()
  assert np.abs(before - train_logits).max() > 0.1
  stepper = train_step.TrainStep(task)
  new, _, _ = stepper(theta, stepper.InitOptState(theta), batch,
                      tf.constant(0, tf.int64))
  h = task.stem.conv.FProp(theta.stem.conv, batch.image).numpy()
  np.testing.assert_allclose(batch_norm.MovingMean(new.stem.bn).numpy(),
                             h.reshape(-1, 4).mean(0), rtol=1e-4, atol=1e-5)
  after = eval_task.ComputePredictions(new, batch).logits.numpy()
  np.testing.assert_allclose(after, train_logits, rtol=1e-3, atol=1e-3)
