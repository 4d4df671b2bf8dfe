"""A cell pipeline's weights: L cells of different structures stacked by stage.

GPipe §2.2 keeps each cell's weights on its own accelerator only. The
cells of `pipeline_cells.CellPipelinedLayer` have different weight
structures (a reduction cell is not a normal cell), so they cannot be
stacked leaf by leaf as `pipeline_weights` stacks copies of one body.
Instead every stage's weights are one flat row:

  w       [K, Wmax]     trainable: stage k's cells' weights, each flattened,
                        concatenated in cell order, zero padded to the
                        largest stage's Wmax;
  moving  [K, 3, Dmax]  batch norm's moving averages (batch_norm.MOVING,
                        [3, D] per layer, columns independent) concatenated
                        along D, zero padded: the same update rule as a
                        BatchNormLayer's `moving` (MovingAverage), whose
                        padded columns receive n = 0 (no change).

Dim 0 is split over the stage mesh axis, so a device holds its own stage's
row. With the circular schedule a stage's row holds its R chunks' cells
(chunks k, k + K, ...), in cell order. Cell i's weights are initialised as the unpipelined cell's would be
(each leaf by its own layer's `InitialWeightValue`, i.e. seeds of
(random_seed, weight path), the cells adopted as `<pipeline path>/cell_<i>`).
`CellThetas` gives the per-cell theta NestedMaps back, `Stack` the inverse.
"""

import numpy as np
import tensorflow as tf

from lingshard.layers import batch_norm
from lingshard.nested_map import NestedMap


class CellWeightsError(ValueError):
  """Cell weights the pipeline cannot stack (one line)."""


class _Leaf:
  """One weight of one cell: where it lives in its stage's row."""

  def __init__(self, key, wp, owner, name, moving, offset):
    self.key, self.wp, self.owner, self.name = key, wp, owner, name
    self.moving, self.offset = moving, offset
    self.shape = [int(d) for d in wp.shape]
    # Flat entries in `w`, or columns (D) in `moving`.
    self.size = self.shape[-1] if moving else int(np.prod(self.shape))


def _IsMoving(key, wp):
  return (key.split('.')[-1] == batch_norm.MOVING and
          wp.update_rule is batch_norm.MovingAverage and
          len(wp.shape) == 2 and int(wp.shape[0]) == 3)


