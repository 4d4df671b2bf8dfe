"""The capacity probe at toy size (issue 31): on a fixed small training
set, at equal matmul FLOPs per token, the MoE layer with more weights
reaches a lower training loss than the dense FFN after the same steps.

Task: memorise N fixed random inputs x_n ~ N(0, I_M) (what a pre-norm
Transformer layer feeds its FFN) to random classes c_n in [0, M): the
layer's M outputs are the logits, so the layer's own weights are the only
weights and the only place to store the N random labels. The layers are
the project's: m4.TinyMoE's MoE layer params (GShard top-2, capacity
factor 1.0, the random second-expert policy, group aux loss weight 0.01,
the config's groups and dispatch) at toy dims, and the Transformer's dense
FFN (ffn.FeedForward) of hidden 2H + E/2: the same matmul FLOPs per token,
M E (gate `GSM,ME->GSE`) + 2 * 2 M H (two experts) = 2 M (2H + E/2), the
rule of m4.TINY_DENSE_HIDDEN for one layer. Same optimiser (Adam, with
TinyTrain's clipping by global norm), steps and data for both; the MoE's
loss adds its aux loss as the task does.
"""

import numpy as np
import tensorflow as tf

from lingshard.layers import ffn
from lingshard.optim import adam
from lingshard.params import m4

M, H, E = 32, 16, 8   # Model dim (= classes), expert hidden, experts.
DENSE_HIDDEN = 2 * H + E // 2
N = 1024              # Tokens of the fixed training set, one batch.
STEPS = 80
LEARNING_RATE = 1e-2
SEEDS = (1, 2, 3)


def _Data():
  """x [1, N, M] float32, labels [1, N] int32, paddings [1, N] (none)."""
  rng = np.random.RandomState(0)
  x = rng.normal(size=[1, N, M]).astype(np.float32)
  labels = rng.randint(0, M, size=[1, N]).astype(np.int32)
  return tf.constant(x), tf.constant(labels), tf.zeros([1, N])


def _MoEParams():
  """m4.TinyMoE's MoE layer params (gate, capacity, policy, aux weight,
  groups, dispatch) at the toy dims."""
  p = m4.TinyMoE().Task().moe_tpl.Copy()
  return p.Set(name='moe', input_dim=M, hidden_dim=H, num_experts=E)


def _DenseParams():
  return ffn.FeedForward.Params().Set(name='ffn', input_dim=M,
                                      hidden_dim=DENSE_HIDDEN)


def _MatmulFlopsPerToken(layer):
  """Multiply-adds per token: every [.., M, H] weight once, experts k = 2
  times of their E (a weight [E, M, H] counts M H per choice)."""
  total = 0
  for w in layer.theta.Flatten():
    shape = w.shape.as_list()
    if len(shape) == 3:
      total += 2 * shape[1] * shape[2]
    elif len(shape) == 2:
      total += shape[0] * shape[1]
  return total


def _Train(params, seed):
  """The final training cross-entropy (nats) of `params` at `seed`."""
  layer = params.Copy().Set(random_seed=seed).Instantiate()
  x, labels, paddings = _Data()
  opt = adam.Adam.Params().Instantiate()
  clip = m4.TinyMoE().Task().train.clip_gradient_norm_to_value
  theta = layer.theta.Transform(tf.convert_to_tensor)
  state = opt.InitState(theta)

  def Xent(theta, step):
    logits, aux = layer.FProp(theta, x, paddings, step=step)
    xent = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    return xent, aux.get('aux_loss', 0.0)

  @tf.function
  def Step(theta, state, step):
    with tf.GradientTape() as tape:
      tape.watch(theta.Flatten())
      xent, aux_loss = Xent(theta, step)
      loss = xent + aux_loss
    grads, _ = tf.clip_by_global_norm(
        tape.gradient(loss, theta.Flatten()), clip)
    return opt.Apply(theta, theta.Pack(grads), state, LEARNING_RATE, step)

  for step in range(STEPS):
    theta, state = Step(theta, state, tf.constant(step, tf.int64))
  return float(Xent(theta, tf.constant(STEPS, tf.int64))[0])


def test_the_layers_have_equal_matmul_flops_and_moe_more_weights():
  moe, dense = _MoEParams().Instantiate(), _DenseParams().Instantiate()
  assert _MatmulFlopsPerToken(moe) == _MatmulFlopsPerToken(dense) == 2304
  assert moe.theta.wi.shape.as_list() == [E, M, H]
  n_moe = sum(w.shape.num_elements() for w in moe.theta.Flatten())
  n_dense = sum(w.shape.num_elements() for w in dense.theta.Flatten())
  assert (n_moe, n_dense) == (8448, 2372)


def test_each_expert_is_initialised_as_a_dense_ffn_of_its_shape():
  """The stacked wi [E, M, H] / wo [E, H, M] take their fans per expert
  (M and H, not E * M): each expert starts as the dense FFN of hidden H
  does (Xavier: sd = sqrt(2 / (M + H)))."""
  m, h, e = 64, 96, 8
  moe = _MoEParams().Set(input_dim=m, hidden_dim=h,
                         num_experts=e).Instantiate()
  dense = ffn.FeedForward.Params().Set(name='ffn', input_dim=m,
                                       hidden_dim=h).Instantiate()
  want = np.sqrt(2.0 / (m + h))
  for expert_w, dense_w in ((moe.theta.wi, dense.theta.fc_in.w),
                            (moe.theta.wo, dense.theta.fc_out.w)):
    assert expert_w.shape[1:] == dense_w.shape
    np.testing.assert_allclose(np.std(dense_w.numpy()), want, rtol=0.03)
    np.testing.assert_allclose(np.std(expert_w.numpy(), axis=(1, 2)),
                               [want] * e, rtol=0.03)


def test_moe_memorises_more_than_its_flop_matched_dense_twin():
  moe = [_Train(_MoEParams(), s) for s in SEEDS]
  dense = [_Train(_DenseParams(), s) for s in SEEDS]
  print(f'final training xent: moe {moe}, dense {dense}')
  # Beyond the spread: every MoE seed below every dense seed.
  assert max(moe) < min(dense), (moe, dense)
