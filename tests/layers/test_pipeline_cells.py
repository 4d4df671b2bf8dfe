"""CellPipelinedLayer (layers/pipeline_cells.py): AmoebaNet cells that change
shape and read x_prev as a K-stage GPipe pipeline == the cells run one after
another on each micro-batch; moving averages of the whole mini-batch;
per-cell thetas; one-line errors; the SPMD partition."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import amoebanet
from lingshard.layers import base_layer
from lingshard.layers import batch_norm
from lingshard.layers import pipeline_cells
from lingshard.layers import pipeline_run
from lingshard.layers import pipeline_schedule
from lingshard.nested_map import NestedMap
from lingshard.spmd import check

_B, _M = 8, 4
_IMAGE = (8, 8, 4)
_DECAY = 0.7
# (reduction, filters): a normal cell, a reduction cell (8x8 -> 4x4, 3 F
# channels), a normal cell whose x_prev is twice its size (factorized
# reduction), a normal cell.
_PLAN = [(False, 4), (True, 8), (False, 8), (False, 8)]


def _CellTpls():
  tpls, x, prev = [], _IMAGE, None
  for reduction, filters in _PLAN:
    tpls.append(amoebanet.AmoebaCell.Params().Set(
        genotype='D', reduction=reduction, filters=filters, input_shape=x,
        prev_shape=prev, bn_decay=_DECAY))
    prev, x = x, amoebanet.CellOutputShape('D', reduction, filters, x)
  return tpls


def _Params(k=2, **kw):
  return pipeline_cells.CellPipelinedLayer.Params().Set(
      name='body', cell_tpls=_CellTpls(), input_shape=_IMAGE, num_stages=k,
      num_micro_batches=_M, **kw)


class _ToyCell(base_layer.BaseLayer):
  """y = conv(relu(x + adapt(x_prev))) with BN, stride s: a cell that reads
  x_prev (brought to x's shape) and may halve H, W (the SPMD test's cell:
  a tenth of an AmoebaCell's ops)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_shape', None, '(H, W, C) of x.')
    p.Define('prev_shape', None, '(H, W, C) of x_prev, or None.')
    p.Define('filters', 0, 'Output channels.')
    p.Define('stride', 1, '1 or 2.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    h, _, c = p.input_shape
    self.CreateChild('conv', amoebanet.ReluConvBnLayer.Params().Set(
        input_dim=c, output_dim=p.filters, kernel_size=(3, 3),
        stride=(p.stride, p.stride), bn_decay=_DECAY))
    if p.prev_shape is not None:
      cls = (amoebanet.FactorizedReductionLayer if p.prev_shape[0] == 2 * h
             else amoebanet.ReluConvBnLayer)
      self.CreateChild('prev', cls.Params().Set(
          input_dim=p.prev_shape[2], output_dim=c, bn_decay=_DECAY))

  def FProp(self, theta, x, x_prev=None):
    if x_prev is not None:
      x = x + self.prev.FProp(theta.prev, x_prev)
    return self.conv.FProp(theta.conv, x)


def _ToyParams(mesh, names, num_cells=3, m=2):
  # (8,8,4) -> (8,8,8) -> stride 2 (4,4,16) -> (4,4,16), x_prev 2x larger
  # [-> (4,4,16)].
  shapes = [((8, 8, 4), None, 8, 1), ((8, 8, 8), (8, 8, 4), 16, 2),
            ((4, 4, 16), (8, 8, 8), 16, 1),
            ((4, 4, 16), (4, 4, 16), 16, 1)][:num_cells]
  return pipeline_cells.CellPipelinedLayer.Params().Set(
      name='body', input_shape=_IMAGE, num_stages=2, num_micro_batches=m,
      cell_tpls=[_ToyCell.Params().Set(input_shape=x, prev_shape=prev,
                                       filters=f, stride=s)
                 for x, prev, f, s in shapes],
      device_mesh=mesh, mesh_axis_names=names,
      stage_mesh_axis=None if mesh is None else 'stage',
      batch_mesh_axis='data' if names and 'data' in names else None)


class _Cells(base_layer.BaseLayer):
  """The unpipelined cells: children cell_000, ... (the pipeline's paths)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('cell_tpls', None, 'The cells.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChildren('cell', self.params.cell_tpls)


def _Inputs(seed=0):
  rng = np.random.RandomState(seed)
  x = rng.normal(1.0, 2.0, size=[_B, *_IMAGE]).astype(np.float32)
  cot = rng.normal(size=[_B, 4, 4, 32]).astype(np.float32)
  return tf.constant(x), tf.constant(cot)


def _PerMicroBatch(layer, cell_thetas, x):
  """The cells one after another on each micro-batch (pipeline_run's rows):
  (y [B, ...], per micro-batch the inputs (x, x_prev) of every cell)."""
  rows = pipeline_run.MicroBatchRows(_B, _M, 1)
  ys, inputs = [None] * _B, []
  for mb in range(_M):
    h, prev, seen = tf.gather(x, rows[mb]), None, []
    for cell, theta in zip(layer.cells, cell_thetas):
      seen.append((h, prev))
      prev, h = h, cell.FProp(theta, h, prev)
    inputs.append(seen)
    for r, row in enumerate(rows[mb]):
      ys[row] = h[r]
  return tf.stack(ys), inputs


def _LossAndGrads(layer, theta, x, cot, pipelined):
  """(loss, gradients of theta's leaves and x, the reference's cell inputs
  per micro-batch or None)."""
  leaves, inputs = theta.Flatten(), None
  with tf.GradientTape() as tape:
    tape.watch(leaves + [x])
    stacked = theta.Pack(leaves)
    if pipelined:
      y = layer.FProp(stacked, x)
    else:
      y, inputs = _PerMicroBatch(layer, layer.CellThetas(stacked), x)
    loss = tf.reduce_sum(y * cot)
  grads = tape.gradient(loss, leaves + [x])
  return loss, grads, inputs


def _Close(got, want, what):
  """Normwise: ||got - want|| <= 1e-5 ||want|| (+ a floor for zeros)."""
  got, want = (tf.convert_to_tensor(t).numpy() for t in (got, want))
  err = np.linalg.norm(got - want)
  assert err <= 1e-5 * np.linalg.norm(want) + 1e-6, (what, err)


# A previous moving state on every BN (debiased mean 1, variance 4): the
# slot's sums are shifted by it (layers/batch_norm.py).
_OLD = np.array([[0.5], [2.0], [0.5]], np.float32)


def _Runs(params, remats):
  """The pipeline with each remat and the per-micro-batch reference on one
  theta (moving = _OLD): NestedMap(layer, theta, want=(loss, grads,
  inputs), got={remat: (loss, grads, None)})."""
  x, _ = _Inputs()
  out = NestedMap(got={})
  for remat in remats:
    layer = params.Copy().Set(remat=remat).Instantiate()
    y_shape = layer.CellShapes()[-1][2]
    cot = tf.constant(np.random.RandomState(5).normal(
        size=[_B, *y_shape]).astype(np.float32))
    if 'theta' not in out:
      theta = layer.theta.Transform(tf.convert_to_tensor)
      theta.moving = tf.constant(np.broadcast_to(_OLD, theta.moving.shape))
      out.update(layer=layer, theta=theta,
                 want=_LossAndGrads(layer, theta, x, cot, False))
    out.got[remat] = _LossAndGrads(layer, out.theta, x, cot, True)
  return out


@pytest.fixture(scope='module')
def two_stages():
  return _Runs(_Params(2), (True, False))


def _CheckParity(runs, k):
  want_loss, want, _ = runs.want
  names = [key for key, _ in runs.theta.FlattenItems()] + ['x']
  for remat, (loss, grads, _) in runs.got.items():
    np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
    for name, g, w in zip(names, grads, want):
      _Close(g, w, f'remat={remat} {name}')
  assert len(runs.layer.StageSplits()) == k


def test_two_stages_equal_cells_run_per_micro_batch(two_stages):
  """Loss rtol 1e-5, every gradient (stacked weights, the moving averages'
  slot, x) normwise 1e-5, with remat on and off."""
  _CheckParity(two_stages, 2)


def test_three_stages_of_one_cell_equal_cells_run_per_micro_batch():
  """The toy cells, one per stage: a stage's (y, y_prev) is (its cell's
  output, the stage's own input x)."""
  params = _ToyParams(None, None).Set(num_stages=3, num_micro_batches=_M)
  _CheckParity(_Runs(params, (True,)), 3)


def _Circular(repeats=2):
  return pipeline_schedule.Circular.Params().Set(repeats=repeats)


def test_circular_schedule_equals_cells_run_per_micro_batch():
  """Circular(R = 2) on K = 2 stages: chunk j (one cell) on stage j % 2, a
  micro-batch twice round the ring, the last stage's (y, y_prev) entering
  stage 0 for its second pass: the reduction cell (chunk 1) and the cells
  after it change the carrier's contents between passes."""
  runs = _Runs(_Params(2, schedule=_Circular()), (True,))
  _CheckParity(runs, 2)
  layer = runs.layer
  # Each stage's row holds its own chunks: stage 0 cells 0 and 2.
  np.testing.assert_array_equal(layer.WeightLayout(), [[0, 2], [1, 3]])
  assert layer.StageShapes()[2] == (
      'stage 0 pass 1: cells 2-2, in x [4,4,24] prev [8,8,16] -> out '
      '[4,4,32] prev [4,4,24]')


def test_circular_schedule_errors_are_one_line():
  with pytest.raises(pipeline_cells.CellPipelineError) as e:
    _Params(2, schedule=_Circular(3)).Instantiate()
  assert str(e.value) == (
      'body: the circular schedule cuts num_layers 4 into num_stages x '
      'repeats = 2 x 3 = 6 chunks; use at least 6 layers or fewer repeats')
  with pytest.raises(pipeline_cells.CellPipelineError) as e:
    _Params(2, schedule=_Circular(), stage_splits=[2, 2]).Instantiate()
  assert str(e.value) == ('body: stage_splits [2, 2] must be 4 counts >= 1 '
                          'summing to the 4 cells')
  layer = _Params(2, schedule=_Circular()).Set(
      num_micro_batches=1).Instantiate()
  with pytest.raises(pipeline_cells.CellPipelineError) as e:
    layer.FProp(layer.theta, tf.zeros([_B, *_IMAGE]))
  assert str(e.value) == (
      'body: the circular schedule needs at least num_stages 2 '
      'micro-batches (a micro-batch re-enters stage 0 after leaving the '
      'last), got 1')


def test_stage_shapes_are_derived_and_printed():
  layer = _Params(2, stage_splits=[1, 3]).Instantiate()
  assert layer.StageShapes() == [
      'stage 0: cells 0-0, in x [8,8,4] prev - -> out [8,8,16] prev [8,8,4]',
      'stage 1: cells 1-3, in x [8,8,16] prev [8,8,4] -> out [4,4,32] prev '
      '[4,4,32]']
  # Checkpoints record which cell each stage holds (train/checkpointer).
  np.testing.assert_array_equal(layer.WeightLayout(),
                                [[0, -1, -1], [1, 2, 3]])
  # P: the largest boundary, (x, x_prev) per example.
  assert layer.CarrierSize() == 8 * 8 * 16 + 8 * 8 * 4


def test_stages_are_balanced_by_the_cells_conv_flops():
  """Per example, 2 |out| KH KW Cin per conv: cell 0 a 3x3 4->8 conv on
  8x8; cell 1 a 1x1 4->8 (x_prev) on 8x8 and a stride-2 3x3 8->16; cell 2
  two stride-2 1x1 8->8 (factorized reduction) and a 3x3 16->16 on 4x4.
  The most expensive cell alone makes the slowest stage smallest."""
  layer = _ToyParams(None, None).Instantiate()
  assert layer.CellCosts() == [
      2 * 64 * 8 * 9 * 4, 2 * 64 * 8 * 4 + 2 * 16 * 16 * 9 * 8,
      2 * (2 * 16 * 8 * 8) + 2 * 16 * 16 * 9 * 16]
  assert layer.StageSplits() == [2, 1]
  # Each cell's own weights (conv filters, BN gamma and beta): the stacked
  # row of stage 0 holds cells 0 and 1, padded to stage 1's cell 2.
  counts = [9 * 4 * 8 + 2 * 8, (4 * 8 + 2 * 8) + (9 * 8 * 16 + 2 * 16),
            (2 * 8 * 8 + 2 * 16) + (9 * 16 * 16 + 2 * 16)]
  assert layer.CellParamCounts() == counts
  assert layer.theta.w.shape == [2, max(counts[0] + counts[1], counts[2])]
  # Given costs override the traced ones.
  assert _ToyParams(None, None).Set(cell_costs=[3.0, 1.0, 1.0]).Instantiate(
  ).StageSplits() == [1, 2]


def test_one_step_moves_the_moving_averages_to_the_whole_mini_batch(
    two_stages):
  """GPipe §2.2: statistics per micro-batch, moving averages over the
  mini-batch: after one step each cell's first BN (its `base` unit, input
  conv1x1(relu(x))) holds decay old + (1 - decay) (mean, variance, 1) of
  its input over all micro-batches; padded columns stay as they were."""
  layer, theta = two_stages.layer, two_stages.theta
  _, grads, _ = two_stages.got[True]
  slot = grads[[k for k, _ in theta.FlattenItems()].index('moving')]
  rate = 1.0 - _DECAY
  assert layer.DeclaredWeights().moving.count_update_rate == pytest.approx(
      rate)
  new = batch_norm.MovingAverage.Updated(theta.moving, slot, rate)
  new_cells = layer.CellThetas(NestedMap(w=theta.w, moving=new))
  inputs = two_stages.want[2]
  for i, (cell, cell_theta) in enumerate(zip(layer.cells,
                                             layer.CellThetas(theta))):
    h = tf.concat([cell.base.conv.FProp(cell_theta.base.conv,
                                        tf.nn.relu(mb[i][0]))
                   for mb in inputs], 0).numpy()
    h = h.reshape(-1, h.shape[-1]).astype(np.float64)
    want = _DECAY * _OLD + rate * np.stack(
        [h.mean(0), h.var(0), np.ones(h.shape[-1])])
    np.testing.assert_allclose(new_cells[i].base.bn.moving.numpy(), want,
                               rtol=1e-4, atol=1e-5, err_msg=f'cell {i}')
  # Stage 0 has fewer BN columns than stage 1: its padding.
  first = layer.StageSplits()[0]
  used = sum(v.shape[-1] for c in layer.CellThetas(theta)[:first]
             for key, v in c.FlattenItems() if key.endswith('moving'))
  assert used < new.shape[-1]
  np.testing.assert_array_equal(new[0, :, used:].numpy(),
                                theta.moving[0, :, used:].numpy())


def test_per_cell_thetas_round_trip_to_the_unpipelined_cells():
  layer = _Params(3).Instantiate()
  plain = _Cells.Params().Set(name='body', cell_tpls=_CellTpls()).Instantiate()
  per_cell = layer.CellThetas(layer.theta)
  assert len(per_cell) == len(_PLAN)
  for i, (got, want) in enumerate(zip(per_cell, plain.theta.cell)):
    assert got.IsCompatible(want), i
    for (key, g), w in zip(got.FlattenItems(), want.Flatten()):
      np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=key)
  again = layer.StackCellThetas(plain.theta.cell)
  for key, value in layer.theta.FlattenItems():
    np.testing.assert_array_equal(again[key].numpy(), value.numpy())


def test_one_line_errors():
  with pytest.raises(pipeline_cells.CellPipelineError) as e:
    _Params(5).Instantiate()
  assert str(e.value) == ('body: num_stages 5 exceeds the 4 cells; use at '
                          'most 4 stages')
  with pytest.raises(pipeline_cells.CellPipelineError) as e:
    _Params(2, stage_splits=[3, 2]).Instantiate()
  assert str(e.value) == ('body: stage_splits [3, 2] must be 2 counts >= 1 '
                          'summing to the 4 cells')
  bad = _Params(2)
  bad.input_shape = (8, 8, 6)
  with pytest.raises(pipeline_cells.CellPipelineError) as e:
    bad.Instantiate()
  assert str(e.value) == (
      'body: cell 0 (body/cell_000) does not take x [8,8,6] and x_prev -: '
      'body/cell_000: x must be [B, 8, 8, 4], got [1, 8, 8, 6]')


@pytest.mark.parametrize('mesh_shape,names,circular', [
    ((2,), ('stage',), False), ((2, 2), ('data', 'stage'), False),
    ((2,), ('stage',), True)])
def test_spmd_partition_equals_one_device_and_shifts_by_permutes(
    mesh_shape, names, circular):
  """A train step on K = 2 stages (2x2: batch over data too): the stage
  computation in a manual region over the stage axis, each device running
  its own stage's cells (switch_case); partitioned == unpartitioned (loss
  rtol 1e-5, gradients normwise 1e-5), the carrier moves by
  collective-permutes and the stacked weights are never gathered."""
  mesh = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape)
  # Circular: 4 cells, chunk j on stage j % 2, each device running only
  # its own chunks' branches; 2 micro-batches = K.
  toy = dict(num_cells=4, schedule=_Circular()) if circular else {}
  schedule = toy.pop('schedule', None)

  def Toy(m, n):
    p = _ToyParams(m, n, **toy)
    return p.Set(schedule=schedule) if schedule else p

  layer = Toy(mesh, names).Instantiate()
  x, _ = _Inputs()
  cot = np.random.RandomState(3).normal(size=[_B, 4, 4, 16])
  inputs = NestedMap(theta=layer.theta.Transform(lambda v: v.numpy()),
                     x=x.numpy(), cot=cot.astype(np.float32))

  def Step(ins):
    theta = layer.ShardTheta(ins.theta)
    leaves = theta.Flatten()
    with tf.GradientTape() as tape:
      tape.watch(leaves)
      y = layer.FProp(theta.Pack(leaves), ins.x)
      loss = tf.reduce_sum(y * ins.cot)
    grads = theta.Pack(tape.gradient(loss, leaves))
    return NestedMap(loss=loss, grads=layer.ShardTheta(grads))

  # The unpartitioned reference is the no-mesh pipeline (its static stage
  # loop, == the cells per micro-batch above) on rows ordered as the
  # data-sharded micro-batches (pipeline_run), not the checker's
  # unannotated re-export of this program: one XLA compile fewer.
  r = check.CheckFunction(Step, inputs, mesh_shape, compare=False, run=True,
                          expect=['has:collective-permute',
                                  'only:collective-permute,all-reduce',
                                  'no-all-gather:theta'])
  assert r.ok, r.Report()  # The expectations (matches: None).
  plain = Toy(None, None).Instantiate()
  theta = inputs.theta.Transform(tf.constant)
  rows = pipeline_run.MicroBatchRows(_B, 2, layer.DataShards()).reshape(-1)
  loss, grads, _ = _LossAndGrads(plain, theta, tf.gather(x, rows),
                                 tf.gather(inputs.cot, rows), True)
  np.testing.assert_allclose(r.outputs['loss'], loss.numpy(), rtol=1e-5)
  for (key, _), g in zip(theta.FlattenItems(), grads):
    got = r.outputs[f'grads.{key}']
    assert np.linalg.norm(got - g.numpy()) <= 1e-5 * np.linalg.norm(got), key
  assert r.input_shardings['theta.w'].startswith(
      '{devices=[2,1]' if len(mesh_shape) == 1 else '{devices=[2,1,2]')
