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

  def UpdateOne(self, value, grad, slots, lr, step):
    p = self.params
    g = tf.cast(grad, tf.float32)
    t = tf.cast(step, tf.float32) + 1.0
    m = p.beta1 * slots.m + (1.0 - p.beta1) * g
    v = p.beta2 * slots.v + (1.0 - p.beta2) * tf.square(g)
    m_hat = m / (1.0 - tf.pow(p.beta1, t))
    v_hat = v / (1.0 - tf.pow(p.beta2, t))
    delta = tf.cast(lr, tf.float32) * m_hat / (tf.sqrt(v_hat) + p.epsilon)
    new_value = tf.cast(tf.cast(value, tf.float32) - delta, value.dtype)
    return new_value, NestedMap(m=m, v=v)
