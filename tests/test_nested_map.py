"""NestedMap: attribute access, Flatten/Pack/Transform, tf.nest support."""

import pytest
import tensorflow as tf

from lingshard.nested_map import NestedMap


def _Sample():
  return NestedMap(b=NestedMap(y=2, x=1), a=[NestedMap(z=3), 4], c=5)


def test_attribute_access_and_errors():
  m = _Sample()
  assert m.b.x == 1 and m['c'] == 5
  m.d = 6
  assert m['d'] == 6
  del m.d
  with pytest.raises(AttributeError, match=r"'d' not in NestedMap"):
    _ = m.d
  with pytest.raises(ValueError, match='keys must be identifiers'):
    NestedMap({'a.b': 1})
  with pytest.raises(ValueError, match="'keys' is reserved"):
    NestedMap(keys=1)


def test_flatten_items_sorted_dotted():
  assert _Sample().FlattenItems() == [
      ('a[0].z', 3), ('a[1]', 4), ('b.x', 1), ('b.y', 2), ('c', 5)]


def test_pack_transform_round_trip():
  m = _Sample()
  packed = m.Pack(m.Flatten())
  assert packed == m and packed.IsCompatible(m)
  doubled = m.Transform(lambda v: v * 2)
  assert doubled.a[0].z == 6 and doubled.b.y == 4
  with pytest.raises(ValueError, match='fewer leaves'):
    m.Pack([1, 2])
  with pytest.raises(ValueError, match='more leaves'):
    m.Pack(list(range(9)))


def test_filter_and_copy():
  m = _Sample()
  odd = m.Filter(lambda v: isinstance(v, int) and v % 2 == 1)
  assert odd == NestedMap(b=NestedMap(x=1), c=5)
  c = m.DeepCopy()
  c.b.x = 100
  assert m.b.x == 1


def test_tf_nest_keeps_nested_map():
  m = NestedMap(w=tf.ones([2]), sub=NestedMap(v=tf.zeros([1])))
  out = tf.nest.map_structure(lambda t: t + 1, m)
  assert isinstance(out, NestedMap) and isinstance(out.sub, NestedMap)
  assert out.sub.v.numpy().tolist() == [1.0]

  @tf.function
  def F(x):
    return x.Transform(lambda t: t * 3)

  assert F(m).w.numpy().tolist() == [3.0, 3.0]
