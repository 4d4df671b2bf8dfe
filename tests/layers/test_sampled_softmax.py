"""Sampled softmax (lingshard/layers/sampled_softmax.py): the proposal Q,
the corrected logits, and training that converges to the full softmax's
loss on a toy problem."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import sampled_softmax


def test_log_uniform_sampler_matches_its_probabilities():
  v, n = 50, 200000
  ids = sampled_softmax.LogUniformSample(tf.constant([3, 4], tf.int64), n, v)
  freq = np.bincount(ids.numpy(), minlength=v) / n
  q = np.exp(sampled_softmax.LogUniformLogProb(tf.range(v), v).numpy())
  np.testing.assert_allclose(q.sum(), 1.0, rtol=1e-5)
  np.testing.assert_allclose(freq, q, atol=4e-3)
  assert ids.numpy().min() >= 0 and ids.numpy().max() < v


def test_sampled_nll_is_the_corrected_softmax_over_label_and_samples():
  """Numpy reference of one position: logits of the label and the S draws,
  each minus log(S Q(k)); a draw equal to the label is masked out."""
  v, m, s = 20, 4, 6
  p = sampled_softmax.SampledSoftmaxLayer.Params().Set(
      name='sm', input_dim=m, num_classes=v, num_sampled=s)
  layer = p.Instantiate()
  rng = np.random.RandomState(0)
  theta = layer.theta
  theta.b = tf.constant(rng.randn(v).astype(np.float32))
  x = rng.randn(2, 3, m).astype(np.float32)
  labels = rng.randint(0, v, size=[2, 3]).astype(np.int32)
  step = tf.constant(7, tf.int64)
  got = layer.SampledNll(theta, x, labels, step).numpy()
  from lingshard.layers import dropout  # pylint: disable=g-import-not-at-top
  draws = sampled_softmax.LogUniformSample(
      dropout.StepSeed(layer.layer_seed, step), s, v).numpy()
  logq = sampled_softmax.LogUniformLogProb(tf.range(v), v).numpy()
  w, b = theta.w.numpy(), theta.b.numpy()
  for i in range(2):
    for j in range(3):
      full = x[i, j] @ w + b - logq - math.log(s)
      y = labels[i, j]
      z = [full[y]] + [(-np.inf if k == y else full[k]) for k in draws]
      z = np.array(z, np.float64)
      want = -(z[0] - np.log(np.sum(np.exp(z - z.max()))) - z.max())
      np.testing.assert_allclose(got[i, j], want, rtol=1e-5)


def test_num_sampled_must_be_positive():
  p = sampled_softmax.SampledSoftmaxLayer.Params().Set(
      name='sm', input_dim=4, num_classes=10, num_sampled=0)
  with pytest.raises(ValueError, match='num_sampled'):
    p.Instantiate()


def _Train(num_sampled, steps=400, v=200, contexts=16, m=16):
  """Fits a softmax over `v` Zipfian classes given one of `contexts`
  inputs; returns (full-softmax NLL on fresh draws, its entropy bound)."""
  rng = np.random.RandomState(1)
  x_cm = rng.randn(contexts, m).astype(np.float32)
  # Each context's label distribution: Zipf over the ids (ids sorted by
  # frequency, as the proposal assumes and lm_prepare's vocabulary is),
  # reweighted per context.
  zipf = 1.0 / np.arange(1, v + 1)
  probs = zipf * np.exp(rng.normal(size=[contexts, v]))
  probs /= probs.sum(axis=1, keepdims=True)
  entropy = -np.mean(np.sum(probs * np.log(np.maximum(probs, 1e-30)), -1))
  cls = (sampled_softmax.SampledSoftmaxLayer if num_sampled
         else sampled_softmax.softmax.SoftmaxLayer)
  p = cls.Params().Set(name='sm', input_dim=m, num_classes=v)
  if num_sampled:
    p.num_sampled = num_sampled
  layer = p.Instantiate()
  w = tf.Variable(layer.theta.w)
  b = tf.Variable(layer.theta.b)
  opt = tf.keras.optimizers.Adam(0.05)

  def Batch(seed, n=256):
    r = np.random.RandomState(seed)
    c = r.randint(0, contexts, size=n)
    y = np.array([r.choice(v, p=probs[k]) for k in c], np.int32)
    return x_cm[c][None], y[None]

  @tf.function(autograph=False)
  def Step(x, y, step):
    with tf.GradientTape() as tape:
      theta = layer.theta.copy()
      theta.w, theta.b = w, b
      if num_sampled:
        loss = tf.reduce_mean(layer.SampledNll(theta, x, y, step))
      else:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=layer.Logits(theta, x)))
    opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))

  for i in range(steps):
    Step(*Batch(i), tf.constant(i, tf.int64))
  x, y = Batch(10**6, n=4096)
  theta = layer.theta.copy()
  theta.w, theta.b = w, b
  nll = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=y, logits=layer.Logits(theta, x))).numpy()
  return float(nll), float(entropy)


def test_sampled_training_converges_to_the_full_softmax_loss():
  """Trained on S log-uniform samples of 200 classes per batch, the
  full-softmax NLL approaches full-softmax training's as S grows: within
  5% at S = 50 (measured 2.5%), and S = 10 is further away."""
  full, entropy = _Train(0)
  s10, _ = _Train(10)
  s50, _ = _Train(50)
  assert full < 1.1 * entropy, (full, entropy)
  assert abs(s50 - full) / full < 0.05, (s50, full, entropy)
  assert s10 - full > s50 - full, (s10, s50, full)
  assert s10 < math.log(200), s10
