"""Conv2DLayer impl='patches': tf.nn.conv2d's sum, vectorised over stacked
filters (a pipeline body's stages) without a fallback loop."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import conv
from lingshard.nested_map import NestedMap


def _Layer(**kwargs):
  return conv.Conv2DLayer.Params().Set(name='conv', **kwargs).Instantiate()


@pytest.mark.parametrize('shape,stride,padding,hw', [
    ((3, 3, 3, 5), (1, 1), 'SAME', (7, 7)),
    ((3, 2, 3, 5), (2, 2), 'SAME', (7, 6)),
    ((3, 2, 3, 5), (2, 1), 'VALID', (7, 6)),
    ((2, 2, 3, 4), (2, 3), 'SAME', (8, 5)),
])
def test_patches_equal_conv2d(shape, stride, padding, hw):
  kw = dict(filter_shape=shape, filter_stride=stride, padding=padding)
  ref, got = _Layer(**kw), _Layer(impl='patches', **kw)
  x = np.random.RandomState(0).normal(size=[2, *hw, 3]).astype(np.float32)
  want = ref.FProp(ref.theta, x).numpy()
  np.testing.assert_allclose(got.FProp(ref.theta, x).numpy(), want,
                             rtol=1e-5, atol=1e-5)


def _WhileOps(graph):
  """The while-loop ops of a graph and of the functions it calls."""
  gd = graph.as_graph_def()
  ops = [n.op for n in gd.node]
  ops += [n.op for f in gd.library.function for n in f.node_def]
  return [t for t in ops if 'While' in t]


@pytest.mark.parametrize('impl,loops', [('conv2d', True), ('patches', False)])
def test_only_patches_vectorise_over_stacked_filters(impl, loops):
  layer = _Layer(filter_shape=(3, 3, 2, 4), impl=impl)
  rng = np.random.RandomState(1)
  w = tf.constant(rng.normal(size=[2, 3, 3, 2, 4]).astype(np.float32))
  x = tf.constant(rng.normal(size=[2, 3, 5, 5, 2]).astype(np.float32))

  def Grads(w, x):
    with tf.GradientTape() as tape:
      tape.watch(w)
      y = tf.vectorized_map(
          lambda a: layer.FProp(NestedMap(w=a[0], b=layer.theta.b), a[1]),
          (w, x))
    return tape.gradient(tf.reduce_sum(y * y), w)

  fn = sharding.Function(Grads, xla_compiled=True)
  assert bool(_WhileOps(fn.get_concrete_function(w, x).graph)) == loops
