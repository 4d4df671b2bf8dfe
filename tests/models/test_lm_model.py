"""LMTask (Shazeer et al. 2017 App. C.1): perplexity over words including
</s>, the aux loss added once, sigmoid before dropout, hierarchical MoE."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import balanced
from lingshard.layers.moe import hierarchical
from lingshard.layers.moe import noisy_top_k
from lingshard.models import lm_model
from lingshard.nested_map import NestedMap

_V, _M = 11, 8


def _Params(moe=None, **kw):
  return lm_model.LMTask.Params().Set(name='lm', vocab_size=_V, model_dim=_M,
                                      moe_tpl=moe, **kw)


def _Noisy(**kw):
  return noisy_top_k.NoisyTopKMoELayer.Params().Set(
      hidden_dim=16, num_experts=4, num_experts_per_token=2,
      output_activation='sigmoid', num_groups=1, **kw)


def _Batch(seed=0, b=3, t=5):
  rng = np.random.RandomState(seed)
  ids = rng.randint(4, _V, size=[b, t]).astype(np.int32)
  labels = rng.randint(2, _V, size=[b, t]).astype(np.int32)
  paddings = np.zeros([b, t], np.float32)
  paddings[1, 3:] = 1.0
  return NestedMap(ids=ids, labels=labels, paddings=paddings)


def test_log_pplx_is_per_word_including_end_of_sentence():
  """Two sentences of 2 and 1 words (+ </s> each): 5 predicted words."""
  task = _Params().Instantiate()
  logits = np.zeros([2, 3, _V], np.float32)
  logits[0, 0, 5] = math.log(4.0)   # p(w=5) = 4 / (V + 3).
  labels = np.array([[5, 6, 2], [7, 2, 0]], np.int32)
  paddings = np.array([[0, 0, 0], [0, 0, 1]], np.float32)
  metrics, per_example = task.ComputeLoss(
      task.theta, NestedMap(logits=tf.constant(logits), ffn_aux=NestedMap()),
      NestedMap(labels=labels, paddings=paddings))
  want = (-math.log(4.0 / (_V + 3)) + 4 * math.log(_V)) / 5
  np.testing.assert_allclose(metrics.log_pplx[0].numpy(), want, rtol=1e-6)
  assert metrics.num_words[0].numpy() == 5.0
  np.testing.assert_allclose(per_example.num_tokens.numpy(), [3.0, 2.0])


def test_aux_loss_is_added_once_and_routing_metrics_reported():
  task = _Params(_Noisy()).Instantiate()
  metrics, _ = task.FProp(task.theta, _Batch(), step=tf.constant(3))
  loss, log_pplx, aux = (metrics[k][0].numpy()
                         for k in ('loss', 'log_pplx', 'aux_loss'))
  # loss = per-word NLL + the layer's (already weighted) aux loss, once.
  assert aux > 0
  np.testing.assert_allclose(loss - log_pplx, aux, rtol=1e-5)
  assert any(k.startswith('moe_') for k in metrics), sorted(metrics)


def test_moe_output_goes_through_a_sigmoid_before_dropout_and_residual():
  """With dropout 0: the MoE block adds sigmoid(MoE(x)) in (0, 1)."""
  task = _Params(_Noisy(noisy_gating=False), dropout_prob=0.0,
                 num_lstm_after=0).Instantiate()
  batch = _Batch()
  theta = task.theta
  x = task.emb.FProp(theta.emb, batch.ids)
  x += task.lstm_before[0].FProp(theta.lstm_before[0], x, batch.paddings)
  y, _ = task.moe.FProp(theta.moe, x, batch.paddings)
  real = y.numpy()[batch.paddings == 0]  # Padded positions are 0.
  assert np.all(real > 0) and np.all(real < 1)
  assert not y.numpy()[batch.paddings == 1].any()
  got = task.ComputePredictions(theta, batch).logits
  want = task.softmax.Logits(theta.softmax, x + y)
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_moe_path_shapes_and_dropout_after_the_sigmoid():
  """Dropout 0.5 on: the MoE block adds dropout(sigmoid(MoE(x))), so a
  dropped activation adds exactly 0 (sigmoid(dropout(.)) would add 0.5)
  and a kept one sigmoid / 0.5 in (0, 2)."""
  task = _Params(_Noisy(noisy_gating=False), dropout_prob=0.5,
                 num_lstm_after=0).Instantiate()
  batch, step = _Batch(b=4, t=6), tf.constant(5)
  theta = task.theta
  x = task.dropout[0].FProp(theta.dropout[0],
                            task.emb.FProp(theta.emb, batch.ids), step=step)
  x += task.dropout[1].FProp(
      theta.dropout[1],
      task.lstm_before[0].FProp(theta.lstm_before[0], x, batch.paddings),
      step=step)
  y, aux = task.moe.FProp(theta.moe, x, batch.paddings, step=step)
  assert x.shape == y.shape == (4, 6, _M)
  assert aux.metrics.load.shape == (4,)
  added = task.dropout[2].FProp(theta.dropout[2], y, step=step).numpy()
  real = added[batch.paddings == 0]
  dropped = real == 0.0
  assert 0.3 < dropped.mean() < 0.7, dropped.mean()
  assert np.all((real[~dropped] > 0) & (real[~dropped] < 2))
  got = task.ComputePredictions(theta, batch, step=step).logits
  assert got.shape == (4, 6, _V)
  want = task.softmax.Logits(theta.softmax, x + added)
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_sampled_softmax_trains_and_eval_uses_the_full_softmax():
  """num_sampled > 0: training reports sampled_nll (no log_pplx); the
  inference task on the same theta reports the full-softmax log_pplx."""
  p = _Params(_Noisy(), num_sampled=4)
  task = p.Instantiate()
  metrics, _ = task.FProp(task.theta, _Batch(), step=tf.constant(2))
  assert 'sampled_nll' in metrics and 'log_pplx' not in metrics
  np.testing.assert_allclose(
      metrics.loss[0].numpy(),
      metrics.sampled_nll[0].numpy() + metrics.aux_loss[0].numpy(), rtol=1e-6)
  infer = lm_model.LMTask.InferenceParams(p).Instantiate()
  full = _Params(_Noisy(is_inference=True)).Set(is_inference=True)
  full_task = full.Instantiate()
  got, _ = infer.FProp(task.theta, _Batch(), step=tf.constant(2))
  want, _ = full_task.FProp(task.theta, _Batch(), step=tf.constant(2))
  assert 'sampled_nll' not in got
  np.testing.assert_allclose(got.log_pplx[0].numpy(),
                             want.log_pplx[0].numpy(), rtol=1e-6)


@pytest.mark.parametrize('moe', ['hierarchical', 'balanced', 'none'])
def test_one_train_step_gives_finite_loss_and_every_gradient(moe):
  """Hierarchical (§B) and strictly balanced (App. F) gating inside the LM:
  routing metrics reported, every weight trained."""
  tpl = None
  if moe == 'hierarchical':
    tpl = hierarchical.HierarchicalMoELayer.Params().Set(
        hidden_dim=16, num_experts=8, num_expert_groups=2,
        output_activation='sigmoid', num_groups=1)
  elif moe == 'balanced':
    tpl = balanced.BalancedMoELayer.Params().Set(
        hidden_dim=16, num_experts=4, output_activation='sigmoid',
        num_groups=1)
  # Batchwise gating is group-level: the LM must accept it explicitly.
  task = _Params(tpl, allow_noncausal_routing=moe == 'balanced').Instantiate()
  metrics, _, grads = tf.function(task.LossAndGradients)(
      task.theta, _Batch(), step=tf.constant(1))
  assert np.isfinite(metrics.loss[0].numpy())
  if tpl is not None:
    assert metrics.moe_load[0].shape == (tpl.num_experts,)
    assert np.isfinite(metrics.moe_cv_load[0].numpy())
  for key, g in grads.FlattenItems():
    assert np.all(np.isfinite(g.numpy())), key
    if not key.startswith('emb'):
      assert np.any(g.numpy()), key
