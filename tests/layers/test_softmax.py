"""Softmax logits and label-smoothed cross-entropy with padding."""

import numpy as np
import pytest

from lingshard.layers import softmax


def _LogSoftmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize('eps', [0.0, 0.1])
def test_label_smoothed_xent_matches_numpy(eps):
  rng = np.random.RandomState(0)
  logits = rng.normal(size=[2, 3, 5]).astype(np.float32)
  labels = rng.randint(0, 5, [2, 3]).astype(np.int32)
  weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  out = softmax.LabelSmoothedXent(logits, labels, weights, eps)
  logp = _LogSoftmax(logits)
  q = (1 - eps) * np.eye(5)[labels] + eps / 5
  want_xent = -(q * logp).sum(-1) * weights
  want_nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0] * weights
  np.testing.assert_allclose(out.xent.numpy(), want_xent, atol=1e-5)
  np.testing.assert_allclose(out.nll.numpy(), want_nll, atol=1e-5)
  assert not out.xent.numpy()[weights == 0].any()


def test_softmax_layer_logits():
  layer = softmax.SoftmaxLayer.Params().Set(
      name='sm', input_dim=4, num_classes=3).Instantiate()
  t = layer.theta.Transform(lambda v: v.numpy())
  t.b = np.array([1.0, 0.0, -1.0], np.float32)
  x = np.random.RandomState(0).normal(size=[2, 2, 4]).astype(np.float32)
  np.testing.assert_allclose(layer.Logits(t, x).numpy(), x @ t.w + t.b,
                             atol=1e-5)
