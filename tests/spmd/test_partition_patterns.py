"""GShard's partitioning patterns, partitioned by XLA and run on 8 virtual CPU
devices, each compared with the single-device TF run (GShard §3.2, §3.3,
App. A.3). The test process has 8 host devices (tests/conftest.py)."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import sharding
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from lingshard.spmd import xla_runtime

G, S, M, E, C = 8, 4, 8, 8, 2


def _Rng(seed=0):
  return np.random.RandomState(seed)


def _Grad(loss_fn, x):
  with tf.GradientTape() as tape:
    tape.watch(x)
    loss = loss_fn(x)
  return tape.gradient(loss, x)


def test_fig4a_resplit_from_groups_to_experts_is_an_all_to_all():
  """Dispatch einsum GSEC,GSM->EGCM split on G, output re-split on E."""
  rng = _Rng()
  inputs = NestedMap(
      x_gsm=rng.normal(size=[G, S, M]).astype(np.float32),
      mask_gsec=(rng.uniform(size=[G, S, E, C]) > 0.7).astype(np.float32),
      cot_egcm=rng.normal(size=[E, G, C, M]).astype(np.float32))

  def Fn(inp):
    mask = sharding.split(inp.mask_gsec, 0, 8)

    def Dispatch(x):
      y = tf.einsum('GSEC,GSM->EGCM', mask, sharding.split(x, 0, 8))
      return sharding.split(y, 0, 8)

    y_egcm = Dispatch(inp.x_gsm)
    dx_gsm = _Grad(lambda x: tf.reduce_sum(Dispatch(x) * inp.cot_egcm),
                   inp.x_gsm)
    return NestedMap(y_egcm=y_egcm, dx_gsm=sharding.split(dx_gsm, 0, 8))

  r = check.CheckFunction(Fn, inputs, 8, name='fig4a',
                          expect=['has:all-to-all', 'only:all-to-all'])
  assert r.ok, r.Report()
  assert r.max_rel_error < 1e-5
  a2a = r.CollectivesOf('all-to-all')
  # Forward E-resplit, and the same all-to-all back for the gradient.
  assert len(a2a) == 2, r.Report()
  assert all(c.group_size == 8 for c in a2a)
  # Each device holds E/8 experts of all G groups after the re-split.
  assert r.output_shardings['y_egcm'] == '{devices=[8,1,1,1]<=[8]}' or (
      r.output_shardings['y_egcm'].startswith('{devices=[8,1,1,1]'))
  assert r.input_shardings['x_gsm'].startswith('{devices=[8,1,1]')


def test_fig4b_contracting_dim_split_is_an_all_reduce():
  """y = x w with the contracting dim K split: partial sums + all-reduce."""
  rng = _Rng(1)
  inputs = NestedMap(x_bk=rng.normal(size=[4, 16]).astype(np.float32),
                     w_kn=rng.normal(size=[16, 6]).astype(np.float32))

  def Fn(inp):
    x = sharding.split(inp.x_bk, 1, 8)
    w = sharding.split(inp.w_kn, 0, 8)
    return NestedMap(y_bn=sharding.replicate(tf.matmul(x, w)))

  r = check.CheckFunction(Fn, inputs, 8, name='fig4b',
                          expect=['only:all-reduce', 'has:all-reduce'])
  assert r.ok, r.Report()
  [ar] = r.collectives
  assert ar.shape == 'f32[4,6]' and ar.group_size == 8
  assert ar.op_name == 'MatMul'
  assert ar.tensor == 'out:y_bn'
  # Each device multiplies only its K/8 slice: 2*4*2*6 = 96 FLOPs.
  assert r.flops < 2 * 4 * 16 * 6 / 4


def test_uneven_split_15_over_2_matches():
  """GShard §3.3.3: 15 rows over 2 devices, the padded row is masked."""
  rng = _Rng(2)
  inputs = NestedMap(x=rng.normal(size=[15, 3]).astype(np.float32),
                     w=rng.normal(size=[3, 5]).astype(np.float32))

  def Fn(inp):
    x = sharding.split(inp.x, 0, 2)

    def Loss(w):
      h = sharding.split(tf.tanh(tf.matmul(x, w)), 0, 2)
      return tf.reduce_sum(h * h) + tf.reduce_max(h)

    return NestedMap(loss=Loss(inp.w), dw=_Grad(Loss, inp.w),
                     h=sharding.split(tf.tanh(tf.matmul(x, inp.w)), 0, 2))

  r = check.CheckFunction(Fn, inputs, 2, name='uneven')
  assert r.ok, r.Report()
  assert r.input_shardings['x'] == '{devices=[2,1]0,1}'
  # Reductions over the padded dim need the sum/max of both halves.
  assert r.CollectiveCounts()['all-reduce'] >= 1


def test_shard_with_a_2d_device_assignment_matches():
  """App. A.3: a [4, 8] tensor tiled 2x4 over a permuted device grid."""
  assignment = np.array([[0, 2, 4, 6], [1, 3, 5, 7]])
  rng = _Rng(3)
  inputs = NestedMap(x=rng.normal(size=[4, 8]).astype(np.float32),
                     w=rng.normal(size=[8, 8]).astype(np.float32))

  def Fn(inp):
    x = sharding.shard(inp.x, assignment)
    y = sharding.shard(tf.nn.relu(tf.matmul(x, inp.w)), assignment)
    return NestedMap(y=y, col_sums=sharding.replicate(
        tf.reduce_sum(y, axis=0)))

  r = check.CheckFunction(Fn, inputs, 8, name='shard2d')
  assert r.ok, r.Report()
  assert r.input_shardings['x'] == '{devices=[2,4]0,2,4,6,1,3,5,7}'
  assert r.output_shardings['y'] == '{devices=[2,4]0,2,4,6,1,3,5,7}'


def _GatherInputs(g):
  rng = _Rng(4)
  return NestedMap(x_gsm=rng.normal(size=[g, 5, M]).astype(np.float32),
                   idx_gk=rng.randint(0, 5, size=[g, 3]).astype(np.int32),
                   cot_gkm=rng.normal(size=[g, 3, M]).astype(np.float32))


def _ManualGather(mesh, x_map, idx_map, manual_mesh_axis=None):
  """GShard §3.2: a per-group gather under manual partitioning.

  The gather's indices only address the token dim of their own group, so
  each device gathers from its local groups; the partitioner would
  otherwise have to assume any index can reach any group.
  """

  def Fn(inp):
    g, _, m = inp.x_gsm.shape
    k = inp.idx_gk.shape[1]
    idx = sharding.mesh_split(inp.idx_gk, mesh, idx_map)
    idx_l = sharding.auto_to_manual(idx, mesh, idx_map,
                                    manual_mesh_axis=manual_mesh_axis)

    def Gather(x):
      x = sharding.mesh_split(x, mesh, x_map)
      x_l = sharding.auto_to_manual(x, mesh, x_map,
                                    manual_mesh_axis=manual_mesh_axis)
      y_l = tf.gather(x_l, idx_l, batch_dims=1)  # [G/n, K, M] local.
      return sharding.manual_to_auto(y_l, mesh, x_map, [g, k, m],
                                     manual_mesh_axis=manual_mesh_axis)

    y = Gather(inp.x_gsm)
    dx = _Grad(lambda x: tf.reduce_sum(Gather(x) * inp.cot_gkm), inp.x_gsm)
    return NestedMap(y_gkm=y, dx_gsm=sharding.mesh_split(dx, mesh, x_map))

  return Fn


@pytest.mark.parametrize('mesh_shape,x_map,idx_map,manual_axis', [
    ((8,), [0, -1, -1], [0, -1], None),
    # 2-D mesh, manual on both axes; groups split over axis 0 only, so the
    # 4 devices along axis 1 hold copies of the same groups.
    ((2, 4), [0, -1, -1], [0, -1], None),
    # 2-D mesh, manual on axis 0 only: M stays automatically split over
    # axis 1 inside the manual region.
    ((2, 4), [0, -1, 1], [0, -1], 0),
])
def test_per_group_gather_under_manual_partitioning(mesh_shape, x_map,
                                                    idx_map, manual_axis):
  mesh = np.arange(8).reshape(mesh_shape)
  r = check.CheckFunction(
      _ManualGather(mesh, x_map, idx_map, manual_axis), _GatherInputs(8),
      mesh_shape, name='manual_gather', expect=['none'])
  assert r.ok, r.Report()
  assert r.max_abs_error == 0.0


def test_uneven_manual_region_matches():
  """Manual partitioning of 7 groups over 2 devices (shards of 4, padded)."""
  mesh = np.arange(2)
  r = check.CheckFunction(_ManualGather(mesh, [0, -1, -1], [0, -1]),
                          _GatherInputs(7), 2, name='manual_gather_uneven')
  assert r.ok, r.Report()


def test_replicate_keeps_every_device_whole():
  rng = _Rng(5)
  inputs = NestedMap(x=rng.normal(size=[8, 4]).astype(np.float32))

  def Fn(inp):
    x = sharding.split(inp.x, 0, 8)
    return NestedMap(y=sharding.replicate(tf.cumsum(x, axis=0)))

  r = check.CheckFunction(Fn, inputs, 8, name='replicate')
  assert r.ok, r.Report()
  assert r.output_shardings['y'] == '{replicated}'
  assert r.CollectiveCounts()['all-gather'] + r.CollectiveCounts()[
      'all-reduce'] + r.CollectiveCounts()['collective-permute'] >= 1


def test_llvm_level_changes_no_partitioned_program_size_or_result():
  """The checker compiles at xla_runtime.BACKEND_OPTIMIZATION_LEVEL (0):
  the partitioned HLO, its buffers and its outputs are XLA's level-2 ones."""
  rng = _Rng(3)
  inputs = NestedMap(x_gsm=rng.normal(size=[G, S, M]).astype(np.float32),
                     w_mh=rng.normal(size=[M, 16]).astype(np.float32))

  def Fn(inp):
    h = tf.nn.relu(tf.einsum('GSM,MH->GSH', sharding.split(inp.x_gsm, 0, 8),
                             inp.w_mh))
    return NestedMap(loss=tf.reduce_sum(tf.tanh(h)),
                     h=sharding.split(h, 0, 8))

  r = check.CheckFunction(Fn, inputs, 8, compare=False)
  assert xla_runtime.BACKEND_OPTIMIZATION_LEVEL == 0
  values = [np.asarray(v) for v in inputs.Flatten()]
  shapes = [(G, S, 16), ()]  # NestedMap order: h, loss.
  exes = [xla_runtime.CompileSpmd(r.exported_hlo, 8, level)
          for level in (0, 2)]
  assert exes[0].hlo_text == exes[1].hlo_text
  assert exes[0].MemoryStats() == exes[1].MemoryStats()
  assert exes[0].CostAnalysis() == exes[1].CostAnalysis()
  outs = [exe.Run(values, shapes) for exe in exes]
  for a, b in zip(*outs):
    np.testing.assert_allclose(a, b, rtol=1e-5)
