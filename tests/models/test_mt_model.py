"""TransformerMTModel: loss and metrics, causality, padding invariance, MoE
placement, overfitting a fixed batch."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import noisy_top_k
from lingshard.layers import softmax
from lingshard.nested_map import NestedMap
from lingshard.train import step as step_lib
from tests.models import mt_testlib


def _Task(**kw):
  return mt_testlib.TinyParams(**kw).Instantiate()


def _Metrics(task, batch, step=0, theta=None):
  metrics, per_example = task.FProp(task.theta if theta is None else theta,
                                    batch,
                                    step=tf.constant(step, tf.int64))
  return {k: np.asarray(v[0]) for k, v in metrics.items()}, per_example


@pytest.mark.parametrize('use_moe', [False, True])
def test_loss_is_xent_plus_weighted_aux(use_moe):
  """The MoE layers weight their aux loss (aux_loss_weights.group_aux k); the task adds
  the sum as is: loss = xent + sum_l k * aux_l, k applied once."""
  p = mt_testlib.TinyParams(use_moe=use_moe, num_encoder_layers=4,
                            num_decoder_layers=2)
  if use_moe:
    p.moe_tpl.aux_loss_weights.group_aux = 0.3
  task = p.Instantiate()
  batch = mt_testlib.SyntheticBatch(task.params)
  m, per_example = _Metrics(task, batch)
  preds = task.ComputePredictions(task.theta, batch)
  ref = softmax.LabelSmoothedXent(preds.logits, batch.tgt.labels,
                                  batch.tgt.weights, 0.1)
  n = float(tf.reduce_sum(batch.tgt.weights))
  np.testing.assert_allclose(m['xent'], float(tf.reduce_sum(ref.xent)) / n,
                             rtol=1e-5)
  np.testing.assert_allclose(m['log_pplx'], float(tf.reduce_sum(ref.nll)) / n,
                             rtol=1e-5)
  assert m['num_tgt_tokens'] == n
  assert m['num_src_tokens'] == float(tf.reduce_sum(1 - batch.src.paddings))
  aux_keys = sorted(k for k in m if k.endswith('_aux_loss'))
  if use_moe:
    # Every other layer: encoder layers 1 and 3, decoder layer 1.
    assert aux_keys == ['dec_layer_001_aux_loss', 'enc_layer_001_aux_loss',
                        'enc_layer_003_aux_loss']
    assert 'enc_layer_003_over_capacity_first' in m
    assert m['enc_layer_003_over_capacity_first'] == 0.0  # Room for all.
    assert m['aux_loss'] > 0
  else:
    assert aux_keys == []
    assert m['aux_loss'] == 0.0
  np.testing.assert_allclose(
      m['aux_loss'], sum(m[k] for k in aux_keys), rtol=1e-6)
  for k in aux_keys:  # Each layer's aux = k * its unweighted GShard aux.
    np.testing.assert_allclose(
        m[k], 0.3 * m[k.replace('_aux_loss', '_group_aux')], rtol=1e-6)
  np.testing.assert_allclose(m['loss'], m['xent'] + m['aux_loss'], rtol=1e-6)
  np.testing.assert_allclose(per_example.xent.numpy().sum() / n, m['xent'],
                             rtol=1e-5)


@pytest.mark.parametrize('use_moe', [False, True])
def test_changing_a_future_target_token_changes_no_earlier_output(use_moe):
  # MoE layers have room for every token: with drops, a later token's first
  # choice can take the slot of an earlier token's second choice.
  task = _Task(use_moe=use_moe)
  batch = mt_testlib.SyntheticBatch(task.params, tgt_len=6,
                                    tgt_lengths=[6, 6, 6])
  logits = task.ComputePredictions(task.theta, batch).logits.numpy()
  ids = batch.tgt.ids.numpy()
  ids[:, 4] = (ids[:, 4] + 5) % task.params.tgt_vocab_size
  batch.tgt.ids = tf.constant(ids)
  changed = task.ComputePredictions(task.theta, batch).logits.numpy()
  np.testing.assert_allclose(changed[:, :4], logits[:, :4], atol=1e-5)
  assert np.abs(changed[:, 4:] - logits[:, 4:]).max() > 1e-4


@pytest.mark.parametrize('use_moe', [False, True])
def test_extra_padding_changes_no_loss(use_moe):
  task = _Task(use_moe=use_moe)
  kw = dict(batch_size=3, seed=4, src_lengths=[3, 6, 2],
            tgt_lengths=[5, 2, 4])
  short = mt_testlib.SyntheticBatch(task.params, src_len=6, tgt_len=5, **kw)
  long = mt_testlib.SyntheticBatch(task.params, src_len=9, tgt_len=8, **kw)
  # Same real tokens; the longer batch has junk ids under its paddings.
  for side, n in (('src', 6), ('tgt', 5)):
    for key in ('ids', 'labels') if side == 'tgt' else ('ids',):
      short_ids = short[side][key].numpy()
      long_ids = long[side][key].numpy()
      long_ids[:, :n] = short_ids
      long_ids[:, n:] = 7
      long[side][key] = tf.constant(long_ids)
  m_short, ex_short = _Metrics(task, short)
  m_long, ex_long = _Metrics(task, long)
  for key in m_short:
    if key.endswith('_capacity'):
      continue  # Dropless C = S: the group size, which padding changes.
    np.testing.assert_allclose(m_long[key], m_short[key], rtol=1e-5,
                               atol=1e-6, err_msg=key)
  np.testing.assert_allclose(ex_long.xent, ex_short.xent, rtol=1e-5)


def test_shared_target_embedding_softmax():
  task = _Task(share_tgt_embedding_softmax=True)
  assert 'softmax' not in task.children
  batch = mt_testlib.SyntheticBatch(task.params)
  _, _, grads = task.LossAndGradients(task.theta, batch)
  # The target table gets gradient from both lookups and logits.
  assert float(tf.reduce_max(tf.abs(grads.tgt_emb.emb))) > 0
  m, _ = _Metrics(task, batch)
  assert np.isfinite(m['loss'])


def test_shared_source_target_table():
  task = _Task(src_vocab_size=19, share_src_tgt_embedding=True,
               share_tgt_embedding_softmax=True)
  assert 'src_emb' not in task.children and 'softmax' not in task.children
  batch = mt_testlib.SyntheticBatch(task.params)
  # The source side reads the one table: changing a row only the source
  # uses changes the loss.
  src_only = sorted(set(batch.src.ids.numpy().ravel()) -
                    set(batch.tgt.ids.numpy().ravel()) -
                    set(batch.tgt.labels.numpy().ravel()) - {0})
  assert src_only
  theta = task.theta.Transform(tf.convert_to_tensor)
  base = _Metrics(task, batch, theta=theta)[0]['loss']
  theta.tgt_emb.emb = tf.tensor_scatter_nd_add(
      theta.tgt_emb.emb, [[src_only[0]]],
      tf.random.stateless_normal([1, 16], seed=[3, 4]))
  assert _Metrics(task, batch, theta=theta)[0]['loss'] != base
  _, _, grads = task.LossAndGradients(task.theta, batch)
  assert float(tf.reduce_max(tf.abs(grads.tgt_emb.emb[src_only[0]]))) > 0
  with pytest.raises(ValueError, match=r'share_src_tgt_embedding needs one '
                     r'vocabulary: src_vocab_size 23 != tgt_vocab_size 19'):
    _Task(share_src_tgt_embedding=True)


def test_dropout_uses_the_step():
  task = _Task(residual_dropout_prob=0.2, input_dropout_prob=0.2)
  batch = mt_testlib.SyntheticBatch(task.params)
  assert _Metrics(task, batch, 1)[0] == _Metrics(task, batch, 1)[0]
  assert _Metrics(task, batch, 1)[0]['loss'] != _Metrics(task, batch,
                                                         2)[0]['loss']


@pytest.mark.parametrize('use_moe', [False, True])
def test_tiny_model_overfits_a_fixed_batch(use_moe):
  p = mt_testlib.TinyParams(use_moe=use_moe)
  p.train.Set(optimizer='adam', learning_rate=3e-3, lr_schedule='constant')
  task = p.Instantiate()
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=4, seed=2)
  step_fn = step_lib.TrainStep(task)
  theta = task.theta.Transform(tf.convert_to_tensor)
  opt_state = step_fn.InitOptState(theta)
  losses = []
  for i in range(60):
    theta, opt_state, metrics = step_fn(theta, opt_state, batch,
                                        tf.constant(i, tf.int64))
    losses.append(float(metrics.log_pplx[0]))
  assert losses[-1] < 0.25 * losses[0], losses[::10]


def test_predictions_keep_per_expert_metrics():
  task = _Task(use_moe=True)
  preds = task.ComputePredictions(task.theta,
                                  mt_testlib.SyntheticBatch(task.params))
  per_expert = preds.ffn_aux.enc.layer_001.metrics.tokens_per_expert_first
  assert per_expert.shape == (4,)
  np.testing.assert_allclose(float(tf.reduce_sum(per_expert)), 1.0, rtol=1e-5)
  assert isinstance(preds.ffn_aux.dec, NestedMap)


def test_noisy_layers_loss_is_xent_plus_their_weighted_cv_terms():
  """Noisy top-k layers weight L_importance + L_load themselves
  (w * CV^2, Shazeer et al. eqs. 7, 11); the task adds them once."""
  p = mt_testlib.TinyParams()
  p.moe_tpl = noisy_top_k.NoisyTopKMoELayer.Params().Set(
      num_experts=4, num_groups=1, **{'aux_loss_weights.importance': 0.2,
                                      'aux_loss_weights.load': 0.3})
  task = p.Instantiate()
  # Non-zero gating weights (App. A starts them at 0: a uniform gate).
  theta = task.theta.Transform(tf.identity)
  rng = np.random.RandomState(0)
  for stack in (theta.enc, theta.dec):
    for lt in (stack.layer[1],):
      lt.moe.wg = tf.constant(rng.normal(size=[16, 4]), tf.float32)
      lt.moe.w_noise = tf.constant(rng.normal(size=[16, 4]), tf.float32)
  m, _ = _Metrics(task, mt_testlib.SyntheticBatch(task.params), step=3,
                  theta=theta)

  def Cv2(v):
    return v.var() / v.mean()**2

  layer_terms = sum(m[f'{prefix}_importance_loss'] + m[f'{prefix}_load_loss']
                    for prefix in ('enc_layer_001', 'dec_layer_001'))
  np.testing.assert_allclose(m['loss'], m['xent'] + layer_terms, rtol=1e-5)
  want = 0.0
  for prefix in ('enc_layer_001', 'dec_layer_001'):
    importance, load = m[f'{prefix}_importance'], m[f'{prefix}_load']
    assert importance.shape == load.shape == (4,)  # Per-expert vectors.
    want += 0.2 * Cv2(importance) + 0.3 * Cv2(load)
  assert want > 1e-3
  np.testing.assert_allclose(m['aux_loss'], want, rtol=1e-4)
  np.testing.assert_allclose(m['loss'], m['xent'] + want, rtol=1e-5)
