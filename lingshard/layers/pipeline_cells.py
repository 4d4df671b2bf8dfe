"""GPipe over cells that change activation shape and read two earlier outputs.

`CellPipelinedLayer` runs L cells (`cell_tpls`; AmoebaNet's cells,
layers/amoebanet.py) as K stages of consecutive cells on M micro-batches,
fill-drain (GPipe §2.2). A cell is called `y = cell.FProp(theta, x, x_prev)`:
x is the previous cell's output, x_prev the previous-but-one's (None for the
first cell; cell 1's x_prev is the pipeline's input). Unlike
`pipeline.PipelinedLayer` (one body vectorised over K), every stage runs its
own program: activations change shape (reduction cells halve H, W and double
the channels) and the weight structures differ, as in Lingvo's gpipe.py
FeatureExtractionLayer, which places each cell on its own device; here the
program is SPMD.

Build time: each cell is traced once on its input shapes (x and x_prev, per
example) to derive its output shape (`StageShapes()` prints each stage's
boundary) and its cost, the matmul / convolution FLOPs of the traced ops
(Conv2D: 2 |out| KH KW Cin; depthwise: 2 |out| KH KW; einsum: 2 x the
product of every index's size; MatMul: 2 M K N), which balances the stages
(pipeline_partition.PartitionByCost) unless `stage_splits` is given.
Weights: pipeline_cell_weights (one flat row per stage, split over the
stage mesh axis; batch-norm moving averages in their own [K, 3, Dmax]).

Schedules (`schedule`, pipeline_schedule): FillDrain (GPipe §2.2: stage k
holds the k-th of K groups of consecutive cells) or Circular(R): the cells
are cut into K R chunks of consecutive cells, stage k holds chunks k,
k + K, ..., and a micro-batch goes R times round the ring, re-entering
stage 0 with its previous pass's last-stage carrier (y, y_prev): bubble
(K - 1) / (R M + K - 1) instead of (K - 1) / (M + K - 1). A stage runs one
chunk per iteration, the one its (micro-batch, pass) needs.

Running, per FProp (the schedule's tables; fill-drain shown):

    state = Shift(Entering(0), zeros [K, b, P], 0)
    for t in range(M + K - 1):
      out = Stages(theta, state)       # stage k: unpack (x, x_prev), its
                                       # cells, pack (y, y_prev); bubble: 0
      last[t] = sum_k(out * [k == K - 1])
      state = Shift(Entering(t + 1), out, t + 1)
    y = unpack(last[K - 1:])

The carrier state [K, b, P] holds each stage's input (x, x_prev) flattened
and concatenated per example, zero padded to P (the largest stage boundary);
K over `stage_mesh_axis`, b over `batch_mesh_axis`. Shift is FillDrain's
pad-and-slice along K (a collective-permute when K is split). A stage in
the bubble computes nothing (its output is zeros): no batch-norm sums from
it reach the moving averages' slot.

Stages: without a device mesh, a Python loop over the K stages, each its
own cells (the stage index is static). With a mesh, a partial manual
region over `stage_mesh_axis` (sharding.auto_to_manual of the carrier, the
stacked weights and a [K] table of branch indices: each device gets
[1, ...]) in which `tf.switch_case` runs the device's own stage (branch k,
or K = the bubble), then manual_to_auto; the code loops over the local
leading dim, so the checker's unannotated reference (leading dim K) runs
the same program on one device. `remat=True`: each iteration's stages are
one custom-gradient function keeping only their inputs
(pipeline_remat.RematStages), the backward a switch_case over per-stage
VJPs that recompute the stage. The stage functions are traced once per
FProp; the program still holds every stage's cells in each of the M + K - 1
iterations (XLA inlines them): 110k HLO instructions for 4 tiny AmoebaCells,
K = 2, M = 4 (export 16 s, compile 43 s on this host); a tf.while_loop over
the iterations, as pipeline_loop's, would hold one.

Batch norm inside the cells: training statistics are the micro-batch's (what
the cell sees, GPipe §2.2); each BN's moving-average slot receives the
micro-batch's shifted sums, which add over micro-batches to the whole
mini-batch's (layers/batch_norm.py), so the step's update is the
whole-mini-batch one. The cells draw no randomness (`step` is unused).

Inference (`is_inference`): the cells one after another on the whole batch
(`FPropUnpipelined`).
"""

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.layers import batch_norm
from lingshard.layers import micro_batches
from lingshard.layers import pipeline_cell_weights
from lingshard.layers import pipeline_partition
from lingshard.layers import pipeline_remat
from lingshard.layers import pipeline_run
from lingshard.layers import pipeline_schedule
from lingshard.layers import remat
from lingshard.weight_init import WeightInit


