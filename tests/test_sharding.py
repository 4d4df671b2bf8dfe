"""lingshard.sharding: validation messages, and what each call puts in HLO.

Partitioned runs of these annotations are in tests/spmd/."""

import os
import tokenize

import numpy as np
import pytest
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import linear


def _Hlo(fn, *args):
  return tf.function(fn, jit_compile=True, autograph=False
                     ).experimental_get_compiler_ir(*args)(stage='hlo')


def _Shardings(hlo):
  """The sharding={...} strings of Sharding custom-calls, in order."""
  out = []
  for line in hlo.splitlines():
    if 'custom_call_target="Sharding"' in line:
      out.append(line.split('sharding=')[1].split('}')[0] + '}')
  return out


@pytest.mark.parametrize('call,message', [
    (lambda: sharding.mesh_split(tf.zeros([2, 3]), np.arange(4), [0]),
     'split_dims_mapping [0] has 1 entries but the tensor has rank 2'),
    (lambda: sharding.mesh_split(tf.zeros([2, 3]), np.arange(4), [1, -1]),
     'mesh axis 1 is out of range for a 1-D device mesh'),
    (lambda: sharding.mesh_split(tf.zeros([2, 3]), np.arange(4).reshape(2, 2),
                                 [0, 0]),
     'mesh axis 0 is used twice in [0, 0]'),
    (lambda: sharding.mesh_split(tf.zeros([2, 3]), [[0, 1], [1, 3]], [0, 1]),
     'device ids must be a permutation of 0..3, got [0, 1, 1, 3]'),
    (lambda: sharding.shard(tf.zeros([2, 3]), np.array([[0, 2], [2, 1]])),
     'device ids must be a permutation of 0..3, got [0, 2, 2, 1]'),
    (lambda: sharding.mesh_split(tf.zeros([2]), np.arange(2), ['model'],
                                 mesh_axis_names=['data']),
     "mesh axis name 'model' is not one of ['data']"),
    (lambda: sharding.mesh_split(tf.zeros([2]), np.arange(2), [True]),
     'mesh axis must be an int, a name or None, got True'),
    (lambda: sharding.mesh_split(tf.zeros([2]), np.array([0.0, 1.0]), [0]),
     'device mesh ids must be integers, got float64'),
    (lambda: sharding.shard(tf.zeros([4, 4]), np.arange(4)),
     'device_assignment has rank 1 but the tensor has rank 2'),
    (lambda: sharding.split(tf.zeros([4, 4]), 2, 2),
     'split_dimension 2 is out of range for rank 2'),
    (lambda: sharding.split(tf.zeros([4, 4]), 0, 0),
     'num_partitions must be >= 1, got 0'),
    (lambda: sharding.auto_to_manual(tf.zeros([4, 4]), np.arange(4).reshape(
        2, 2), [0, -1], manual_mesh_axis=1),
     'manual_mesh_axis 1 must split a tensor dim; split_dims_mapping is '
     '[0, -1]'),
    (lambda: sharding.mesh_split(tf.zeros([4, 4]), np.arange(4).reshape(2, 2),
                                 [0, -1], manual_mesh_axis=0),
     'mesh axis 0 is manual here and cannot also split a dim: [0, -1]'),
    (lambda: sharding.manual_to_auto(tf.zeros([4, 4]), np.arange(2), [0, -1],
                                     [8]),
     'full_shape [8] has 1 dims but the tensor has rank 2'),
    (lambda: sharding.manual_to_auto(tf.zeros([4, 4]), np.arange(2), [0, -1],
                                     [8, 4]),
     'manual shard has shape [4, 4] but full_shape [8, 4] split by [0, -1] '
     'over mesh [2] gives shards of [8, 4]'),
])
def test_bad_annotations_fail_with_one_clear_message(call, message):
  with pytest.raises(sharding.ShardingError) as e:
    call()
  assert str(e.value) == message


def test_uneven_split_is_allowed_and_reaches_hlo():
  """GShard §3.3.3: 15 over 2 is legal; XLA pads the last shard."""
  hlo = _Hlo(lambda x: sharding.split(x, 0, 2) * 2.0, tf.zeros([15, 3]))
  assert _Shardings(hlo) == ['{devices=[2,1]0,1}']
  hlo = _Hlo(lambda x: sharding.mesh_split(x, np.arange(2), [-1, 0]) + 1.0,
             tf.zeros([3, 15]))
  assert _Shardings(hlo) == ['{devices=[1,2]0,1}']


