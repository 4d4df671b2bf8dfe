"""Auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): a per-expert bias
steers the top-k selection only (gate values stay unbiased), its gradient
slot carries the batch's load counts (summed over a pipeline's
micro-batches like a gradient), and the train step applies
b += gamma * sign(mean(c) - c) instead of an optimizer update."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import balanced
from lingshard.layers.moe import bias_balance
from lingshard.layers.moe import noisy_top_k
from lingshard.layers.moe import top2
from lingshard.train import step as step_lib
from tests.layers import test_pipeline_moe as pipeline_moe
from tests.models import mt_testlib

B, T, M, H, E = 4, 6, 5, 8, 4
RATE = 0.01


def _Inputs():
  rng = np.random.RandomState(0)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = np.zeros([B, T], np.float32)
  pad[:, -2:] = rng.rand(B, 2) < 0.5
  return x, pad


def _Top2(**kw):
  return top2.MoELayer.Params().Set(
      name='moe', input_dim=M, hidden_dim=H, num_experts=E, num_groups=2,
      capacity_factor=None, dispatch_impl='einsum',
      **dict(dict(selection_bias_rate=RATE), **kw)).Instantiate()


def _Noisy(**kw):
  p = noisy_top_k.NoisyTopKMoELayer.Params().Set(
      name='moe', input_dim=M, hidden_dim=H, num_experts=E, num_groups=2,
      num_experts_per_token=2, params_init=top2.MoELayer.Params().params_init,
      **dict(dict(noisy_gating=False, selection_bias_rate=RATE), **kw))
  return p.Instantiate()


def _Softmax(v):
  e = np.exp(v - v.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize('make', [_Top2, _Noisy])
def test_the_bias_picks_the_experts_and_the_gates_stay_unbiased(make):
  layer = make()
  if make is _Noisy:  # Zero-initialised router (App. A): give it values.
    layer.vars.wg.assign(0.3 * np.random.RandomState(1).normal(size=[M, E]))
  bias = np.array([0.0, 0.0, 0.0, 5.0], np.float32)
  layer.vars.selection_bias.assign(bias)
  x, pad = _Inputs()
  out, _, _ = layer.ComputeRouting(layer.theta, x, pad)
  logits = x.reshape([-1, M]) @ layer.vars.wg.numpy()
  probs = _Softmax(logits)
  # Selection by score + bias (top2 scores the gates, noisy the logits).
  scores = (probs if make is _Top2 else logits) + bias
  top = np.argsort(-scores, axis=-1, kind='stable')[:, :2]
  expert = out.expert_gsk.numpy().reshape([-1, 2])
  np.testing.assert_array_equal(expert, top)
  assert (expert[:, 0] == 3).all()
  # Gates from the unbiased scores: GShard's normalised g1, g2; noisy
  # top-k's softmax over the two kept logits.
  kept = np.take_along_axis(probs if make is _Top2 else logits, top, -1)
  want = (kept / kept.sum(-1, keepdims=True) if make is _Top2
          else _Softmax(kept))
  np.testing.assert_allclose(out.gate_gsk.numpy().reshape([-1, 2]), want,
                             rtol=1e-5)


def _BiasGrad(layer, scale):
  x, pad = _Inputs()
  cot = np.random.RandomState(2).normal(size=[B, T, M]).astype(np.float32)
  with tf.GradientTape() as tape:
    tape.watch(layer.vars.selection_bias)
    y, aux = layer.FProp(layer.theta, x, pad)
    loss = scale * tf.reduce_sum(y * cot) + aux.aux_loss
  return tape.gradient(loss, layer.vars.selection_bias).numpy()


def test_the_bias_gradient_slot_is_the_load_count():
  """Wanted choices per expert: every real token's first choice and the
  second choices GShard's random policy keeps (not padding, not the
  rejected seconds); not scaled by the loss."""
  layer = _Top2(second_expert_policy='random')
  layer.vars.selection_bias.assign([0.0, 0.3, 0.0, 0.0])
  x, pad = _Inputs()
  out, _, _ = layer.ComputeRouting(layer.theta, x, pad)
  real = (1.0 - pad).reshape([-1]) > 0
  expert = out.expert_gsk.numpy().reshape([-1, 2])
  kept = out.accept_gs.numpy().reshape([-1])
  assert 0 < kept[real].sum() < real.sum()  # Some seconds rejected.
  want = (np.bincount(expert[real, 0], minlength=E) +
          np.bincount(expert[real & kept, 1], minlength=E)).astype(np.float32)
  np.testing.assert_array_equal(_BiasGrad(layer, 1.0), want)
  np.testing.assert_array_equal(_BiasGrad(layer, 3.5), want)


def test_pipelined_counts_sum_over_micro_batches():
  """GShard in GPipe (remat, 2 stages, 2 micro-batches): each MoE layer's
  bias gradient is the plain per-layer loop's count on the whole batch."""
  p = pipeline_moe._StackParams(2, 2, True)
  p.moe_tpl.selection_bias_rate = RATE
  stack = p.Instantiate()
  watched = stack.theta.Flatten()

  def Grads(run):
    tape_cls = tf.GradientTape

    class Watching(tape_cls):
      def __enter__(self):
        out = super().__enter__()
        self.watch(watched)
        return out

    pipeline_moe.tf.GradientTape = Watching
    try:
      return run(stack)[2]
    finally:
      pipeline_moe.tf.GradientTape = tape_cls

  got = Grads(pipeline_moe._Pipelined).pipeline.layer[1].moe.selection_bias
  want = Grads(pipeline_moe._PlainLoop).pipeline.layer[1].moe.selection_bias
  np.testing.assert_array_equal(got.numpy(), want.numpy())
  assert got.numpy().sum() > 0


