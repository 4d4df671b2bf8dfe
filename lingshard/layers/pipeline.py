"""GPipe: a stack of L copies of one layer as a K-stage pipeline (GPipe §2).

`PipelinedLayer` runs `num_layers` L copies of the body layer (`body_tpl`)
as K cells of consecutive layers (`StageSplits()`, by cost, GPipe §2.2) on
M micro-batches of the mini-batch.

Layers of different shapes (`body_tpl` a list of L layer params with one
weight structure, e.g. FFN hidden dims or head counts that differ): every
layer runs as the widest one (a listed layer with the largest shape of every
weight) on its weights zero-padded to that shape. Zero-padded hidden units
and heads contribute nothing and get zero gradients (activations with
f(0) = 0: ReLU, GELU, Swish), so each layer computes exactly its own
function; the cost is the widest layer's FLOPs in every slot. The stage
splits balance each layer's own cost (2 x its weights by default).

Weights: theta has the body's theta structure with every weight stacked to
[K, S, ...], S = max(StageSplits()) slots per stage; dim K is split over the
`stage_mesh_axis` of the device mesh (the body's own split mapping follows,
dim S is not split). Cells of unequal size execute padded to S slots:
slot s of stage k holds layer `sum(splits[:k]) + s` when s < splits[k],
else it is a padded slot whose output is its input (an [K, S] active mask)
and whose (zero-initialised) weights get zero gradients. Padded slots are
real variables: parameter counts include them. Layer l is initialised from
seeds of (random_seed, `<path>/layer_<l>/<weight>`), independently per
layer, whatever K is.

Micro-batch i of M is rows i, i + M, i + 2M, ... of the mini-batch (a
reshape to [b, M] and a transpose): with the batch split over a data mesh
axis (`batch_mesh_axis`), every data shard keeps its own rows of every
micro-batch, so forming micro-batches moves no data.

Execution (GPipe §2, fill-drain; the XLA SPMD path): a static Python loop of
M + K - 1 iterations (static: simple for XLA; the program grows with M + K).
The state [K, b, ...] (K over `stage_mesh_axis`, b over `batch_mesh_axis`)
holds each stage's current input (x, paddings and the
per-example extras); in each iteration every stage runs its S slots on its
state, then the state shifts by one along K: stage k's output is stage k+1's
next input and micro-batch i+1 enters stage 0 (a pad-and-slice along K plus a
select: a collective-permute when K is split), and the last stage's output
(a masked sum over K: an all-reduce) is micro-batch i - K + 1 of the
result. Stages outside [0, M) in an iteration (the bubble) compute on zeros;
their outputs and aux are dropped. Gradients of the mini-batch loss flow
through all micro-batches, so one GradientTape gives the accumulated
gradient, applied once: training is the same math as the unpipelined stack.

Re-materialisation (GPipe §2.3, `remat=True`): each iteration's stages run
as one `tf.custom_gradient` function, vectorised over K (`tf.vectorized_map`
over the stacked weights: XLA partitions the stage dim without gathering
stage weights); only its inputs (the stage-boundary states) are kept, and
its gradient recomputes each stage's forward and differentiates it per
stage (again vectorised over K), behind an XLA optimization barrier so XLA
does not merge the recomputation into the forward pass. `remat=False`:
activations are kept and TF differentiates a Python loop over the K stages
(not vectorised: TF's gradient of vectorised ops such as reduce_mean needs
XLA compile-time constants that would turn the step's arguments into
constants), so the SPMD path with a split stage dim is `remat=True`.
Dropout inside the body runs under `dropout.KeyedMasks(layer index,
micro-batch index, M)`: masks depend on (seed, layer, step, example), not on K, M
or recomputation.

The body's aux (`(y, aux)` contract, DEVELOPERS.md) is combined: `aux_loss`
summed over layers and averaged over micro-batches, `metrics` averaged over
layers and micro-batches, and `moments` (batch_norm.BatchNormLayer's
NestedMap(count, mean, m2), or a NestedMap of them) combined exactly over
the micro-batches into a list of L per-layer moments of the whole
mini-batch (GPipe §2.2; `BatchNormLayer.UpdatedMoving`).

Inference (`is_inference`): the same weights run unpipelined, layer after
layer on the whole batch (`FPropUnpipelined`).
"""

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.layers import batch_norm
from lingshard.layers import dropout
from lingshard.layers import pipeline_partition
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
             '(shapes may differ: see the module doc); FProp(theta, x, '
             'paddings, *extras, step=) -> (y, aux).')
    p.Define('num_layers', 0, 'L: number of copies of the body.')
    p.Define('num_stages', 1, 'K: number of pipeline stages (cells).')
    p.Define('num_micro_batches', None,
             'M: micro-batches per mini-batch (or set micro_batch_size).')
    p.Define('micro_batch_size', None,
             'b: examples per micro-batch (or set num_micro_batches).')
    p.Define('remat', True, 'Recompute each stage forward in backprop.')
    p.Define('layer_costs', None,
             'Optional L estimated layer costs; None = each layer\'s own '
             'matmul FLOPs per token (2 x its weights, as count_params).')
    p.Define('stage_splits', None,
             'Optional K layer counts per stage; overrides layer_costs.')
    p.Define('stage_mesh_axis', None,
             'Mesh axis (name or index) of the stage dim; None = no split.')
    p.Define('batch_mesh_axis', None,
             'Mesh axis (name or index) splitting the batch dim of the '
             'per-example inputs and the stage state (data parallelism); '
             'None = not split.')
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
    d = self.__dict__
    self._CreateBody()
    d['_splits'] = self._ComputeSplits()
    k, s = p.num_stages, max(d['_splits'])
    layer_ids = np.zeros([k, s], np.int64)
    active = np.zeros([k, s], np.float32)
    start = 0
    for stage, n in enumerate(d['_splits']):
      layer_ids[stage, :n] = np.arange(start, start + n)
      active[stage, :n] = 1.0
      start += n
    d['_layer_ids'], d['_active'] = layer_ids, active
    declared = d['_tpl']
    d['_flat_keys'] = []
    for key, wp in declared.FlattenItems():
      flat = 'w_' + key.replace('.', '__').replace('[', '_').replace(']', '')
      mapping = wp.tensor_split_dims_mapping
      if mapping is None:
        mapping = [-1] * len(wp.shape)
      stage_axis = -1 if p.stage_mesh_axis is None else p.stage_mesh_axis
      self.CreateVariable(flat, base_layer.WeightParams(
          [k, s] + list(wp.shape), init=wp.init, dtype=wp.dtype,
          tensor_split_dims_mapping=[stage_axis, -1] + list(mapping),
          trainable=wp.trainable))
      d['_flat_keys'].append((flat, key, wp))

  # ------------------------------------------------------------ structure
  def _CreateBody(self):
    """The executed body (the widest layer) and each layer's own weights.

    The body is not a child: its own variables are never created, the
    stacked ones are. It keeps a parent so its path (and hence the seeds of
    its dropout) lies under this layer.
    """
    p, d = self.params, self.__dict__
    tpls = p.body_tpl
    if not isinstance(tpls, (list, tuple)):
      tpls = [tpls] * p.num_layers
    elif len(tpls) != p.num_layers:
      raise PipelineError(f'{p.name}: body_tpl lists {len(tpls)} layers for '
                          f'num_layers {p.num_layers}')
    distinct = []  # Each distinct layer params once (a copied body: one).
    for tpl in tpls:
      if not any(tpl is t for t in distinct):
        distinct.append(tpl)
    declared = []
    for tpl in distinct:
      lp = self._ChildParams('body', tpl)
      lp.device_mesh = None  # No annotations inside vectorized_map.
      declared.append((lp, lp.Instantiate().DeclaredWeights()))
    keys = [k for k, _ in declared[0][1].FlattenItems()]
    shapes = {}
    for _, dw in declared:
      items = dw.FlattenItems()
      if [k for k, _ in items] != keys or any(
          len(wp.shape) != len(shapes.get(k, wp.shape)) for k, wp in items):
        raise PipelineError(f'{p.name}: the body_tpl layers differ in their '
                            'weights or weight ranks; a pipeline stacks one '
                            'weight structure')
      for k, wp in items:
        shapes[k] = [max(a, b) for a, b in zip(shapes.get(k, wp.shape),
                                               wp.shape)]
    widest = [lp for lp, dw in declared
              if all(list(wp.shape) == shapes[k]
                     for k, wp in dw.FlattenItems())]
    if not widest:
      raise PipelineError(f'{p.name}: no body_tpl layer has the largest '
                          'shape of every weight; list one that does')
    d['_body'] = self._Adopt(widest[0].Instantiate(), 'body')
    d['_tpl'] = self._body.DeclaredWeights()
    by_tpl = {id(t): dw for t, (_, dw) in zip(distinct, declared)}
    # Per layer: {weight key: its own WeightParams} (init, shape).
    d['_layer_wps'] = [dict(by_tpl[id(t)].FlattenItems()) for t in tpls]

  def _LayerCosts(self):
    """Per layer: matmul FLOPs per token, 2 x its weights (count_params)."""
    return [2.0 * sum(float(np.prod(wp.shape)) for wp in wps.values())
            for wps in self._layer_wps]

  def _CheckMesh(self):
    p = self.params
    if p.stage_mesh_axis is None or p.device_mesh is None:
      return
    mesh = np.asarray(p.device_mesh)
    axis = sharding.ResolveSplitDimsMapping(
        [p.stage_mesh_axis], mesh.ndim, 1, p.mesh_axis_names)[0]
    size = mesh.shape[axis]
    if p.num_stages != size:
      raise PipelineError(f'{p.name}: num_stages {p.num_stages} does not fit '
                          f'the mesh axis {p.stage_mesh_axis} of size {size}; '
                          f'set num_stages to {size}')

  def _ComputeSplits(self):
    p = self.params
    k, n = p.num_stages, p.num_layers
    if p.stage_splits is not None:
      splits = [int(x) for x in p.stage_splits]
      if len(splits) != k or sum(splits) != n or min(splits) < 1:
        raise PipelineError(f'{p.name}: stage_splits {splits} must be '
                            f'{k} counts >= 1 summing to num_layers {n}')
      return splits
    costs = p.layer_costs
    if costs is None:
      costs = self._LayerCosts()
    if len(costs) != n:
      raise PipelineError(f'{p.name}: layer_costs has {len(costs)} entries '
                          f'for num_layers {n}')
    return pipeline_partition.PartitionByCost(costs, k)

  @property
  def body(self):
    """The one body layer instance (all L positions share it)."""
    return self.__dict__['_body']

  def LayerShapes(self, key):
    """L shapes of body weight `key` (e.g. 'fc.w'): each layer's own, which
    differ from the stacked (widest) shape when body_tpl lists layers."""
    return [list(wps[key].shape) for wps in self._layer_wps]

  def StageSplits(self):
    """Layers per stage (K ints)."""
    return list(self._splits)

  def LayerThetas(self, theta):
    """L per-layer thetas (the body's structure), in stack order."""
    out = []
    for stage, n in enumerate(self._splits):
      for slot in range(n):
        out.append(theta.Transform(lambda w, a=stage, b=slot: w[a, b]))
    return out

  def _ThetaLike(self, leaf_fn):
    return self._tpl.Pack([leaf_fn(self, flat)
                           for flat, _, _ in self._flat_keys])

  def ShardTheta(self, theta):
    """Annotates the stacked weights: stage dim over stage_mesh_axis."""
    leaves = []
    for (flat, _, _), value in zip(self._flat_keys, theta.Flatten()):
      wp = self._weight_params[flat]
      leaves.append(sharding.mesh_split(value, wp.device_mesh,
                                        wp.tensor_split_dims_mapping,
                                        self.params.mesh_axis_names))
    return self._tpl.Pack(leaves)

  def _CreateOwnVariables(self):
    """Stacked variables; layer l's slice is initialised as its own layer."""
    p = self.params
    created = {}
    for flat, key, body_wp in self._flat_keys:
      wp = self._weight_params[flat]
      rows = []
      for stage in range(p.num_stages):
        for slot in range(max(self._splits)):
          if self._active[stage, slot]:
            index = self._layer_ids[stage, slot]
            own = self._layer_wps[index][key]  # Its own shape and init.
            path = f'{self.path}/layer_{index:03d}/{key}'
            seed = (base_layer.StableSeed(p.random_seed, path)
                    if own.init.seed is None else own.init.seed)
            value = base_layer._InitialValue(own, seed)  # pylint: disable=protected-access
            # A narrower layer's weight, zero-padded to the widest shape.
            rows.append(tf.pad(value, [[0, w - o] for w, o in
                                       zip(body_wp.shape, own.shape)]))
          else:
            rows.append(tf.zeros(body_wp.shape, body_wp.dtype))
      value = tf.reshape(tf.stack(rows), wp.shape)
      created[flat] = tf.Variable(value, name=f'{self.path}/{flat}',
                                  trainable=wp.trainable)
    self.__dict__['_vars'] = None
    self._vars = created

  # ------------------------------------------------------------------ fprop
  def _NumMicroBatches(self, batch):
    p = self.params
    if p.num_micro_batches is not None:
      if batch % p.num_micro_batches:
        raise PipelineError(f'{p.name}: num_micro_batches '
                            f'{p.num_micro_batches} does not divide the batch '
                            f'{batch}; use a divisor of {batch}')
      return p.num_micro_batches
    if batch % p.micro_batch_size:
      raise PipelineError(f'{p.name}: micro_batch_size {p.micro_batch_size} '
                          f'does not divide the batch {batch}; use a divisor '
                          f'of {batch}')
    return batch // p.micro_batch_size

  def FPropUnpipelined(self, theta, inputs, paddings, *extras, step=None,
                       example_offset=0):
    """The L layers one after another on the whole batch: (y, aux).

    Dropout is keyed like the pipeline's, rows numbered from example_offset;
    aux is combined as in FProp with one micro-batch.
    """
    x, auxes = inputs, []
    for index, layer_theta in enumerate(self.LayerThetas(theta)):
      with dropout.KeyedMasks(index, example_offset):
        x, aux = self.body.FProp(layer_theta, x, paddings, *extras, step=step)
      auxes.append(aux)
    return x, _CombineAux([[a] for a in auxes])

  def FProp(self, theta, inputs, paddings, *extras, step=None):
    """inputs [B, ...], paddings [B, ...], extras [B, ...] -> (y, aux).

    See the module docstring for the schedule and how aux is combined.
    """
    p = self.params
    if p.is_inference:
      return self.FPropUnpipelined(theta, inputs, paddings, *extras,
                                   step=step)
    inputs, paddings = (tf.convert_to_tensor(inputs),
                        tf.convert_to_tensor(paddings))
    extras = [tf.convert_to_tensor(e) for e in extras]
    batch = inputs.shape[0]
    if batch is None:
      raise PipelineError(f'{p.name}: the batch dim of the inputs must be '
                          'static')
    m = self._NumMicroBatches(int(batch))
    b = int(batch) // m
    k = p.num_stages
    theta = self.ShardTheta(theta.Transform(_DenseGradient))
    # Per-example tensors as M micro-batches [b, ...]: rows i::M (module
    # docstring). Unstack, not slices: see OneStage in _RunStages.
    streams = [inputs, paddings] + list(extras)
    micro = [tf.unstack(_SwapFirstTwo(self._ShardBatch(
        tf.reshape(t, [b, m] + t.shape.as_list()[1:]))), num=m)
             for t in streams]

    def Entering(i):
      """The tensors entering stage 0 in iteration i (zeros after M)."""
      if i < m:
        return [t[i] for t in micro]
      return [tf.zeros_like(t[0]) for t in micro]

    state = [self._Shift(e, tf.zeros([k] + e.shape.as_list(), e.dtype))
             for e in Entering(0)]
    outputs, aux_rows = [], []
    last_mask = np.zeros([k] + [1] * (inputs.shape.rank), np.float32)
    last_mask[-1] = 1.0
    last_mask = tf.constant(last_mask, inputs.dtype)
    token = tf.zeros([], inputs.dtype)
    for i in range(m + k - 1):
      valid = np.array([0 <= i - st < m for st in range(k)], np.float32)
      offsets = np.array([max(i - st, 0) for st in range(k)], np.int64)
      out, aux_list = self._RunStages(theta, state, offsets, m, step, token)
      # A zero that depends on this iteration's output (see _RunStages).
      token = _OpaqueZero(out)
      if i >= k - 1:
        # A masked sum over K, not a slice: XLA SPMD makes it an all-reduce
        # (a slice of the split dim and its gradient become all-to-alls).
        outputs.append(tf.reduce_sum(out * last_mask, 0))
      weights = valid[:, np.newaxis] * self._active  # [K, S]
      aux_rows.append((aux_list, weights))
      if i + 1 < m + k - 1:
        nxt = Entering(i + 1)
        state = [self._Shift(e, t) for e, t in zip(nxt, [out] + state[1:])]
    y_bm = self._ShardBatch(_SwapFirstTwo(tf.stack(outputs)))
    return tf.reshape(y_bm, tf.shape(inputs)), self._CombineStageAux(aux_rows)

  def _Shift(self, entering, t):
    """[entering, t[0], ..., t[K-2]]: stage k+1 gets stage k's tensor.

    A pad-and-slice along K (XLA SPMD: a collective-permute when K is split)
    and a select of stage 0 (the entering micro-batch).
    """
    k, rank = self.params.num_stages, t.shape.rank
    shifted = tf.pad(t, [[1, 0]] + [[0, 0]] * (rank - 1))[:k]
    first = np.zeros([k] + [1] * (rank - 1), bool)
    first[0] = True
    out = tf.where(tf.constant(first),
                   tf.broadcast_to(entering[tf.newaxis], tf.shape(t)),
                   shifted)
    return self._ShardState(out)

  def _Annotate(self, t, leading):
    """t split on its leading dims as `leading` (mesh axes or None)."""
    p = self.params
    leading = [-1 if a is None else a for a in leading][:t.shape.rank]
    if p.device_mesh is None or all(a == -1 for a in leading):
      return t
    return sharding.mesh_split(t, p.device_mesh,
                               leading + [-1] * (t.shape.rank - len(leading)),
                               p.mesh_axis_names)

  def _ShardState(self, t):
    """[K, b, ...]: K over the stage axis, b over the batch axis."""
    p = self.params
    return self._Annotate(t, [p.stage_mesh_axis, p.batch_mesh_axis])

  def _ShardBatch(self, t):
    """[b, M, ...]: b over the batch axis."""
    return self._Annotate(t, [self.params.batch_mesh_axis])

  def _RunStages(self, theta, state, offsets, m, step, token):
    """Every stage's S slots on its state, vectorised over K.

    `token` is a zero scalar computed from the previous iteration's output.
    With remat its gradient is made from this iteration's recomputed
    gradients, so backprop runs the iterations one after another: each
    recomputation starts only once the later iteration's is done, and at
    most one iteration's activations are alive (with K = 1 nothing else
    orders them: every micro-batch's cotangent is ready at once).

    offsets: [K] micro-batch index per stage (row r of micro-batch i is
    example i + r * m: dropout keys).

    Returns (outputs [K, b, ...], per slot the aux NestedMap, leaves [K, ...]).
    """
    s, k = max(self._splits), self.params.num_stages
    body = self.body
    consts = [tf.constant(self._layer_ids), tf.constant(self._active),
              tf.constant(offsets)]
    aux_tpls = [None] * s
    theta_leaves = theta.Flatten()
    num_theta = len(theta_leaves)

    def OneStage(elems):
      """One stage: elems = (theta leaves [S, ...], x, pads, *extras, ids,
      active, offset) -> [y] + aux leaves."""
      leaves, (x, pads, *extras) = elems[:num_theta], elems[num_theta:-3]
      ids_s, active_s, offset = elems[-3:]
      # Unstack, not slice: the gradient of a slice (StridedSliceGrad) inside
      # vectorized_map needs XLA compile-time constants.
      slots = [tf.unstack(w, num=s) for w in leaves]
      flat_aux = []
      for slot in range(s):
        slot_theta = self._tpl.Pack([w[slot] for w in slots])
        with dropout.KeyedMasks(ids_s[slot], offset, m):
          y, aux = body.FProp(slot_theta, x, pads, *extras, step=step)
        on = tf.cast(active_s[slot], y.dtype)
        x = y * on + x * (1 - on)
        aux = NestedMap(aux) if aux else NestedMap()
        aux_tpls[slot] = aux
        flat_aux += aux.Flatten()
      return [x] + flat_aux

    def OverStages(fn, elems):
      """fn on every stage: vectorised over K (K = 1: one direct call)."""
      if k == 1:
        return [t[tf.newaxis] for t in fn([t[0] for t in elems])]
      return tf.vectorized_map(fn, list(elems))

    def StagesVjp(elems, dys):
      """Per stage: recompute the forward and pull the cotangents back."""

      def One(both):
        ins, outs_dy = both[:len(elems)], both[len(elems):]
        floats = [i for i, t in enumerate(ins) if t.dtype.is_floating]
        with tf.GradientTape() as tape:
          tape.watch([ins[i] for i in floats])
          outs = OneStage(ins)
        grads = tape.gradient(outs, [ins[i] for i in floats],
                              output_gradients=list(outs_dy),
                              unconnected_gradients='zero')
        out = [tf.zeros([], tf.float32)] * len(ins)
        for i, g in zip(floats, grads):
          out[i] = g
        return out

      got = OverStages(One, list(elems) + list(dys))
      floats = [t.dtype.is_floating for t in elems]
      return [g if f else None for g, f in zip(got, floats)]

    elems = theta_leaves + state
    if self.params.remat:
      # GPipe §2.3: only the stage inputs are kept; backprop recomputes each
      # stage's forward and differentiates it per stage (vectorised too).

      @tf.custom_gradient
      def Stages(*args_and_token):
        args, token_in = list(args_and_token[:-1]), args_and_token[-1]
        outs = OverStages(OneStage, args + consts)

        def Grad(*dys):
          dys = [tf.zeros_like(o) if d is None else d
                 for o, d in zip(outs, dys)] + [token_in]
          # The barrier ties the recomputation's inputs to the incoming
          # cotangents: XLA can neither merge it into the forward pass nor
          # schedule it before this iteration's backward pass is due (which
          # would keep every iteration's activations alive again).
          both = _OptimizationBarrier(args + consts + dys)
          n = len(args) + len(consts)
          ins, dys = both[:n], both[n:-1]
          # XLA:CPU drops optimization barriers before CSE; a zero that
          # depends on the cotangent keeps the recomputation distinct from
          # the forward pass (not merged into it) and after it.
          x = ins[num_theta]
          ins[num_theta] = x + tf.cast(_OpaqueZero(dys[0]), x.dtype)
          grads = StagesVjp(ins, dys)[:len(args)]
          d_token = _OpaqueZero(grads[0])  # Orders the iterations.
          return grads + [tf.cast(d_token, token_in.dtype)]

        return outs, Grad

      results = Stages(*elems, token)
    else:
      # No remat: TF differentiates a loop over the K stages (activations
      # are kept). Not vectorised: TF's gradient of pfor ops can need XLA
      # compile-time constants (e.g. for reduce_mean), which would turn the
      # program's arguments into constants.
      per_stage = [tf.unstack(t, num=k) for t in elems + consts]
      outs = [OneStage([t[i] for t in per_stage]) for i in range(k)]
      results = [tf.stack(list(ts)) for ts in zip(*outs)]
    out, results = self._ShardState(results[0]), list(results[1:])
    aux_list = []
    for slot in range(s):
      n = len(aux_tpls[slot].Flatten())
      aux_list.append(aux_tpls[slot].Pack(results[:n]))
      results = results[n:]
    return out, aux_list

  def _CombineStageAux(self, aux_rows):
    """Per-layer aux lists (over micro-batches) from the iterations' aux."""
    per_layer = [[] for _ in range(self.params.num_layers)]
    for aux_list, weights in aux_rows:
      for stage in range(self.params.num_stages):
        for slot, aux in enumerate(aux_list):
          if weights[stage, slot]:
            per_layer[self._layer_ids[stage, slot]].append(
                aux.Transform(lambda t, a=stage: t[a]))
    return _CombineAux(per_layer)  # Each layer saw each micro-batch once.