def test_every_annotation_survives_into_hlo():
  mesh = np.arange(8).reshape(2, 4)

  def Fn(x):
    a = sharding.replicate(x * 2.0)
    b = sharding.split(a + 1.0, 1, 8)
    c = sharding.shard(b - 1.0, np.array([[0, 2, 4, 6], [1, 3, 5, 7]]))
    d = sharding.mesh_split(c * 3.0, mesh, ['data', -1],
                            mesh_axis_names=['data', 'model'])
    return sharding.mesh_split(d / 2.0, mesh, [1, 0])

  assert _Shardings(_Hlo(Fn, tf.zeros([4, 8]))) == [
      '{replicated}',
      '{devices=[1,8]0,1,2,3,4,5,6,7}',
      '{devices=[2,4]0,2,4,6,1,3,5,7}',
      '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}',
      '{devices=[4,2]0,4,1,5,2,6,3,7}',
  ]


def test_eager_calls_are_validated_identities():
  x = tf.reshape(tf.range(6.0), [2, 3])
  mesh = np.arange(2)
  for y in (sharding.replicate(x), sharding.split(x, 1, 2),
            sharding.shard(x, [[0, 1]]), sharding.mesh_split(x, mesh, [0, -1]),
            sharding.auto_to_manual(x, mesh, [0, -1]),
            sharding.manual_to_auto(x, mesh, [0, -1], [2, 3])):
    np.testing.assert_array_equal(y.numpy(), x.numpy())


def test_no_mesh_or_no_mapping_means_no_annotation():
  """device_mesh None or split_dims_mapping None: `t` itself, no op."""
  x = tf.reshape(tf.range(6.0), [2, 3])
  mesh = np.arange(2)
  assert sharding.mesh_split(x, None, [0, -1]) is x
  assert sharding.mesh_split(x, mesh, None) is x

  def Fn(t):
    a = sharding.mesh_split(t * 2.0, None, [0, -1])
    b = sharding.mesh_split(a + 1.0, mesh, None)
    return sharding.mesh_split(b - 1.0, mesh, [0, -1])

  hlo = _Hlo(Fn, x)
  assert _Shardings(hlo) == ['{devices=[2,1]0,1}']
  assert hlo.count('sharding=') == 1


def test_manual_partitioning_is_emitted_only_for_a_partitioned_program():
  mesh = np.arange(8)

  def Fn(x):
    x_l = sharding.auto_to_manual(x, mesh, [0, -1, -1])
    y_l = tf.reduce_sum(x_l, axis=1, keepdims=True)
    return sharding.manual_to_auto(y_l, mesh, [0, -1, -1], [8, 1, 3])

  x = tf.zeros([8, 5, 3])
  # Single device: the whole tensor is the one shard; no custom calls.
  single = _Hlo(Fn, x)
  assert 'SPMDFullToShardShape' not in single
  assert sharding.PartitionCount() is None
  with sharding.SpmdPartitioning(8):
    assert sharding.PartitionCount() == 8
    hlo = _Hlo(Fn, x)
  assert 'custom_call_target="SPMDFullToShardShape"' in hlo
  assert 'f32[1,5,3]{2,1,0} custom-call' in hlo  # one group per device
  assert 'custom_call_target="SPMDShardToFullShape"' in hlo
  assert sharding.PartitionCount() is None


def test_manual_on_one_mesh_axis_keeps_the_other_automatic():
  mesh = np.arange(8).reshape(2, 4)

  def Fn(x):
    x_l = sharding.auto_to_manual(x, mesh, [0, -1, 1], manual_mesh_axis=0)
    y_l = sharding.mesh_split(x_l * 2.0, mesh, [-1, -1, 1],
                              manual_mesh_axis=0)
    return sharding.manual_to_auto(y_l, mesh, [0, -1, 1], [4, 5, 8],
                                   manual_mesh_axis=0)

  with sharding.SpmdPartitioning(8):
    hlo = _Hlo(Fn, tf.zeros([4, 5, 8]))
  # Only G (over mesh axis 0) shrinks; M stays full, split automatically.
  assert 'f32[2,5,8]{2,1,0} custom-call' in hlo
  assert 'last_tile_dims={manual}' in hlo