def test_the_train_step_applies_the_sign_rule_instead_of_the_optimizer():
  p = mt_testlib.TinyParams(use_moe=True)
  p.moe_tpl.Set(selection_bias_rate=RATE,
                **{'aux_loss_weights.group_aux': 0.0})
  task = p.Instantiate()
  batch = mt_testlib.SyntheticBatch(p, batch_size=4, src_len=6, tgt_len=5)
  train_step = step_lib.TrainStep(task)
  theta = task.theta.Transform(tf.convert_to_tensor)
  step = tf.constant(0, tf.int64)
  _, _, grads = task.LossAndGradients(theta, batch, step=step,
                                      example_offset=tf.constant(0, tf.int64))
  new_theta, _, metrics = train_step(theta, train_step.InitOptState(theta),
                                     batch, step)
  n_src = float((1.0 - batch.src.paddings.numpy()).sum())
  n_tgt = float((1.0 - batch.tgt.paddings.numpy()).sum())
  others = []
  for (key, old), new, grad in zip(theta.FlattenItems(),
                                   new_theta.Flatten(), grads.Flatten()):
    if not key.endswith('selection_bias'):
      others.append(grad.numpy())
      continue
    c = grad.numpy()
    assert c.sum() == 2 * (n_src if key.startswith('enc') else n_tgt), key
    np.testing.assert_allclose(
        new.numpy(), old.numpy() + RATE * np.sign(c.mean() - c), atol=1e-7)
    assert np.abs(new.numpy()).max() > 0
  # The counts are no share of the gradient norm.
  want_norm = np.sqrt(sum(np.square(g).sum() for g in others))
  np.testing.assert_allclose(metrics.grad_norm[0].numpy(), want_norm,
                             rtol=1e-5)
  assert train_step.count_update_rates.count(RATE) == 2


def test_off_creates_no_variable_and_bad_configs_are_one_line_errors():
  off = top2.MoELayer.Params().Set(name='moe', input_dim=M, hidden_dim=H,
                                   num_experts=E, num_groups=2).Instantiate()
  assert 'selection_bias' not in off.vars
  on = _Top2()
  assert not on.vars.selection_bias.trainable
  assert bias_balance.UpdatedBias(tf.zeros([2, E]), tf.constant(
      [[1.0, 2.0, 3.0, 6.0], [3.0, 3.0, 3.0, 3.0]]), 0.5).numpy().tolist() == [
          [0.5, 0.5, 0.0, -0.5], [0.0, 0.0, 0.0, 0.0]]  # mean 3: c=3 stays.
  with pytest.raises(ValueError) as e:
    balanced.BalancedMoELayer.Params().Set(
        name='moe', input_dim=M, hidden_dim=H, num_experts=E, num_groups=2,
        selection_bias_rate=RATE).Instantiate()
  assert str(e.value) == (
      'moe: selection_bias_rate needs a top-k gate (GShard top-2, noisy '
      'top-k); BalancedMoELayer does not select by per-token scores')
  with pytest.raises(ValueError) as e:
    _Top2(selection_bias_rate=-1.0)
  assert str(e.value) == 'moe: selection_bias_rate must be >= 0, got -1.0'
  with pytest.raises(ValueError) as e:
    _Noisy(noisy_gating=True)
  assert str(e.value) == (
      "moe: selection_bias_rate > 0 needs aux_loss_weights.load = 0 (eq. "
      "9's P(x, i) does not see the selection bias)")
