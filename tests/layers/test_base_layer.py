"""BaseLayer: names, inheritance, determinism, theta, explicit-theta FProp."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import linear
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit


class Block(base_layer.BaseLayer):
  """Two projections and a list of children, for structure tests."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 4, '')
    p.Define('num_extra', 2, '')
    p.Define('first', True, 'Create `first` before `second` (order test).')
    p.weight_split_dims_mapping.Define('scale', None, '')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    lin = linear.LinearLayer.Params().Set(input_dim=p.dim, output_dim=p.dim)
    names = ['first', 'second'] if p.first else ['second', 'first']
    for name in names:
      self.CreateChild(name, lin)
    self.CreateChildren('extra', [lin.Copy() for _ in range(p.num_extra)])
    self.CreateVariable('scale', base_layer.WeightParams(
        [p.dim], init=WeightInit.Constant(1.0)))

  def FProp(self, theta, x):
    x = self.first.FProp(theta.first, x)
    x = self.second.FProp(theta.second, x)
    for layer, t in zip(self.extra, theta.extra):
      x = layer.FProp(t, x)
    return x * theta.scale


class Outer(base_layer.BaseLayer):

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('block', Block.Params(), '')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('enc', self.params.block)

  def FProp(self, theta, x):
    return self.enc.FProp(theta.enc, x)


def _Outer(**kw):
  return Outer.Params().Set(name='model', **kw).Instantiate()


def test_hierarchical_variable_names():
  names = sorted(v.name for v in _Outer().variables)
  assert names == sorted([
      'model/enc/extra_000/b:0', 'model/enc/extra_000/w:0',
      'model/enc/extra_001/b:0', 'model/enc/extra_001/w:0',
      'model/enc/first/b:0', 'model/enc/first/w:0',
      'model/enc/second/b:0', 'model/enc/second/w:0', 'model/enc/scale:0'])


def test_theta_structure():
  theta = _Outer().theta
  assert isinstance(theta, NestedMap)
  assert sorted(theta.enc.keys()) == ['extra', 'first', 'scale', 'second']
  assert isinstance(theta.enc.extra, list) and len(theta.enc.extra) == 2
  assert [k for k, _ in theta.FlattenItems()][:3] == [
      'enc.extra[0].b', 'enc.extra[0].w', 'enc.extra[1].b']
  assert theta.enc.first.w.shape == (4, 4)


def test_children_inherit_unless_set():
  mesh = np.arange(2)
  p = Outer.Params().Set(name='model', dtype=tf.float64, random_seed=7,
                         device_mesh=mesh, params_init=WeightInit.Gaussian(0.5))
  p.block.Set(random_seed=99)  # Set explicitly: not inherited.
  outer = p.Instantiate()
  enc = outer.enc
  assert enc.params.dtype == tf.float64 and enc.params.random_seed == 99
  assert enc.first.params.random_seed == 99
  assert enc.first.params.params_init == WeightInit.Gaussian(0.5)
  assert np.array_equal(enc.first.params.device_mesh, mesh)
  assert enc.first.params.fprop_dtype == tf.float64
  assert outer.theta.enc.first.w.dtype == tf.float64
  # Root defaults.
  plain = Block.Params().Instantiate()
  assert plain.params.dtype == tf.float32
  assert plain.params.random_seed == 1234
  assert plain.params.params_init == WeightInit.Xavier(1.0)


def test_seed_determinism_independent_of_creation_order():
  a = _Outer(random_seed=5)
  b = _Outer(random_seed=5)
  c = _Outer(random_seed=6)
  d = Outer.Params().Set(name='model', random_seed=5)
  d.block.first = False  # `second` is created before `first`.
  d = d.Instantiate()
  for key, va in a.theta.FlattenItems():
    vb = dict(b.theta.FlattenItems())[key]
    vd = dict(d.theta.FlattenItems())[key]
    np.testing.assert_array_equal(va.numpy(), vb.numpy())
    np.testing.assert_array_equal(va.numpy(), vd.numpy())
  wa = a.theta.enc.first.w.numpy()
  assert not np.array_equal(wa, c.theta.enc.first.w.numpy())
  # Different weights of one model differ too.
  assert not np.array_equal(wa, a.theta.enc.second.w.numpy())


