"""Adam and SGD against numpy references (Kingma & Ba 2015, Algorithm 1)."""

import numpy as np
import tensorflow as tf

from lingshard.nested_map import NestedMap
from lingshard.optim import adam
from lingshard.optim import base


def test_adam_matches_algorithm_1():
  rng = np.random.RandomState(0)
  x = rng.normal(size=[3, 4])
  grads = [rng.normal(size=[3, 4]) for _ in range(5)]
  lrs = [0.1, 0.05, 0.05, 0.02, 0.01]
  b1, b2, eps = 0.8, 0.99, 1e-6
  m = v = np.zeros_like(x)
  want = x.copy()
  for t, (g, lr) in enumerate(zip(grads, lrs), 1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    want = want - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
  opt = adam.Adam.Params().Set(beta1=b1, beta2=b2, epsilon=eps).Instantiate()
  theta = NestedMap(a=[NestedMap(w=tf.constant(x, tf.float32))])
  state = opt.InitState(theta)
  for step, (g, lr) in enumerate(zip(grads, lrs)):
    grad = NestedMap(a=[NestedMap(w=tf.constant(g, tf.float32))])
    theta, state = opt.Apply(theta, grad, state, lr,
                             tf.constant(step, tf.int64))
  np.testing.assert_allclose(theta.a[0].w.numpy(), want, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(state.a[0].w.m.numpy(), m, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(state.a[0].w.v.numpy(), v, rtol=1e-5, atol=1e-7)


def test_sgd_has_no_slots():
  opt = base.Sgd.Params().Instantiate()
  theta = NestedMap(w=tf.constant([1.0, 2.0]))
  state = opt.InitState(theta)
  assert state.Flatten() == []
  new, _ = opt.Apply(theta, NestedMap(w=tf.constant([0.5, -1.0])), state,
                     0.1, tf.constant(0, tf.int64))
  np.testing.assert_allclose(new.w.numpy(), [0.95, 2.1])


def test_flatten_slots_follows_theta_order():
  theta = NestedMap(b=tf.zeros([2]), a=[tf.zeros([3]), tf.zeros([4])])
  opt = adam.Adam.Params().Instantiate()
  slots = base.FlattenSlots(theta, opt.InitState(theta))
  assert [s.m.shape.as_list() for s in slots] == [[3], [4], [2]]