def _SwapFirstTwo(t):
  """[a, b, ...] -> [b, a, ...]."""
  return tf.transpose(t, [1, 0] + list(range(2, t.shape.rank)))


def _OpaqueZero(t):
  """A float32 zero computed from `t` that XLA cannot fold to a constant
  (min(|sum t|, 0); x * 0 could be simplified away): a data dependency."""
  return tf.minimum(tf.abs(tf.reduce_sum(tf.cast(t, tf.float32))), 0.0)


def _OptimizationBarrier(tensors):
  """XLA optimization barrier: the recomputation is not merged into the
  forward pass (which would keep its activations)."""
  return list(xla.optimization_barrier(*tensors))


@tf.custom_gradient
def _DenseGradient(w):
  """Identity whose gradient is a dense tensor (not IndexedSlices)."""
  return tf.identity(w), tf.convert_to_tensor


def _IsMoments(node):
  return isinstance(node, dict) and set(node) == {'count', 'mean', 'm2'}


def _CombineMomentsTree(nodes):
  if _IsMoments(nodes[0]):
    out = nodes[0]
    for other in nodes[1:]:
      out = batch_norm.CombineMoments(out, other)
    return NestedMap(out)
  return NestedMap({key: _CombineMomentsTree([n[key] for n in nodes])
                    for key in nodes[0]})


def _CombineAux(per_layer):
  """per_layer: L lists (one aux per micro-batch) -> the stack's aux.

  aux_loss: sum over layers of the mean over micro-batches; metrics: mean
  over layers and micro-batches; moments: L combined moments.
  """
  first = per_layer[0][0]
  out = NestedMap()
  if not first:
    return out
  unknown = sorted(set(first) - {'aux_loss', 'metrics', 'moments'})
  if unknown:
    raise PipelineError(f'the body returned aux keys {unknown}; a pipeline '
                        'combines only aux_loss, metrics and moments')
  if 'aux_loss' in first:
    out.aux_loss = tf.add_n([tf.add_n([a.aux_loss for a in auxes]) /
                             float(len(auxes)) for auxes in per_layer])
  if 'metrics' in first:
    items = [a.metrics for auxes in per_layer for a in auxes]
    out.metrics = items[0].Pack([
        tf.add_n(list(vals)) / float(len(items))
        for vals in zip(*[x.Flatten() for x in items])])
  if 'moments' in first:
    out.moments = [_CombineMomentsTree([a.moments for a in auxes])
                   for auxes in per_layer]
  return out
