"""MultiHeadAttention against a numpy per-head loop; masks; incremental."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import attention


def _Layer(**kw):
  p = attention.MultiHeadAttention.Params().Set(
      name='att', input_dim=8, num_heads=2, dim_per_head=3)
  return p.Set(**kw).Instantiate()


def _NumpyAttention(theta, q_tm, k_sm, keep_ts):
  """One sentence, head by head (Vaswani et al. §3.2.2)."""
  wq, wk, wv, wo = (theta[w].numpy() for w in ('wq', 'wk', 'wv', 'wo'))
  out = np.zeros([q_tm.shape[0], wo.shape[-1]])
  for n in range(wq.shape[1]):
    q, k, v = q_tm @ wq[:, n], k_sm @ wk[:, n], k_sm @ wv[:, n]
    logits = q @ k.T / np.sqrt(q.shape[-1])
    logits = np.where(keep_ts > 0, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out += (probs @ v) @ wo[n]
  return out


def _Inputs(b=2, t=5, s=4, m=8, seed=0):
  rng = np.random.RandomState(seed)
  return (rng.normal(size=[b, t, m]).astype(np.float32),
          rng.normal(size=[b, s, m]).astype(np.float32))


def test_cross_attention_with_padding_matches_numpy():
  layer = _Layer()
  q, k = _Inputs()
  paddings = np.array([[0, 0, 0, 1], [0, 0, 1, 1]], np.float32)
  got = layer.FProp(layer.theta, q, k, paddings).numpy()
  for b in range(2):
    keep = np.tile(1 - paddings[b][None], [5, 1])
    np.testing.assert_allclose(got[b], _NumpyAttention(layer.theta, q[b], k[b],
                                                       keep), atol=1e-5)


def test_causal_self_attention_matches_numpy_and_ignores_the_future():
  layer = _Layer()
  q, _ = _Inputs()
  got = layer.FProp(layer.theta, q, causal=True).numpy()
  keep = np.tril(np.ones([5, 5]))
  np.testing.assert_allclose(got[0], _NumpyAttention(layer.theta, q[0], q[0],
                                                     keep), atol=1e-5)
  changed = q.copy()
  changed[:, 3] += 10.0
  got2 = layer.FProp(layer.theta, changed, causal=True).numpy()
  np.testing.assert_allclose(got2[:, :3], got[:, :3], atol=1e-6)
  assert np.abs(got2[:, 3:] - got[:, 3:]).max() > 1e-3


def test_padded_keys_do_not_matter():
  layer = _Layer()
  q, k = _Inputs()
  paddings = np.array([[0, 0, 1, 1]] * 2, np.float32)
  a = layer.FProp(layer.theta, q, k, paddings).numpy()
  k2 = k.copy()
  k2[:, 2:] = 123.0
  b = layer.FProp(layer.theta, q, k2, paddings).numpy()
  np.testing.assert_allclose(a, b, atol=1e-6)


def test_extend_step_equals_causal_fprop():
  layer = _Layer()
  x, _ = _Inputs(t=6)
  full = layer.FProp(layer.theta, x, causal=True).numpy()
  cache = layer.InitCache(2, 6)
  for t in range(6):
    mask = np.tile((np.arange(6) <= t)[None, None], [2, 1, 1]).astype(
        np.float32)
    out, cache = layer.ExtendStep(layer.theta, x[:, t:t + 1], cache,
                                  tf.constant([t]), mask)
    np.testing.assert_allclose(out.numpy()[:, 0], full[:, t], atol=1e-5)


def test_extend_step_writes_several_positions():
  layer = _Layer()
  x, _ = _Inputs(t=4)
  cache = layer.InitCache(2, 8)
  # Q = 2 queries written at positions 5 and 2; each sees itself only.
  mask = np.zeros([2, 2, 8], np.float32)
  mask[:, 0, 5] = mask[:, 1, 2] = 1
  out, cache = layer.ExtendStep(layer.theta, x[:, :2], cache,
                                tf.constant([5, 2]), mask)
  kv = layer.ProjectKeyValue(layer.theta, x[:, :2])
  np.testing.assert_allclose(cache.k.numpy()[:, [5, 2]], kv.k.numpy(),
                             atol=1e-6)
  assert not cache.k.numpy()[:, [0, 1, 3, 4, 6, 7]].any()
  alone = layer.FProp(layer.theta, x[:, :1], causal=True).numpy()
  np.testing.assert_allclose(out.numpy()[:, :1], alone, atol=1e-5)


def test_attention_dropout_only_in_training():
  x, _ = _Inputs()
  train = _Layer(atten_dropout_prob=0.5)
  a = train.FProp(train.theta, x, step=1).numpy()
  b = train.FProp(train.theta, x, step=2).numpy()
  assert np.abs(a - b).max() > 1e-3
  np.testing.assert_array_equal(a, train.FProp(train.theta, x, step=1))
  infer = _Layer(atten_dropout_prob=0.5, is_inference=True)
  c = infer.FProp(train.theta, x, step=1).numpy()
  np.testing.assert_allclose(
      c, _Layer().FProp(train.theta, x).numpy(), atol=1e-6)


def test_errors():
  with pytest.raises(ValueError, match='must be > 0'):
    _Layer(num_heads=0)
  layer = _Layer()
  q, k = _Inputs()
  with pytest.raises(ValueError, match='causal masking is for self-attention'):
    layer.FProp(layer.theta, q, k, causal=True)
