"""GPipe: a stack of L layers as a K-stage pipeline (GPipe §2).

`PipelinedLayer` runs `num_layers` L copies of the body layer (`body_tpl`)
as K cells of consecutive layers (`StageSplits()`, by cost, GPipe §2.2) on
M micro-batches of the mini-batch. The parts live in their own modules:
stacked [K, S, ...] weights and bodies of different shapes
(pipeline_weights), re-materialisation (pipeline_remat), combining the
body's aux over layers and micro-batches (pipeline_aux), cost-based stage
splits (pipeline_partition), one FProp's state and the micro-batch layout
(pipeline_run: micro-batches are blocked within data shards, so an MoE
body's groups are the unpipelined model's), the schedule object
(pipeline_schedule). This module is the unrolled runner.

The schedule is an object (`schedule`, pipeline_schedule: which
micro-batch and which layer chunk each stage works on in iteration t, what
enters stage 0, the shift, which outputs are real); both runners below
read it, and each step returns its values. Unrolled (the XLA SPMD path):

    state = Shift(Entering(0), zeros [K, b, ...], 0)
    for t in range(N):
      mb, chunk = StageWork(t)                     # [K]; mb -1 = bubble
      out, aux, token = RunStages(theta, state, mb, chunk, token)
      last[t] = sum_k(out * [k == K - 1])          # the last stage's output
      rows[t] = (aux, real slots, their layers)
      state = Shift(Entering(t + 1, last), out, t + 1)
    y = last[OutputIterations]

(Only the last stages' outputs that are used are computed.) Fill-drain
(GPipe §2.2): N = M + K - 1, stage k on micro-batch t - k, all its
layers; Entering(t) = input t (bubble from M on); y = last[K - 1:].
Circular(R): stage k holds chunks k, k + K, ..., k + (R - 1) K; N = R M +
K - 1, stage k on micro-batch (t - k) % M, chunk (t - k) // M;
Entering(t) = input t for t < M, else last[t - M + K - 1] (the micro-batch
goes round again); y = last[(R - 1) M + K - 1:]. Bubble (K - 1) / N.

The state [K, b, ...] (K over `stage_mesh_axis`, b over `batch_mesh_axis`)
holds each stage's current input (x, paddings and the per-example
extras). `Shift` is a pad-and-slice along K plus a select (a
collective-permute when K is split); the last stage's output is taken by a
masked sum over K (an all-reduce). Stages in the bubble (GPipe §2.2 fill /
drain: micro-batch outside [0, M)) compute on zeros; their outputs and aux
are dropped. Gradients of the mini-batch loss flow through all
micro-batches, so one GradientTape gives the accumulated gradient, applied
once: training is the same math as the unpipelined stack.

With remat and `loop=True` (the default) the loop is a forward and a
hand-written backward `tf.while_loop` (pipeline_loop): the program holds
one iteration of each, whatever M and K. Otherwise (`loop=False`, or
without remat) the loop above is a static Python loop: the program holds
all N iterations (XLA's cost analysis then counts each).

Re-materialisation (GPipe §2.3, `remat=True`, pipeline_remat): each
iteration's stages run vectorised over K (`tf.vectorized_map` over the
stacked weights: XLA partitions the stage dim without gathering stage
weights) as one custom-gradient function that keeps only its inputs.
`remat=False`: activations are kept and TF differentiates a Python loop
over the K stages (not vectorised: TF's gradient of vectorised ops such as
reduce_mean needs XLA compile-time constants that would turn the step's
arguments into constants), so the SPMD path with a split stage dim is
`remat=True`. The body runs under `dropout.KeyedMasks(layer index, the
micro-batch's example rows)`: dropout masks (and MoE routing draws, keyed
by the same layer index) depend on (seed, layer, step, example), not on K,
M or recomputation.

The body is called as `body.FProp(theta, x, paddings, *extras, step=step)`,
plus `token_offset=` when FProp gets one: each row's global first token,
`token_offset + row * T` (T = the tokens of a row, x.shape[1:-1]), so an MoE
body's routing randomness is the unpipelined model's. A bubble stage's
micro-batch is padding everywhere (paddings 1; its outputs and aux are
dropped). The body's aux is combined per layer over the micro-batches and
then over layers (pipeline_aux); `FPropPerLayer` returns the per-layer aux.

Annotations inside the stages (`body_annotations`): by default the body is
built without a device mesh (the partitioner propagates from the stacked
weights and the [K, b, ...] state). With `body_annotations=True` the body
keeps its mesh and every annotation it makes, traced under
`sharding.VectorizedOver(stage_mesh_axis)`, gains the stage dim (e.g. an
MoE body's dispatch split over its expert axis inside each stage).

Inference (`is_inference`): the same weights run unpipelined, layer after
layer on the whole batch (`FPropUnpipelined`).
"""