def test_weight_init_methods_statistics():
  def Init(init, shape):
    layer = linear.LinearLayer.Params().Set(
        input_dim=shape[0], output_dim=shape[1], params_init=init,
        random_seed=3).Instantiate()
    return layer.theta.w.numpy()

  w = Init(WeightInit.Gaussian(0.5), [200, 300])
  assert abs(w.std() - 0.5) < 0.01 and abs(w.mean()) < 0.01
  w = Init(WeightInit.Uniform(0.2), [200, 300])
  assert w.max() <= 0.2 and w.min() >= -0.2 and w.max() > 0.19
  w = Init(WeightInit.Xavier(1.0), [200, 300])
  limit = np.sqrt(6.0 / 500)
  assert w.max() <= limit and w.max() > 0.95 * limit
  w = Init(WeightInit.Constant(0.25), [3, 5])
  assert np.all(w == 0.25)
  w = Init(WeightInit.GaussianSqrtFanIn(1.0), [400, 300])
  assert abs(w.std() - 1 / 20) < 0.002


def test_fprop_uses_explicit_theta_not_variables():
  layer = _Outer()
  x = tf.random.stateless_normal([3, 4], [1, 2])
  y_vars = layer.FProp(layer.theta, x)
  theta = layer.theta.Transform(tf.zeros_like)
  theta.enc.scale = tf.ones([4]) * 2.0
  theta.enc.extra[1].b = tf.ones([4]) * 0.5
  y = layer.FProp(theta, x)
  # Every projection is zero but the last bias: output = 0.5 * 2.
  np.testing.assert_allclose(y.numpy(), np.full([3, 4], 1.0))
  assert not np.allclose(y_vars.numpy(), y.numpy())
  # __call__ is FProp with the layer's own variables.
  np.testing.assert_allclose(layer(x).numpy(), y_vars.numpy(), rtol=1e-6)


def test_declared_weights_allocate_nothing():
  layer = _Outer()
  declared = layer.DeclaredWeights()
  assert declared.enc.first.w.shape == [4, 4]
  assert layer.enc.first.__dict__['_vars'] is None  # Nothing created yet.
  assert len(layer.variables) == 9


def test_create_child_outside_init_raises():
  layer = Block.Params().Instantiate()
  with pytest.raises(RuntimeError, match=r'CreateChild may only be called '
                     r'in __init__ \(Block block\)'):
    layer.CreateChild('late', linear.LinearLayer.Params())
  with pytest.raises(RuntimeError, match='CreateVariable may only be called'):
    layer.CreateVariable('late', base_layer.WeightParams([1]))


def test_duplicate_and_bad_names():
  class Bad(base_layer.BaseLayer):

    def __init__(self, params):
      super().__init__(params)
      self.CreateVariable('w', base_layer.WeightParams([1]))
      self.CreateVariable('w', base_layer.WeightParams([1]))

  with pytest.raises(ValueError, match="bad already has a child or weight 'w'"):
    Bad.Params().Instantiate()
  with pytest.raises(ValueError, match="Layer name 'a-b' is not an identifier"):
    Block.Params().Set(name='a-b').Instantiate()
  with pytest.raises(TypeError, match='Block takes its Params'):
    Block(dict())


def test_weight_sharding_reaches_hlo():
  p = Block.Params().Set(name='blk', device_mesh=np.arange(2))
  p.weight_split_dims_mapping.scale = [0]
  layer = p.Instantiate()
  x = tf.ones([2, 4])

  @tf.function(jit_compile=True)
  def F(theta, x):
    return layer.FProp(layer.ShardTheta(theta), x)

  hlo = F.experimental_get_compiler_ir(layer.theta, x)(stage='hlo')
  shardings = [line for line in hlo.splitlines()
               if 'custom_call_target="Sharding"' in line]
  assert len(shardings) == 1 and 'sharding={devices=[2]0,1}' in shardings[0]


def test_bad_weight_mapping_fails_at_construction():
  p = Block.Params().Set(device_mesh=np.arange(2))
  p.weight_split_dims_mapping.scale = [0, 1]
  with pytest.raises(ValueError, match=r'has 2 entries but the tensor has '
                     r'rank 1'):
    p.Instantiate()


def test_check_positive_names_params_and_values():
  with pytest.raises(ValueError) as e:
    linear.LinearLayer.Params().Set(name='proj', input_dim=4,
                                    output_dim=0).Instantiate()
  assert str(e.value) == 'proj: input_dim and output_dim must be > 0, got 4, 0'
  p = Block.Params().Set(name='blk', dim=3)
  layer = p.Instantiate()
  layer.CheckPositive('dim', 'num_extra')  # Both positive: no error.
  with pytest.raises(ValueError) as e:
    Block.Params().Set(name='blk', num_extra=0).Instantiate().CheckPositive(
        'dim', 'num_extra', 'dim')
  assert str(e.value) == 'blk: dim, num_extra and dim must be > 0, got 4, 0, 4'