def _NoConstantArguments(outs):
  """`outs` (a switch_case's outputs), its Case op told not to resolve its
  arguments as compile-time constants.

  In an XLA context tf2xla tries every Case argument as a constant: value
  inference over its whole producer graph, run by the HLO interpreter. For
  a stage's carrier that graph holds the stem (convolutions, pooling):
  minutes per argument, for every Case of every iteration (spmd_check of
  a pipelined AmoebaNet never finished exporting). The branches need no
  constant argument: the stage is chosen by the index alone.
  """
  op = outs[0].op
  if op.type == 'Identity':  # switch_case returns identities of its outputs.
    op = op.inputs[0].op
  if op.type in ('Case', 'StatelessCase'):
    op._set_attr('_xla_propagate_compile_time_consts',  # pylint: disable=protected-access
                 attr_value_pb2.AttrValue(b=False))
  return outs


class CellPipelineError(ValueError):
  """A cell pipeline that cannot be built or run (one line)."""


def _Size(shape):
  return 0 if shape is None else int(np.prod(shape))


def _Text(shape):
  return '-' if shape is None else '[' + ','.join(str(d) for d in shape) + ']'


def _OpFlops(op):
  """Matmul / convolution FLOPs of one traced op (module docstring)."""
  try:
    out = op.outputs[0].shape.as_list() if op.outputs else None
    ins = [t.shape.as_list() for t in op.inputs]
    if op.type == 'Conv2D':
      return 2.0 * np.prod(out) * np.prod(ins[1][:3])
    if op.type == 'DepthwiseConv2dNative':
      return 2.0 * np.prod(out) * np.prod(ins[1][:2])
    if op.type == 'MatMul':
      return 2.0 * np.prod(out) * ins[0][0 if op.get_attr('transpose_a')
                                         else 1]
    if op.type == 'Einsum':
      sizes = {}
      operands = op.get_attr('equation').decode().split('->')[0].split(',')
      for letters, shape in zip(operands, ins):
        sizes.update(zip(letters, shape))
      return 2.0 * np.prod(list(sizes.values()))
  except (TypeError, ValueError):  # A dim unknown: not counted.
    return 0.0
  return 0.0


def _Tracer(cell, declared):
  """fn(*theta leaves, x[, x_prev]) -> the cell's output."""
  num = len(declared.Flatten())

  def Trace(*args):
    return cell.FProp(declared.Pack(list(args[:num])), args[num],
                      args[num + 1] if len(args) > num + 1 else None)

  return Trace


