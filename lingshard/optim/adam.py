"""Adam (Kingma & Ba 2015, Algorithm 1) as a pure per-weight update.

  m' = b1 m + (1 - b1) g          v' = b2 v + (1 - b2) g^2
  w' = w - lr * (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps)

with t = step + 1 the 1-based number of this update.
"""

import tensorflow as tf

from lingshard.nested_map import NestedMap
from lingshard.optim import base


class Adam(base.BaseOptimizer):
  """Adam with bias correction; slots `m`, `v` in float32."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('beta1', 0.9, 'Decay of the first moment.')
    p.Define('beta2', 0.999, 'Decay of the second moment.')
    p.Define('epsilon', 1e-8, 'Added to sqrt(v_hat) in the denominator.')
    return p

  def InitSlots(self, value):
    zeros = tf.zeros(value.shape, tf.float32)
    return NestedMap(m=zeros, v=zeros)

  def StepScalars(self, lr, step):
    """float32 scalars: the decays, 1 - b^t of both moments, lr, eps."""
    p = self.params
    t = tf.cast(step, tf.float32) + 1.0
    c = NestedMap({k: tf.constant(v, tf.float32) for k, v in (
        ('b1', p.beta1), ('b2', p.beta2), ('one_minus_b1', 1.0 - p.beta1),
        ('one_minus_b2', 1.0 - p.beta2), ('eps', p.epsilon))})
    c.bias1 = 1.0 - tf.pow(p.beta1, t)
    c.bias2 = 1.0 - tf.pow(p.beta2, t)
    c.lr = tf.cast(lr, tf.float32)
    return c

  def UpdateOne(self, value, grad, slots, scalars):
    c = scalars
    g = tf.cast(grad, tf.float32)
    m = c.b1 * slots.m + c.one_minus_b1 * g
    v = c.b2 * slots.v + c.one_minus_b2 * tf.square(g)
    m_hat = m / c.bias1
    v_hat = v / c.bias2
    delta = c.lr * m_hat / (tf.sqrt(v_hat) + c.eps)
    new_value = tf.cast(tf.cast(value, tf.float32) - delta, value.dtype)
    return new_value, NestedMap(m=m, v=v)
