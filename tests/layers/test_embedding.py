"""EmbeddingLayer: lookups and the shared-softmax logits."""

import numpy as np
import pytest

from lingshard.layers import embedding


def _Layer(**kw):
  return embedding.EmbeddingLayer.Params().Set(
      name='emb', vocab_size=7, embedding_dim=4, **kw).Instantiate()


def test_lookup_is_scaled_table_rows():
  layer = _Layer()
  ids = np.array([[0, 6, 3], [3, 3, 1]], np.int32)
  table = layer.theta.emb.numpy()
  np.testing.assert_allclose(layer.FProp(layer.theta, ids).numpy(),
                             table[ids] * 2.0, rtol=1e-6)  # sqrt(4) = 2.
  plain = _Layer(scale_sqrt_depth=False)
  np.testing.assert_allclose(plain.FProp(layer.theta, ids).numpy(),
                             table[ids], rtol=1e-6)


def test_logits_use_the_same_table():
  layer = _Layer()
  x = np.random.RandomState(0).normal(size=[2, 3, 4]).astype(np.float32)
  np.testing.assert_allclose(layer.Logits(layer.theta, x).numpy(),
                             x @ layer.theta.emb.numpy().T, rtol=1e-5,
                             atol=1e-6)


def test_weight_is_replicated_by_default():
  wp = _Layer().DeclaredWeights().emb
  assert wp.shape == [7, 4] and wp.tensor_split_dims_mapping == [-1, -1]


def test_bad_dims():
  with pytest.raises(ValueError, match='vocab_size and embedding_dim must be'):
    embedding.EmbeddingLayer.Params().Set(vocab_size=0,
                                          embedding_dim=4).Instantiate()