import numpy as np
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.layers import dropout
from lingshard.layers import micro_batches
from lingshard.layers import pipeline_aux
from lingshard.layers import pipeline_loop
from lingshard.layers import pipeline_partition
from lingshard.layers import pipeline_remat
from lingshard.layers import pipeline_run
from lingshard.layers import pipeline_schedule
from lingshard.layers import pipeline_stages
from lingshard.layers import pipeline_weights
from lingshard.layers import remat
from lingshard.nested_map import NestedMap


class PipelineError(ValueError):
  """A pipeline configuration that cannot run (one line)."""


class PipelinedLayer(base_layer.BaseLayer):
  """L copies of `body_tpl` as a K-stage GPipe pipeline (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('body_tpl', None, 'Params of ONE layer (all L positions '
             'copy it) or a list of L layer params with one weight structure '
             '(shapes may differ: see pipeline_weights); FProp(theta, x, '
             'paddings, *extras, step=) -> (y, aux).')
    p.Define('num_layers', 0, 'L: number of copies of the body.')
    p.Define('num_stages', 1, 'K: number of pipeline stages (cells).')
    p.Define('num_micro_batches', None,
             'M: micro-batches per mini-batch (or set micro_batch_size).')
    p.Define('micro_batch_size', None,
             'b: examples per micro-batch (or set num_micro_batches).')
    p.Define('schedule', pipeline_schedule.FillDrain.Params(),
             'The schedule (pipeline_schedule): FillDrain (GPipe), '
             'Circular (repeats R: stage k holds layer chunks k, k + K, ..., '
             'bubble (K - 1) / (R M + K - 1)), or a subclass.')
    p.Define('remat', True, 'Recompute each stage forward in backprop.')
    p.Define('loop', True,
             'With remat: run the schedule as a forward and a backward '
             'tf.while_loop (pipeline_loop: the program holds one iteration '
             'of each, whatever M and K); False: a Python loop (the program '
             'holds all M + K - 1; XLA\'s cost analysis then counts each).')
    p.Define('layer_costs', None,
             'Optional L estimated layer costs; None = each layer\'s own '
             'matmul FLOPs per token (2 x its weights, as count_params).')
    p.Define('stage_splits', None,
             'Optional K layer counts per stage; overrides layer_costs.')
    p.Define('stage_mesh_axis', None,
             'Mesh axis (name or index) of the stage dim; None = no split.')
    p.Define('batch_mesh_axis', None,
             'Mesh axis (name or index), or tuple of axes, splitting the '
             'batch dim of the per-example inputs and the stage state (data '
             'parallelism); None = not split.')
    p.Define('metrics_cls', None,
             'The layer class whose CombineMetricParts combines the body\'s '
             'metrics over micro-batches (e.g. the MoE class: counts sum); '
             'None = BaseLayer\'s (the mean).')
    p.Define('body_annotations', False,
             'Keep the body\'s sharding annotations inside the stages, '
             'each gaining the stage dim (module docstring); False = the '
             'body has no device mesh.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.body_tpl is None:
      raise PipelineError(f'{p.name}: body_tpl is not set')
    if p.num_layers <= 0 or p.num_stages <= 0:
      raise PipelineError(f'{p.name}: num_layers {p.num_layers} and '
                          f'num_stages {p.num_stages} must be > 0')
    if p.num_stages > p.num_layers:
      raise PipelineError(f'{p.name}: num_stages {p.num_stages} exceeds '
                          f'num_layers {p.num_layers}; use at most '
                          f'{p.num_layers} stages')
    if (p.num_micro_batches is None) == (p.micro_batch_size is None):
      raise PipelineError(f'{p.name}: set exactly one of num_micro_batches '
                          f'({p.num_micro_batches}) and micro_batch_size '
                          f'({p.micro_batch_size})')
    for name in ('num_micro_batches', 'micro_batch_size'):
      value = p.Get(name)
      if value is not None and value <= 0:
        raise PipelineError(f'{p.name}: {name} must be > 0, got {value}')
    self._CheckMesh()
    schedule = p.schedule.Instantiate()
    self.__dict__['_schedule'] = schedule
    self._CheckSchedule(p.num_micro_batches)
    body, layer_wps = self._CreateBody()
    stack = pipeline_weights.StackedWeights(
        self._ComputeSplits(layer_wps), body.DeclaredWeights(), layer_wps,
        schedule.repeats)
    self.__dict__['_body'] = body
    self.__dict__['_stack'] = stack
    stack.Declare(self, p.stage_mesh_axis)

  # ------------------------------------------------------------ structure
  def _CreateBody(self):
    """(the executed body: the widest layer, each layer's own weights).

    The body is not a child: its own variables are never created, the
    stacked ones are. It keeps a parent so its path (and hence the seeds of
    its dropout) lies under this layer.
    """
    p = self.params
    tpls = p.body_tpl
    if not isinstance(tpls, (list, tuple)):
      tpls = [tpls] * p.num_layers
    elif len(tpls) != p.num_layers:
      raise PipelineError(f'{p.name}: body_tpl lists {len(tpls)} layers for '
                          f'num_layers {p.num_layers}')
    built = {}

    def Declare(tpl):
      lp = self._ChildParams('body', tpl)
      if not p.body_annotations:
        lp.device_mesh = None  # Propagated from the weights and state.
      built[id(tpl)] = lp
      return lp.Instantiate().DeclaredWeights()

    try:
      widest, distinct, declared, _ = pipeline_weights.WidestBody(
          p.name, tpls, Declare)
    except pipeline_weights.StackError as e:
      raise PipelineError(str(e)) from None
    body = self._Adopt(built[id(distinct[widest])].Instantiate(), 'body')
    by_tpl = {id(t): dw for t, dw in zip(distinct, declared)}
    # Per layer: {weight key: its own WeightParams} (init, shape).
    return body, [dict(by_tpl[id(t)].FlattenItems()) for t in tpls]

  def _CheckMesh(self):
    p = self.params
    if p.stage_mesh_axis is None or p.device_mesh is None:
      return
    size = sharding.AxisSize(p.device_mesh, p.stage_mesh_axis,
                             p.mesh_axis_names)
    if p.num_stages != size:
      raise PipelineError(f'{p.name}: num_stages {p.num_stages} does not fit '
                          f'the mesh axis {p.stage_mesh_axis} of size {size}; '
                          f'set num_stages to {size}')

  def _CheckSchedule(self, m):
    p = self.params
    try:
      self.schedule.Check(p.name, p.num_layers, p.num_stages, m)
    except pipeline_schedule.ScheduleError as e:
      raise PipelineError(str(e)) from None

  def _ComputeSplits(self, layer_wps):
    """K R layer counts per chunk (R = 1: per stage)."""
    p = self.params
    try:
      return pipeline_partition.StageSplits(
          p.name, p.num_stages * self.schedule.repeats, p.num_layers,
          p.stage_splits, p.layer_costs, layer_wps)
    except pipeline_partition.PartitionError as e:
      raise PipelineError(str(e)) from None

  @property
  def body(self):
    """The one body layer instance (all L positions share it)."""
    return self.__dict__['_body']

  def LayerShapes(self, key):
    """L shapes of body weight `key` (e.g. 'fc.w'): each layer's own, which
    differ from the stacked (widest) shape when body_tpl lists layers."""
    return [list(wps[key].shape) for wps in self._stack.layer_wps]

  @property
  def schedule(self):
    """The schedule object (pipeline_schedule)."""
    return self.__dict__['_schedule']

  def StageSplits(self):
    """Layers per stage (K ints; with R chunks per stage, their sum)."""
    k = self.params.num_stages
    return [sum(self._stack.splits[st::k]) for st in range(k)]

  def ChunkSplits(self):
    """Layers per chunk (K R ints, chunk r K + k on stage k)."""
    return list(self._stack.splits)

  def LayerThetas(self, theta):
    """L per-layer thetas (the body's structure), in stack order."""
    return self._stack.LayerThetas(theta)

  # BaseLayer's weight hooks: theta is the body's structure, stacked.
  def PackOwnWeights(self, own):
    return self._stack.Pack(own)

  def InitialWeightValue(self, name, wp):
    """Stacked; layer l's slice is initialised as its own layer."""
    return self._stack.InitialValue(self, name, wp)

  def ShardTheta(self, theta):
    """Annotates the stacked weights: stage dim over stage_mesh_axis."""
    leaves = []
    for (flat, _, _), value in zip(self._stack.flat_keys, theta.Flatten()):
      wp = self._weight_params[flat]
      leaves.append(sharding.mesh_split(value, wp.device_mesh,
                                        wp.tensor_split_dims_mapping,
                                        self.params.mesh_axis_names))
    return self._stack.tpl.Pack(leaves)

  # ------------------------------------------------------------------ fprop
  def _NumMicroBatches(self, batch):
    """M (micro_batches.NumMicroBatches), checked against the schedule."""
    m = micro_batches.NumMicroBatches(self.params, batch, self.DataShards(),
                                      error=PipelineError)
    self._CheckSchedule(m)
    return m

  def DataShards(self):
    """D: the size of batch_mesh_axis in the device mesh (1 if none)."""
    p = self.params
    return sharding.AxisSize(p.device_mesh, p.batch_mesh_axis,
                             p.mesh_axis_names)

  def MicroBatchRows(self, batch, m):
    """int64 [M, b]: the mini-batch row of each micro-batch row
    (pipeline_run: blocked within each of the D data shards)."""
    return pipeline_run.MicroBatchRows(batch, m, self.DataShards())

  def FPropUnpipelined(self, theta, inputs, paddings, *extras, step=None,
                       example_offset=0, token_offset=None):
    """The L layers one after another on the whole batch: (y, aux).

    Dropout is keyed like the pipeline's, rows numbered from example_offset
    (and token_offset passed on as given); aux is combined as in FProp
    with one micro-batch.
    """
    y, per_layer = self.FPropPerLayerUnpipelined(
        theta, inputs, paddings, *extras, step=step,
        example_offset=example_offset, token_offset=token_offset)
    return y, self._CombineLayers(per_layer)

  def FPropPerLayerUnpipelined(self, theta, inputs, paddings, *extras,
                               step=None, example_offset=0,
                               token_offset=None):
    """FPropUnpipelined with the aux of each of the L layers: (y, [aux])."""
    x, auxes = inputs, []
    kwargs = {} if token_offset is None else {'token_offset': token_offset}
    for index, layer_theta in enumerate(self.LayerThetas(theta)):
      with dropout.KeyedMasks(index, example_offset):
        x, aux = self.body.FProp(layer_theta, x, paddings, *extras, step=step,
                                 **kwargs)
      auxes.append(self._CombineMicroBatches([NestedMap(aux or {})]))
    return x, auxes

  def FProp(self, theta, inputs, paddings, *extras, step=None,
            token_offset=None):
    """inputs [B, ...], paddings [B, ...], extras [B, ...] -> (y, aux).

    Runs the schedule of the module docstring; see pipeline_aux for how
    aux is combined. token_offset: None, or the global index of the first
    token of the batch (passed on to the body per row).
    """
    y, per_layer = self.FPropPerLayer(theta, inputs, paddings, *extras,
                                      step=step, token_offset=token_offset)
    return y, self._CombineLayers(per_layer)

  def FPropPerLayer(self, theta, inputs, paddings, *extras, step=None,
                    token_offset=None):
    """FProp with the aux of each of the L layers (combined over the
    micro-batches, pipeline_aux): (y, [L aux])."""
    p = self.params
    if p.is_inference:
      return self.FPropPerLayerUnpipelined(theta, inputs, paddings, *extras,
                                           step=step,
                                           token_offset=token_offset)
    inputs, paddings = (tf.convert_to_tensor(inputs),
                        tf.convert_to_tensor(paddings))
    extras = [tf.convert_to_tensor(e) for e in extras]
    batch = inputs.shape[0]
    if batch is None:
      raise PipelineError(f'{p.name}: the batch dim of the inputs must be '
                          'static')
    m = self._NumMicroBatches(int(batch))
    run = pipeline_run.PipelineRun(
        self, self.ShardTheta(theta.Transform(_DenseGradient)),
        [inputs, paddings] + list(extras), m, step, token_offset)
    try:
      tables = pipeline_schedule.Tables(self.schedule, m, p.num_stages)
    except pipeline_schedule.ScheduleError as e:
      raise PipelineError(f'{p.name}: {e}') from None
    if p.remat and p.loop:
      outputs, aux_rows = pipeline_loop.LoopedSchedule(
          self, run, tables).Outputs()
      return run.Unblock(outputs), self._PerLayerAux(aux_rows)
    shift = self.schedule.Shift
    state = [shift(self, e, b, 0) for e, b in
             zip(self.Entering(run, tables, 0, {}), run.BubbleState())]
    token, last, aux_rows, needed = run.token, {}, [], tables.Needed()
    for t in range(tables.n):
      out, aux_list, token = self.RunStages(run, state, tables.mb[t],
                                            tables.chunk[t], token)
      if t in needed:
        last[t] = self.LastStage(run, out)
      aux_rows.append(pipeline_stages.AuxRow(self, aux_list, tables.mb[t],
                                             tables.chunk[t]))
      if t + 1 < tables.n:
        state = [shift(self, e, s, t + 1) for e, s in
                 zip(self.Entering(run, tables, t + 1, last),
                     [out] + state[1:])]
    outputs = tf.stack([last[t] for t in tables.outputs.tolist()])
    return run.Unblock(outputs), self._PerLayerAux(aux_rows)

  # ------------------------------------------------------------ the steps
  def Entering(self, run, tables, t, last):
    """Per stream the tensor entering stage 0 in iteration t: the
    schedule's micro-batch (bubble: zeros with paddings 1), its x the
    last stage's output `last[source]` when the schedule recirculates."""
    mb, source = int(tables.enter_mb[t]), int(tables.enter_src[t])
    if mb < 0:
      return list(run.bubble)
    streams = [s[mb] for s in run.micro]
    if source >= 0:
      streams[0] = last[source]
    return streams

  def LastStage(self, run, out):
    """[b, ...]: the last stage's output of out [K, b, ...]. A masked sum
    over K, not a slice: XLA SPMD makes it an all-reduce (a slice of the
    split dim and its gradient become all-to-alls)."""
    return tf.reduce_sum(out * run.last_mask, 0)

  def RunStages(self, run, state, stage_mb, stage_chunk, token):
    """Every stage's chunk on its state, vectorised over K; returns
    (outputs [K, b, ...], per slot the aux NestedMap, leaves [K, ...],
    the next ordering token (pipeline_remat)).

    Dropout keys: row r of micro-batch i is example run.rows[i, r]; a
    stage in the bubble uses micro-batch 0's keys (its outputs are
    dropped).
    """
    p = self.params
    one_stage, over_stages = pipeline_stages.StageFunctions(self, run)
    theta_leaves = run.theta.Flatten()
    consts = pipeline_stages.StageConstants(self, run, stage_mb, stage_chunk)
    elems = theta_leaves + state
    if self.params.remat:
      results = pipeline_remat.RematStages(
          lambda ins: over_stages('forward', one_stage, ins),
          lambda ins, dys: pipeline_remat.StagesVjp(over_stages, one_stage,
                                                    ins, dys),
          elems, consts, token, len(theta_leaves))
    else:
      # No remat: TF differentiates a loop over the K stages (activations
      # are kept). Not vectorised: TF's gradient of pfor ops can need XLA
      # compile-time constants (e.g. for reduce_mean), which would turn the
      # program's arguments into constants.
      k = p.num_stages
      per_stage = [tf.unstack(t, num=k) for t in elems + consts]
      outs = [one_stage([t[i] for t in per_stage]) for i in range(k)]
      results = [tf.stack(list(ts)) for ts in zip(*outs)]
    out = self.ShardState(results[0])
    # A zero that depends on this iteration's output (pipeline_remat).
    return out, pipeline_stages.PackAux(run, results[1:]), remat.OpaqueZero(
        out)

  # ------------------------------------------------------------- helpers
  def AnnotateLeading(self, t, leading, replicated=False):
    """t split on its leading dims as `leading` (mesh axes or None; all
    None: left unannotated unless `replicated`)."""
    p = self.params
    leading = [-1 if a is None else a for a in leading][:t.shape.rank]
    if p.device_mesh is None or (not replicated and
                                 all(a == -1 for a in leading)):
      return t
    return sharding.mesh_split(t, p.device_mesh,
                               leading + [-1] * (t.shape.rank - len(leading)),
                               p.mesh_axis_names)

  def ShardState(self, t):
    """[K, b, ...]: K over the stage axis, b over the batch axis."""
    p = self.params
    return self.AnnotateLeading(t, [p.stage_mesh_axis, p.batch_mesh_axis])

  def WeightLayout(self):
    """[K, S]: the layer slot s of stage k holds, -1 when padded (a
    fill-drain and a circular run of one shape differ here)."""
    return np.where(self._stack.active > 0, self._stack.layer_ids, -1)

  @property
  def stack(self):
    """The stacked weights' layout (pipeline_weights.StackedWeights)."""
    return self._stack

  def ShardBatch(self, t):
    """[D, ...]: D over the batch axis."""
    return self.AnnotateLeading(t, [self.params.batch_mesh_axis])

  def _PerLayerAux(self, aux_rows):
    """L auxes, each combined over its micro-batches, from the
    iterations' aux (stages in the bubble dropped)."""
    per_layer = pipeline_aux.PerLayer(aux_rows, self.params.num_layers)
    return [self._CombineMicroBatches(values) for values in per_layer]

  def _CombineMicroBatches(self, values):
    try:
      cls = self.params.metrics_cls or base_layer.BaseLayer
      return pipeline_aux.CombineMicroBatches(values, cls.CombineMetricParts)
    except pipeline_aux.AuxError as e:
      raise PipelineError(f'{self.params.name}: {e}') from None

  def _CombineLayers(self, per_layer):
    try:
      return pipeline_aux.CombineLayers(per_layer)
    except pipeline_aux.AuxError as e:
      raise PipelineError(f'{self.params.name}: {e}') from None


@tf.custom_gradient
def _DenseGradient(w):
  """Identity whose gradient is a dense tensor (not IndexedSlices)."""
  return tf.identity(w), tf.convert_to_tensor