class CellPipelinedLayer(base_layer.BaseLayer):
  """L cells as a K-stage fill-drain GPipe pipeline (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('cell_tpls', None, 'The L cells\' params, in order; FProp('
             'theta, x, x_prev) -> y, x_prev None for the first cell.')
    p.Define('input_shape', None, 'Per-example shape of x entering cell 0 '
             '(e.g. (H, W, C)).')
    p.Define('num_stages', 1, 'K: pipeline stages.')
    p.Define('num_micro_batches', 1, 'M: micro-batches per mini-batch.')
    p.Define('schedule', pipeline_schedule.FillDrain.Params(),
             'The schedule (pipeline_schedule): FillDrain (GPipe §2.2) or '
             'Circular(R): stage k holds chunks k, k + K, ... of '
             'consecutive cells and a micro-batch goes R times round.')
    p.Define('stage_splits', None, 'Optional K R cell counts per chunk '
             '(K per stage with fill-drain); None '
             '= balanced by the cells\' FLOPs (PartitionByCost).')
    p.Define('cell_costs', None, 'Optional L cell costs for the balance; '
             'None = each cell\'s traced matmul/conv FLOPs per example.')
    p.Define('remat', True, 'Recompute each iteration\'s stages in backprop '
             '(GPipe §2.3).')
    p.Define('stage_mesh_axis', None, 'Mesh axis (name or index) of the '
             'stage dim; None = not split.')
    p.Define('batch_mesh_axis', None, 'Mesh axis (or tuple) splitting the '
             'carrier\'s batch dim (data parallelism); None = not split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    tpls = list(p.cell_tpls or [])
    if not tpls:
      raise CellPipelineError(f'{p.name}: cell_tpls lists no cells')
    if p.input_shape is None:
      raise CellPipelineError(f'{p.name}: input_shape is not set')
    k, n = p.num_stages, len(tpls)
    if not isinstance(k, int) or k < 1:
      raise CellPipelineError(f'{p.name}: num_stages must be >= 1, got {k!r}')
    if k > n:
      raise CellPipelineError(f'{p.name}: num_stages {k} exceeds the {n} '
                              f'cells; use at most {n} stages')
    m = p.num_micro_batches
    if not isinstance(m, int) or m < 1:
      raise CellPipelineError(f'{p.name}: num_micro_batches must be >= 1, '
                              f'got {m!r}')
    if p.device_mesh is not None and p.stage_mesh_axis is not None:
      size = sharding.AxisSize(p.device_mesh, p.stage_mesh_axis,
                               p.mesh_axis_names)
      if size != k:
        raise CellPipelineError(
            f'{p.name}: num_stages {k} does not fit the mesh axis '
            f'{p.stage_mesh_axis} of size {size}; set num_stages to {size}')
    try:
      self.__dict__['_schedule'] = p.schedule.Instantiate()
      self._schedule.Check(p.name, n, k)
    except (ValueError, AttributeError) as e:
      raise CellPipelineError(str(e)) from None
    cells = []
    for i, tpl in enumerate(tpls):
      try:
        cp = tpl.cls.ForPipeline(self._ChildParams(f'cell_{i:03d}', tpl),
                                 p.name)
      except ValueError as e:
        raise CellPipelineError(str(e)) from None
      cp.device_mesh = None  # Partitioned from the carrier and weights.
      # Not children: only the stacked variables are created; adopted so
      # that each cell's path (its weights' seeds) is a child's.
      cells.append(self._Adopt(cp.Instantiate(), f'cell_{i:03d}'))
    self.__dict__['_cells'] = cells
    shapes, costs = self._TraceCells(cells)
    self.__dict__['_cell_shapes'] = shapes  # L (x, x_prev, y)
    self.__dict__['_cell_costs'] = costs
    splits = self._Splits(n, costs)
    try:
      layout = pipeline_cell_weights.CellWeights(p.name, cells, splits,
                                                 p.dtype, num_stages=k)
    except pipeline_cell_weights.CellWeightsError as e:
      raise CellPipelineError(str(e)) from None
    self.__dict__['_layout'] = layout
    self.__dict__['_initial'] = None
    stage = -1 if p.stage_mesh_axis is None else p.stage_mesh_axis
    self.CreateVariable('w', base_layer.WeightParams(
        [k, layout.w_size], init=WeightInit.Constant(0.0),
        tensor_split_dims_mapping=[stage, -1]))
    if layout.moving_size:
      self.CreateVariable(batch_norm.MOVING, base_layer.WeightParams(
          [k, 3, layout.moving_size], init=WeightInit.Constant(0.0),
          trainable=False, count_update_rate=layout.rate,
          update_rule=batch_norm.MovingAverage,
          tensor_split_dims_mapping=[stage, -1, -1]))

  # ------------------------------------------------------------ build time
  def _TraceCells(self, cells):
    """(L (x, x_prev, y) per-example shapes, L FLOPs), each cell traced on
    a batch of one."""
    p = self.params
    shapes, costs = [], []
    x, prev = tuple(int(d) for d in p.input_shape), None
    for i, cell in enumerate(cells):
      declared = cell.DeclaredWeights()
      specs = [tf.TensorSpec(wp.shape, wp.dtype) for wp in declared.Flatten()]
      specs += [tf.TensorSpec([1, *s], p.fprop_dtype) for s in (x, prev)
                if s is not None]
      try:
        graph = sharding.Function(_Tracer(cell, declared), xla_compiled=False
                                  ).get_concrete_function(*specs).graph
      except (ValueError, TypeError, tf.errors.OpError) as e:
        reason = ' '.join(str(e).split())
        raise CellPipelineError(
            f'{p.name}: cell {i} ({cell.path}) does not take x {_Text(x)} '
            f'and x_prev {_Text(prev)}: {reason}') from None
      if len(graph.outputs) != 1 or graph.outputs[0].shape[0] != 1:
        raise CellPipelineError(f'{p.name}: cell {i} ({cell.path}) must '
                                'return one [B, ...] tensor')
      y = tuple(graph.outputs[0].shape.as_list()[1:])
      shapes.append((x, prev, y))
      costs.append(float(sum(_OpFlops(op) for op in graph.get_operations())))
      prev, x = x, y
    return shapes, costs

  def _Splits(self, n, costs):
    """Cells per chunk: K R counts (K with fill-drain)."""
    p = self.params
    k = p.num_stages * self._schedule.repeats
    if p.stage_splits is not None:
      splits = list(p.stage_splits)
      if (len(splits) != k or any(not isinstance(s, int) or s < 1
                                  for s in splits) or sum(splits) != n):
        raise CellPipelineError(f'{p.name}: stage_splits {splits} must be '
                                f'{k} counts >= 1 summing to the {n} cells')
      return splits
    if p.cell_costs is not None:
      costs = list(p.cell_costs)
      if len(costs) != n or any(c < 0 for c in costs):
        raise CellPipelineError(f'{p.name}: cell_costs must be {n} costs '
                                f'>= 0, got {costs}')
    return pipeline_partition.PartitionByCost(costs, k)

  # ------------------------------------------------------------- structure
  @property
  def cells(self):
    """The L cell layers (not children: their weights are the stacked)."""
    return list(self.__dict__['_cells'])

  def StageSplits(self):
    """Cells per stage (K ints)."""
    return list(self._layout.splits)

  def CellShapes(self):
    """L (x, x_prev, y) per-example shapes (x_prev None for cell 0)."""
    return list(self._cell_shapes)

  def WeightLayout(self):
    """[K, max cells per stage]: the cell each stage's slot holds, -1
    padding (recorded in checkpoints: another split of the cells would
    restore the flat rows permuted)."""
    splits = self._layout.splits
    out = np.full([len(splits), max(splits)], -1, np.int64)
    for stage in range(len(splits)):
      cells = self._layout.Cells(stage)
      out[stage, :len(cells)] = cells
    return out

  def CellParamCounts(self):
    """L counts of each cell's own trainable weights (the stacked `w`
    also holds the padding up to the largest stage: count these)."""
    return [sum(leaf.size for leaf in leaves if not leaf.moving)
            for leaves in self._layout.leaves]

  def CellCosts(self):
    """L per-example matmul / convolution FLOPs of the cells' forward
    (module docstring): what balances the stages."""
    return list(self._cell_costs)

  def _ChunkIO(self, chunk):
    """((x, x_prev) in, (y, y_prev) out) per-example shapes of chunk j
    (stage j % K's pass j // K; with fill-drain chunk k is stage k)."""
    cells = self._layout.ChunkCells(chunk)
    first, last = self._cell_shapes[cells[0]], self._cell_shapes[cells[-1]]
    return (first[0], first[1]), (last[2], last[0])

  def _NumChunks(self):
    return self.params.num_stages * self._schedule.repeats

  def StageShapes(self):
    """K R lines: each stage's chunk of cells and its boundary shapes."""
    lines, k = [], self.params.num_stages
    for chunk in range(self._NumChunks()):
      cells = self._layout.ChunkCells(chunk)
      (x, prev), (y, y_prev) = self._ChunkIO(chunk)
      where = (f'stage {chunk}' if self._schedule.repeats == 1 else
               f'stage {chunk % k} pass {chunk // k}')
      lines.append(f'{where}: cells {cells[0]}-{cells[-1]}, in x '
                   f'{_Text(x)} prev {_Text(prev)} -> out {_Text(y)} prev '
                   f'{_Text(y_prev)}')
    return lines

  def CarrierSize(self):
    """P: the largest per-example size of (x, x_prev) at a chunk boundary."""
    return max(_Size(a) + _Size(b) for chunk in range(self._NumChunks())
               for pair in self._ChunkIO(chunk) for a, b in [pair])

  @property
  def layout(self):
    """The stacked weights' layout (pipeline_cell_weights.CellWeights)."""
    return self._layout

  def CellThetas(self, theta):
    """The L per-cell theta NestedMaps of the stacked theta."""
    return self._layout.CellThetas(theta)

  def StackCellThetas(self, cell_thetas):
    """The stacked theta of L per-cell thetas (CellThetas' inverse)."""
    return self._layout.Stack(cell_thetas)

  def InitialWeightValue(self, name, wp):
    """Each cell's slice initialised as the unpipelined cell's weights."""
    if self.__dict__['_initial'] is None:
      self.__dict__['_initial'] = self._layout.Stack(
          self._layout.InitialThetas())
    return self.__dict__['_initial'][name]

  # ----------------------------------------------------------------- fprop
  def FPropUnpipelined(self, theta, x):
    """The cells one after another on the whole batch: [B, ...] -> y."""
    prev = None
    for cell, cell_theta in zip(self.cells, self.CellThetas(theta)):
      prev, x = x, cell.FProp(cell_theta, x, prev)
    return x

  def DataShards(self):
    """D: the size of batch_mesh_axis in the device mesh (1 if none)."""
    p = self.params
    return sharding.AxisSize(p.device_mesh, p.batch_mesh_axis,
                             p.mesh_axis_names)

  def FProp(self, theta, x, step=None):
    """x [B, *input_shape] -> the last cell's output [B, ...]."""
    del step  # The cells draw no randomness.
    p = self.params
    schedule = self._schedule
    x = tf.convert_to_tensor(x, p.fprop_dtype)
    if tuple(x.shape.as_list()[1:]) != tuple(p.input_shape):
      raise CellPipelineError(f'{p.name}: x must be [B, '
                              f'{", ".join(str(d) for d in p.input_shape)}], '
                              f'got {x.shape.as_list()}')
    if p.is_inference:
      return self.FPropUnpipelined(theta, x)
    if x.shape[0] is None:
      raise CellPipelineError(f'{p.name}: the batch dim of x must be static')
    m = micro_batches.NumMicroBatches(p, int(x.shape[0]), self.DataShards(),
                                      error=CellPipelineError)
    try:
      schedule.Check(p.name, len(self._cells), p.num_stages, m)
    except ValueError as e:
      raise CellPipelineError(str(e)) from None
    theta = self.ShardTheta(theta.Transform(tf.convert_to_tensor))
    weights = [theta.w] + ([theta.moving] if self._layout.moving_size else [])
    micro = tf.unstack(self._Block(x, m), num=m)  # M x [b, ...]
    size = self.CarrierSize()
    entering = [self._Pack([mb], size) for mb in micro]
    zeros = tf.zeros_like(entering[0])
    k = p.num_stages
    tables = pipeline_schedule.Tables(schedule, m, k)
    last_mask = np.zeros([k, 1, 1], np.float32)
    last_mask[-1] = 1.0
    last_mask = tf.constant(last_mask, entering[0].dtype)
    state = self.ShardState(tf.broadcast_to(zeros[tf.newaxis],
                                            [k] + zeros.shape.as_list()))
    state = schedule.Shift(self, entering[0], state, 0)
    token, last, traced = tf.zeros([], tf.float32), {}, {}
    needed = tables.Needed()
    bubble = self._NumChunks()
    for t in range(tables.n):
      # Each stage's chunk id (pass r: r K + k), or the bubble.
      branch = np.where(tables.mb[t] >= 0, tables.chunk[t] * k + np.arange(k),
                        bubble).astype(np.int32)
      out, token = self._RunStages(weights, state, branch, token, traced)
      if t in needed:
        last[t] = tf.reduce_sum(out * last_mask, 0)
      if t + 1 < tables.n:
        mb, src = (int(v[t + 1]) for v in (tables.enter_mb, tables.enter_src))
        # A micro-batch's next pass enters with its last pass's output.
        enter = last[src] if src >= 0 else (entering[mb] if mb >= 0 else
                                            zeros)
        state = schedule.Shift(self, enter, out, t + 1)
    y_shape = self._cell_shapes[-1][2]
    ys = [tf.reshape(last[t][:, :_Size(y_shape)], [-1, *y_shape])
          for t in tables.outputs.tolist()]
    return self._Unblock(tf.stack(ys), m)

  # --------------------------------------------------------- micro-batches
  def _Block(self, t, m):
    """[B, ...] -> [M, b, ...] (pipeline_run: blocked per data shard)."""
    return pipeline_run.Block(t, m, self.DataShards(), self._ShardData)

  def _Unblock(self, t_mb, m):
    return pipeline_run.Unblock(t_mb, m, self.DataShards(), self._ShardData)

  def _ShardData(self, t):
    """[D, ...]: D over the batch axis."""
    return self._AnnotateLeading(t, [self.params.batch_mesh_axis])

  def _AnnotateLeading(self, t, leading):
    p = self.params
    leading = [-1 if a is None else a for a in leading]
    if p.device_mesh is None or all(a == -1 for a in leading):
      return t
    return sharding.mesh_split(t, p.device_mesh, leading + [-1] * (
        t.shape.rank - len(leading)), p.mesh_axis_names)

  def ShardState(self, t):
    """[K, b, P]: K over the stage axis, b over the batch axis."""
    p = self.params
    return self._AnnotateLeading(t, [p.stage_mesh_axis, p.batch_mesh_axis])

  @staticmethod
  def _Pack(tensors, size):
    """[b, size]: the [b, ...] tensors (None skipped) flattened,
    concatenated and zero padded."""
    flat = [tf.reshape(t, [-1, _Size(t.shape[1:])]) for t in tensors
            if t is not None]
    out = tf.concat(flat, 1)
    return tf.pad(out, [[0, 0], [0, size - out.shape[1]]])

  @staticmethod
  def _Unpack(carrier, shapes):
    """The [b, ...] tensors of `shapes` (None: None) packed in carrier."""
    out, start = [], 0
    for shape in shapes:
      if shape is None:
        out.append(None)
        continue
      n = _Size(shape)
      out.append(tf.reshape(carrier[:, start:start + n], [-1, *shape]))
      start += n
    return out

  # ---------------------------------------------------------------- stages
  def _Stage(self, chunk, w, moving, carrier):
    """One chunk of cells on its stage's row of the weights: carrier
    [b, P] -> [b, P]."""
    (x_shape, prev_shape), _ = self._ChunkIO(chunk)
    x, prev = self._Unpack(carrier, [x_shape, prev_shape])
    cells = self._layout.ChunkCells(chunk)
    thetas = self._layout.StageThetas(chunk % self.params.num_stages, w,
                                      moving, cells)
    for i, cell_theta in zip(cells, thetas):
      prev, x = x, self._cells[i].FProp(cell_theta, x, prev)
    return self._Pack([x, prev], carrier.shape[1])

  def _StageVjp(self, chunk, ins, dout):
    """Per input of _Stage (w, [moving,] carrier): its gradient, the
    chunk recomputed (remat)."""
    with tf.GradientTape() as tape:
      tape.watch(ins)
      out = self._Stage(chunk, ins[0], ins[1] if len(ins) == 3 else None,
                        ins[-1])
    return tape.gradient(out, ins, output_gradients=dout,
                         unconnected_gradients='zero')

  def _OverStages(self, fn, ins, maps, branch, like):
    """fn(chunk, its stage's [...] slices of ins) on every stage.

    ins: [K, ...] tensors laid out by `maps` (split mappings); branch [K]:
    stage k's chunk (r K + k), or K R = the bubble, whose outputs are zeros
    like ins[like]. Returns len(like) [K, ...] tensors (module docstring: a
    static loop without a mesh, a switch_case per device in a manual region
    with one).
    """
    p = self.params
    k, bubble = p.num_stages, self._NumChunks()
    if p.device_mesh is None or p.stage_mesh_axis is None:
      outs = []
      for stage in range(k):  # Static: the stage's own cells or nothing.
        local = [t[stage] for t in ins]
        if branch[stage] == bubble:
          outs.append([tf.zeros_like(local[j]) for j in like])
        else:
          outs.append(fn(int(branch[stage]), local))
      return [tf.stack(list(ts)) for ts in zip(*outs)]
    mesh, names = p.device_mesh, p.mesh_axis_names
    manual = None if np.asarray(mesh).ndim == 1 else p.stage_mesh_axis
    local = [sharding.auto_to_manual(t, mesh, mp, names, manual)
             for t, mp in zip(ins, maps)]
    branch_l = sharding.auto_to_manual(tf.convert_to_tensor(branch), mesh,
                                       [p.stage_mesh_axis], names, manual)
    outs = []
    for i in range(local[0].shape[0]):  # 1 per device; K unannotated.
      args = [t[i] for t in local]
      fns = [lambda s=s, a=args: fn(s, a) for s in range(bubble)]
      fns.append(lambda a=args: [tf.zeros_like(a[j]) for j in like])
      outs.append(_NoConstantArguments(tf.switch_case(branch_l[i], fns)))
    outs = [tf.stack(list(ts)) for ts in zip(*outs)]
    return [sharding.manual_to_auto(o, mesh, maps[j], ins[j].shape, names,
                                    manual) for o, j in zip(outs, like)]

  def _RunStages(self, weights, state, branch, token, traced):
    """(out [K, b, P], the next ordering token) of one iteration.

    On a mesh the stages' forward and VJP are each traced once per FProp
    (`traced`, with the branch table an argument) and called by every
    iteration: tracing every stage's cells in each of the M + K - 1
    iterations dominated the export of a pipelined AmoebaNet step.
    """
    p = self.params
    nw = len(weights)
    maps = [[p.stage_mesh_axis] + [-1] * (w.shape.rank - 1) for w in weights]
    state_map = [p.stage_mesh_axis, p.batch_mesh_axis, -1]
    on_mesh = p.device_mesh is not None and p.stage_mesh_axis is not None

    def Over(name, fn, ins, in_maps, like):
      if not on_mesh:
        return self._OverStages(fn, ins, in_maps, branch, like)
      if name not in traced:
        def Traced(branch_k, *ts):
          return self._OverStages(fn, list(ts), in_maps, branch_k, like)

        # Nested in the step's trace: keeps the outer program's choice.
        traced[name] = sharding.Function(Traced, xla_compiled=True)
      return traced[name](tf.constant(branch), *ins)

    def Forward(ins):
      return Over('forward', lambda s, a: [self._Stage(
          s, a[0], a[1] if nw == 2 else None, a[-1])],
                  ins, maps + [state_map], [nw])

    if p.remat:
      def Vjp(ins, dys):
        return Over('vjp', lambda s, a: self._StageVjp(s, a[:nw + 1], a[-1]),
                    list(ins) + list(dys), maps + [state_map] * 2,
                    list(range(nw + 1)))

      out = pipeline_remat.RematStages(Forward, Vjp, weights + [state], [],
                                       token, nw)[0]
    else:
      out = Forward(weights + [state])[0]
    out = self.ShardState(out)
    return out, remat.OpaqueZero(out)