class CellWeights:
  """The layout of L cells' weights in the stacked `w` / `moving`.

  Args:
    name: the pipeline's name (error messages).
    cells: the L cell layers (adopted under the pipeline).
    splits: cell counts per chunk of consecutive cells: K R counts, chunk
      j on stage j % K (R = 1: one chunk per stage).
    dtype: the weights' dtype (every cell weight must have it).
    num_stages: K (None: len(splits), one chunk per stage).
  """

  def __init__(self, name, cells, splits, dtype, num_stages=None):
    self.chunk_splits = [int(s) for s in splits]
    self.num_stages = k = num_stages or len(self.chunk_splits)
    starts = np.cumsum([0] + self.chunk_splits)
    self.chunk_cells = [list(range(int(starts[j]), int(starts[j + 1])))
                        for j in range(len(self.chunk_splits))]
    # A stage's row holds its chunks' cells in cell order (chunks k, k + K,
    # ...: ascending), so each device keeps only its own chunks' weights.
    self.stage_cells = [
        sum((self.chunk_cells[j] for j in range(s, len(splits), k)), [])
        for s in range(k)]
    self.splits = [len(c) for c in self.stage_cells]
    self.stage_of = np.zeros([len(cells)], np.int64)
    for s, stage_cells in enumerate(self.stage_cells):
      self.stage_of[stage_cells] = s
    self.declared = [cell.DeclaredWeights() for cell in cells]
    self.leaves = []  # Per cell: [_Leaf] in its theta's Flatten() order.
    rows = np.zeros([self.num_stages, 2], np.int64)  # (w, moving) used.
    rates = set()
    for i, (cell, declared) in enumerate(zip(cells, self.declared)):
      owners = {}  # id(WeightParams) -> (its layer, its name).
      for layer in cell.AllLayers():
        for wname, wp in layer.weight_params.items():
          owners[id(wp)] = (layer, wname)
      stage, leaves = self.stage_of[i], []
      for key, wp in declared.FlattenItems():
        if tf.as_dtype(wp.dtype) != tf.as_dtype(dtype):
          raise CellWeightsError(
              f'{name}: cell {i} weight {key} is {tf.as_dtype(wp.dtype).name}'
              f', not the pipeline dtype {tf.as_dtype(dtype).name}')
        moving = _IsMoving(key, wp)
        if moving:
          rates.add(float(wp.count_update_rate))
        elif not wp.trainable or wp.count_update_rate is not None:
          raise CellWeightsError(
              f'{name}: cell {i} weight {key} is neither trainable nor a '
              'batch-norm moving average; a cell pipeline stacks only those')
        leaf = _Leaf(key, wp, *owners[id(wp)], moving,
                     int(rows[stage, int(moving)]))
        rows[stage, int(moving)] += leaf.size
        leaves.append(leaf)
      self.leaves.append(leaves)
    if len(rates) > 1:
      raise CellWeightsError(f'{name}: the cells\' batch norms have decays '
                             f'1 - {sorted(rates)}; a cell pipeline stacks '
                             'one moving-average rate')
    self.rate = rates.pop() if rates else None
    self.w_size = max(int(rows[:, 0].max()), 1)
    self.moving_size = int(rows[:, 1].max())  # 0: no batch norm at all.
    self.dtype = dtype

  def Cells(self, stage):
    """The cell indices of `stage` (all its chunks), ascending."""
    return list(self.stage_cells[stage])

  def ChunkCells(self, chunk):
    """The cell indices of chunk j (on stage j % K)."""
    return list(self.chunk_cells[chunk])

  def StageThetas(self, stage, w, moving, cells=None):
    """Per cell of `stage` (or of `cells`, some of its cells), its theta
    from the stage's row w [Wmax] and moving [3, Dmax] (None without batch
    norm)."""
    out = []
    for i in (self.Cells(stage) if cells is None else cells):
      leaves = []
      for leaf in self.leaves[i]:
        if leaf.moving:
          leaves.append(moving[:, leaf.offset:leaf.offset + leaf.size])
        else:
          leaves.append(tf.reshape(w[leaf.offset:leaf.offset + leaf.size],
                                   leaf.shape))
      out.append(self.declared[i].Pack(leaves))
    return out

  def CellThetas(self, theta):
    """The L per-cell thetas of the stacked theta NestedMap(w, moving)."""
    out = [None] * len(self.leaves)
    for stage in range(self.num_stages):
      moving = theta.moving[stage] if self.moving_size else None
      for i, cell_theta in zip(self.Cells(stage), self.StageThetas(
          stage, theta.w[stage], moving)):
        out[i] = cell_theta
    return out

  def Stack(self, cell_thetas):
    """NestedMap(w [K, Wmax], moving [K, 3, Dmax]) of L per-cell thetas."""
    ws, movings = [], []
    for stage in range(self.num_stages):
      flat, cols = [], []
      for i in self.Cells(stage):
        for leaf, value in zip(self.leaves[i], cell_thetas[i].Flatten()):
          value = tf.cast(value, self.dtype)
          if leaf.moving:
            cols.append(value)
          else:
            flat.append(tf.reshape(value, [-1]))
      row = tf.concat(flat + [tf.zeros([0], self.dtype)], 0)
      ws.append(tf.pad(row, [[0, self.w_size - row.shape[0]]]))
      col = tf.concat(cols + [tf.zeros([3, 0], self.dtype)], 1)
      movings.append(tf.pad(col, [[0, 0], [0, self.moving_size -
                                           col.shape[1]]]))
    out = NestedMap(w=tf.stack(ws))
    if self.moving_size:
      out.moving = tf.stack(movings)
    return out

  def InitialThetas(self):
    """The L cells' initial thetas, each leaf its own layer's."""
    return [self.declared[i].Pack([
        leaf.owner.InitialWeightValue(leaf.name, leaf.wp)
        for leaf in leaves]) for i, leaves in enumerate(self.leaves)]