def test_annotations_must_match_the_partition_count():
  with sharding.SpmdPartitioning(8):
    with pytest.raises(sharding.ShardingError) as e:
      _Hlo(lambda x: sharding.shard(x, [[0, 1], [2, 3]]), tf.zeros([2, 2]))
  assert str(e.value) == ('the annotation uses 4 devices but the program is '
                          'partitioned for 8')
  with pytest.raises(sharding.ShardingError, match='num_partitions must be '
                     '>= 1, got 0'):
    with sharding.SpmdPartitioning(0):
      pass


def test_layer_split_decisions_come_from_its_params():
  """BaseLayer annotates weights and activations through this module."""
  p = linear.LinearLayer.Params().Set(name='fc', input_dim=4, output_dim=8,
                                      device_mesh=np.arange(4))
  p.weight_split_dims_mapping.w = [-1, 0]
  p.activation_split_dims_mapping.out = [0, -1]
  layer = p.Instantiate()
  theta = layer.theta.Transform(lambda v: v.numpy())

  def Fn(w, b, x):
    th = layer.ShardTheta(theta.Pack([b, w]))
    return layer.FProp(th, x)

  hlo = _Hlo(Fn, theta.w, theta.b, tf.zeros([4, 4]))
  assert _Shardings(hlo) == ['{devices=[1,4]0,1,2,3}', '{devices=[4,1]0,1,2,3}']


def test_for_program_drops_annotations_only_from_graphs_xla_skips():
  """Graphs TF runs op by op get no XlaSharding ops (each would run as an
  on-demand XLA program); XLA-compiled ones keep every annotation."""
  def Ops(xla):
    @tf.function
    def Fn(x):
      with sharding.ForProgram(xla):
        return sharding.split(x * 2.0, 0, 2) + 1.0
    graph = Fn.get_concrete_function(tf.TensorSpec([4, 3])).graph
    return [n.op for n in graph.as_graph_def().node]
  assert 'XlaSharding' in Ops(True)
  assert 'XlaSharding' not in Ops(False)
  assert 'Mul' in Ops(False) and 'AddV2' in Ops(False)


def _TfFunctionUses(path):
  """Lines where code (not strings or comments) names `tf.function`."""
  with open(path, 'rb') as f:
    toks = [t for t in tokenize.tokenize(f.readline)
            if t.type in (tokenize.NAME, tokenize.OP)]
  return [a.start[0] for a, b, c in zip(toks, toks[1:], toks[2:])
          if (a.string, b.string, c.string) == ('tf', '.', 'function')]


def test_every_tf_function_is_built_by_sharding_function():
  """Whoever builds a tf.function says whether XLA compiles it: in the
  package that is `sharding.Function` alone (DEVELOPERS.md)."""
  root = os.path.dirname(sharding.__file__)
  uses = {}
  for d, _, files in os.walk(root):
    for name in files:
      path = os.path.join(d, name)
      if name.endswith('.py') and path != sharding.__file__:
        lines = _TfFunctionUses(path)
        if lines:
          uses[os.path.relpath(path, root)] = lines
  assert uses == {}


def test_axis_size_of_one_axis_or_a_tuple():
  mesh, names = np.arange(8).reshape(2, 4), ['data', 'expert']
  assert sharding.AxisSize(mesh, 'expert', names) == 4
  assert sharding.AxisSize(mesh, 0) == 2
  assert sharding.AxisSize(mesh, ('data', 'expert'), names) == 8
  assert sharding.AxisSize(mesh, ['expert'], names) == 4
  assert sharding.AxisSize(mesh, None) == sharding.AxisSize(mesh, -1) == 1
  assert sharding.AxisSize(None, ('data', 'expert'), names) == 1
  with pytest.raises(sharding.ShardingError,
                     match=r"^a mesh axis is used twice in \('data', 0\)$"):
    sharding.AxisSize(mesh, ('data', 0), names)
  with pytest.raises(sharding.ShardingError,
                     match=r"^mesh axis name 'model' is not one of"):
    sharding.AxisSize(mesh, 'model', names)


def test_merged_mesh_axis_lays_devices_out_as_a_tuple_split():
  mesh, names = np.arange(8).reshape(2, 4), ['data', 'expert']
  merged, axis = sharding.MergedMeshAxis(mesh, ('data', 'expert'), names)
  assert axis == 0 and merged.tolist() == list(range(8))
  # The first axis major: expert-major order transposes the mesh.
  merged, axis = sharding.MergedMeshAxis(mesh, ('expert', 'data'), names)
  assert merged.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
  merged, axis = sharding.MergedMeshAxis(mesh, 'expert', names)
  assert axis == 1 and merged.tolist() == mesh.tolist()
