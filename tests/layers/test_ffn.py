"""Dense FeedForward against numpy; hidden dropout only in training."""

import numpy as np

from lingshard.layers import ffn
from lingshard.nested_map import NestedMap


def _Layer(**kw):
  return ffn.FeedForward.Params().Set(name='ffn', input_dim=4, hidden_dim=6,
                                      **kw).Instantiate()


def test_matches_numpy():
  layer = _Layer()
  t = layer.theta.Transform(lambda v: v.numpy())
  t.fc_in.b = np.linspace(-1, 1, 6).astype(np.float32)
  t.fc_out.b = np.ones(4, np.float32)
  x = np.random.RandomState(0).normal(size=[2, 3, 4]).astype(np.float32)
  want = np.maximum(x @ t.fc_in.w + t.fc_in.b, 0) @ t.fc_out.w + t.fc_out.b
  y, aux = layer.FProp(t, x, np.zeros([2, 3], np.float32))
  np.testing.assert_allclose(y.numpy(), want, atol=1e-5)
  assert aux == NestedMap()  # The FFN contract: a dense FFN adds no aux.


def test_hidden_dropout():
  x = np.random.RandomState(0).normal(size=[2, 3, 4]).astype(np.float32)
  drop = _Layer(activation_dropout_prob=0.5)
  a, b = (drop.FProp(drop.theta, x, step=s)[0].numpy() for s in (1, 2))
  assert np.abs(a - b).max() > 1e-3
  infer = _Layer(activation_dropout_prob=0.5, is_inference=True)
  np.testing.assert_allclose(infer.FProp(drop.theta, x, step=1)[0].numpy(),
                             _Layer().FProp(drop.theta, x)[0].numpy(),
                             atol=1e-6)


def test_weights_replicated_activations_batch_split():
  layer = _Layer()
  w = layer.DeclaredWeights()
  assert w.fc_in.w.tensor_split_dims_mapping == [-1, -1]
  assert w.fc_out.w.tensor_split_dims_mapping == [-1, -1]
  # The logical batch axis: mesh axis 0 unless batch_axes says otherwise.
  assert layer.fc_out.params.activation_split_dims_mapping.out == [
      'batch', -1, -1]
  assert layer.fc_out.params.batch_axes == 0
