"""`MoEBase`: the shared base of the Mixture-of-Experts FFN layers.

Every MoE-family layer (GShard's top-2 `MoELayer` in top2.py: Lepikhin et
al. 2020, §2.2, Algorithm 1 gating, Algorithm 2 dispatch; noisy top-k,
hierarchical, strictly balanced, expert choice) subclasses `MoEBase` (no
residual or layer norm: the Transformer layer adds those) and keeps the
FFN contract of ffn.py (the dense FFN's too):

    outputs, aux = layer.FProp(theta, inputs, paddings, step=None,
                               token_offset=0)

- inputs [B, T, M] (any float dtype; computed in fprop_dtype), paddings
  [B, T] float (1.0 = pad). Returns outputs [B, T, M] (padding rows are 0)
  and aux = NestedMap(aux_loss=float32 scalar, aux_groups=the groups with
  real tokens (what top-2's loss averages over; pipeline_aux weights
  micro-batches by it), metrics=NestedMap of float32 scalars/vectors; see
  metrics.py). aux_loss is already weighted by the
  layer's own `aux_loss_weights` (top2: group_aux; noisy/hierarchical:
  importance, load; balanced: batchwise, importance): the task adds
  it to its loss as is.
- A gate (`Route`) returns (routing.Routing, aux_loss, routing.GateStats):
  the aux loss is the sum of the gate's balancing-loss terms, each times
  its weight in `p.aux_loss_weights` (the one place a term's weight lives:
  one documented field per term, defined by the gate class; 0 drops the
  term); GateStats' optional `importance_e` / `load_e` [E] feed
  metrics.RoutingMetrics, its `metrics` become metrics as named.
- The B*T tokens, row-major, are cut into G groups of S tokens (`num_groups`
  or `group_size`); capacity is per (expert, group).
- `step` (None = 0) and `token_offset` (global index of the first token of
  this batch, or an int [B] vector of each row's first token: a pipeline's
  micro-batch) key the counter-based routing RNG, with the layer index of
  an enclosing `dropout.KeyedMasks` (a pipeline body's stack position), so
  random routing decisions do not depend on grouping, sharding or
  micro-batching (layers/rng.py).
- Inside `record.RoutingRecorder()` (off by default; analysis tools such
  as lingshard/tools/expert_usage.py) FProp also appends its routing,
  mapped back to [B, T] tokens, to the recorder (layers/moe/record.py).

Expert weights wi [E, M, H], wo [E, H, M], optional biases bi [E, H],
bo [E, M]; activation (relu default) and dropout on the hidden activations.
Optional shared experts (`num_shared_experts`, DeepSeekMoE; shared.py) take
every real token and add to the routed output.
Sharding (GShard §3.2, set all at once with `SetExpertSharding`): inputs split
on G, gating weights replicated, dispatched `[E, G, C, M]` and expert weights
split on E over the same mesh axis. `dispatch_impl` = 'einsum' (Algorithm 2)
or 'gather' (index-based; under a mesh it runs per group under manual
partitioning, which needs XLA); both give the same outputs and gradients.
'sorted' (dispatch_sorted.py) computes only the dispatched choices, sorted
by expert, as grouped matmuls over blocks (no buffer padded to C): same
outputs and gradients, a single-device / data-parallel path. Inference
(`ForInference`: eval, decode, export) is dropless by default
(`eval_capacity_factor` None, one-token groups) with
`inference_dispatch_impl` ('sorted'); setting `eval_capacity_factor`
(e.g. 2.0) and `inference_dispatch_impl='einsum'` restores the padded one.
'auto' (the default) is resolved per platform by `AutoDispatchImpl`, in
one place, the class hook `MoEBase.ForPlatform`: whoever builds params
for a platform applies it with `base_layer.ResolveParams(params,
platform=...)` (the trainer, so `--mode=print_params` shows the choice;
spmd_check with 'tpu'); a layer built directly applies it for this host
(lingshard.platform).
"""

import numpy as np
import tensorflow as tf

from lingshard import hyperparams
from lingshard import sharding
from lingshard import platform as platform_lib
from lingshard.layers import base_layer
from lingshard.layers import dropout
from lingshard.layers import linear
from lingshard.layers.moe import bias_balance
from lingshard.layers.moe import causality
from lingshard.layers.moe import dispatch as moe_dispatch
from lingshard.layers.moe import dispatch_sorted
from lingshard.layers.moe import routing
from lingshard.layers.moe import metrics as routing_metrics
from lingshard.layers.moe import record as routing_record
from lingshard.layers import rng as routing_rng
from lingshard.layers.moe import shared as moe_shared
from lingshard.layers.moe import training_hooks
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit

DISPATCH_IMPLS = ('auto', 'einsum', 'gather', 'sorted')


def AutoDispatchImpl(platform):
  """The dispatch 'auto' means on `platform` ('cpu' | 'gpu' | 'tpu').

  CPU / GPU: 'gather', measured (scripts/bench_moe.py, bench_step.py): its
  cost is O(k·cf·G·S·M) moves where Algorithm 2's one-hot einsums cost
  O(G·S·E·C·M) FLOPs. TPU: 'einsum', GShard's Algorithm 2, written for the
  TPU (dispatch and combine are MXU matmuls; XLA:TPU serialises dynamic
  gathers and scatters); both pass the SPMD checker.
  """
  if platform not in platform_lib.PLATFORMS:
    raise ValueError(f'platform must be one of {platform_lib.PLATFORMS}, '
                     f'got {platform!r}')
  return 'einsum' if platform == 'tpu' else 'gather'


def ExpertsSplit(p):
  """True if MoE params `p` split the expert dim of `wi` over a mesh axis
  of more than one device (an inherited mesh counts as more than one)."""
  wmap = p.weight_split_dims_mapping
  mapping = wmap.Get('wi') if 'wi' in wmap else None
  if not mapping or mapping[0] in (None, -1):
    return False
  if p.device_mesh is None:
    return True
  return sharding.AxisSize(p.device_mesh, mapping[0], p.mesh_axis_names) > 1


class MoEBase(base_layer.BaseLayer):
  """Grouping, expert FFN, dispatch/combine and the FProp contract.

  Subclasses implement `Route(theta, x_gsm, nonpad_gs, token_gs, step,
  capacity) -> (routing.Routing, aux_loss, stats)`, `CapacityTopK(p)` and,
  unless they route by token choice, `RoutingLeaks(p)`; see
  `MoELayer`. REPLICATED_WEIGHTS: {gating weight name: rank}.
  """

  REPLICATED_WEIGHTS = {}
  SELECTION_BIAS = False  # Route() applies SelectionBias(theta).
  # Weights whose dim 0 is the expert (E): split over the expert mesh axis,
  # and what sparse upcycling fills from a dense FFN (train/init_rules.py).
  EXPERT_WEIGHTS = ('wi', 'wo', 'bi', 'bo')

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Model dim M.')
    p.Define('hidden_dim', 0, 'Expert hidden dim H.')
    p.Define('num_experts', 0, 'Number of experts E.')
    p.Define('num_groups', None, 'Token groups G (B*T must divide by G); '
             'set this or group_size.')
    p.Define('group_size', None, 'Tokens per group S (alternative to '
             'num_groups).')
    p.Define('capacity_factor', 1.0, 'Training capacity factor cf: C = '
             'ceil(cf * k * S / E); None = dropless (C = S).')
    p.Define('eval_capacity_factor', None, 'Capacity factor at inference '
             '(GShard gives no value); None = dropless (the default: a '
             'token\'s output then does not depend on its batch '
             'neighbours); 2.0 was the default before dropless inference.')
    p.Define('expert_capacity', None, 'Explicit C; overrides both factors.')
    p.Define('dispatch_impl', 'auto', 'auto (per platform: '
             'AutoDispatchImpl) | einsum (GShard Algorithm 2) | gather '
             '(index-based, same numerics, no [G, S, E, C] one-hot '
             'tensors) | sorted (dispatch_sorted.py: only dispatched '
             'choices, sorted by expert, grouped matmuls over blocks; no '
             '[E, G, C, M] buffer; dropless at k/E of the padded cost; '
             'single-device / data-parallel; at inference the blocks run '
             'in a while loop, in training all at once).')
    p.Define('inference_dispatch_impl', 'sorted', 'The dispatch_impl '
             'ForInference (eval, decode, export) sets: sorted (dropless '
             'without padding) | einsum (Algorithm 2, any mesh: for expert-'
             'sharded inference) | gather | auto. Same outputs. For the TPU '
             '(ForPlatform) sorted with experts split over a mesh becomes '
             'einsum: partitioned, sorted all-reduces each block\'s expert '
             'weights instead of moving tokens (spmd_check --mode=decode).')
    p.Define('sorted_block_size', None, 'Rows per block B of the sorted '
             'dispatch; None = dispatch_sorted.AutoBlockSize (padding '
             'E*(B-1) rows <= a quarter of the G*S*k assignments).')
    p.Define('expert_dtype', None, 'Dtype of the expert FFNs\' matmuls '
             '(weights cast per use, inputs, hidden, outputs; e.g. '
             'tf.bfloat16): halves the bytes of the expert weights and of '
             'their gradients, which bound large-E layers; the float32 '
             'weights stay the optimizer\'s master copy. None = fprop dtype.')
    p.Define('activation', 'relu', 'Expert hidden activation.')
    p.Define('use_bias', False, 'Expert biases bi [E, H], bo [E, M].')
    p.Define('dropout_rate', 0.0, 'Dropout on expert hidden activations '
             '(training only).')
    p.Define('output_activation', 'none', 'Applied to the combined output '
             "(Shazeer et al. App. C uses 'sigmoid').")
    p.Define('num_shared_experts', 0, 'N shared experts (DeepSeekMoE '
             '§3.2, shared.py): FFNs every real token goes through, '
             'ungated; their sum adds to the routed output before '
             'output_activation. 0 = none (the seed papers).')
    p.Define('shared_hidden_dim', None, 'Hidden dim Hs of each shared '
             'expert; None = hidden_dim.')
    p.Define('num_position_buckets', 4, 'Buckets of the position-in-group '
             'drop metric.')
    p.Define('num_experts_per_token', None, 'k: experts each token is '
             'routed to, for top-k gates (noisy top-k, strictly balanced: '
             'default 2; validated 1 <= k <= E by CheckExpertsPerToken); '
             'None for gates whose k is fixed (GShard top-2: 2; '
             'hierarchical: k_primary x k_secondary).')
    p.Define('aux_loss_weights', hyperparams.Params(), 'The weight of each '
             'balancing-loss term of the gate: one documented field per '
             'term, defined by the gate class (e.g. group_aux, importance, '
             'load, batchwise); aux_loss = sum of weight x term, 0 drops a '
             'term.')
    p.aux_loss_weights.Define('router_z', 0.0, 'Weight of the router '
                              'z-loss (ST-MoE eq. 5, every gate: '
                              'routing.RouterZLoss; 1e-3 in ST-MoE; 0 = '
                              'off, the seed papers have none). Its value '
                              'is the metric router_z_loss.')
    p.Define('selection_bias_rate', 0.0, 'gamma of auxiliary-loss-free '
             'balancing (DeepSeek-V3 §2.1.2, moe/bias_balance.py): a '
             'per-expert bias [E] added to the scores for the top-k '
             'selection only, moved by gamma * sign(mean load - load) after '
             'every step (DeepSeek-V3: 0.001). 0 = off (no variable). Gates '
             'with SELECTION_BIAS (GShard top-2, noisy top-k).')
    p.weight_split_dims_mapping.Define('selection_bias', None, 'Mapping of '
                                       'selection_bias [E] (replicated).')
    for name, doc in (('wi', 'wi [E, M, H]'), ('wo', 'wo [E, H, M]'),
                      ('bi', 'bi [E, H]'), ('bo', 'bo [E, M]'),
                      ('shared_wi', 'shared_wi [N, M, Hs]'),
                      ('shared_wo', 'shared_wo [N, Hs, M]'),
                      ('shared_bi', 'shared_bi [N, Hs]'),
                      ('shared_bo', 'shared_bo [N, M]')):
      p.weight_split_dims_mapping.Define(name, None, f'Mapping of {doc}.')
    for name, doc in (('gsm', 'inputs/outputs [G, S, M]'),
                      ('gsec', 'combine/dispatch [G, S, E, C] (einsum)'),
                      ('egcm', 'dispatched inputs/outputs [E, G, C, M]'),
                      ('egch', 'expert hidden [E, G, C, H]'),
                      ('gsnh', 'shared-expert hidden [G, S, N, Hs]'),
                      ('gecm', 'expert outputs [G, E, C, M] (einsum)'),
                      ('gecm_experts', 'expert outputs [G, E, C, M] as the '
                       'experts compute them (E split), before the '
                       'all-to-all to gecm (einsum; a data x expert mesh)')):
      p.activation_split_dims_mapping.Define(name, None, f'Mapping of {doc}.')
    return p

  @classmethod
  def SetExpertSharding(cls, p, device_mesh, mesh_axis=0,
                        mesh_axis_names=None, data_mesh_axis=None):
    """Fills every split mapping for one expert mesh axis (GShard §3.2).

    Groups (and token tensors) split on G, dispatched/expert tensors and
    expert weights split on E, gating weights replicated. On a mesh with
    a data axis too (`data_mesh_axis`, e.g. data x expert x stage), groups
    split over both (data major: the batch is split over data) and the
    dispatched tensors keep G over data: the dispatch's all-to-all runs
    within each data shard's expert axis. Shared experts compute on every
    token like a dense FFN: weights replicated, hidden split like groups.
    """
    p.device_mesh = np.asarray(device_mesh)
    if mesh_axis_names is not None:
      p.mesh_axis_names = list(mesh_axis_names)
    a, r = mesh_axis, -1
    g = r if data_mesh_axis is None else data_mesh_axis
    groups = a if data_mesh_axis is None else (data_mesh_axis, mesh_axis)
    wmap = p.weight_split_dims_mapping
    for name in ('wi', 'wo'):
      wmap.Set(**{name: [a, r, r]})
    for name in ('bi', 'bo'):
      wmap.Set(**{name: [a, r]})
    for name, rank in {**cls.REPLICATED_WEIGHTS, **moe_shared.WEIGHT_RANKS,
                       bias_balance.WEIGHT: 1}.items():
      wmap.Set(**{name: [r] * rank})
    amap = p.activation_split_dims_mapping
    amap.gsm = [groups, r, r]
    amap.gsnh = [groups, r, r, r]
    for name in ('gsec', 'gecm'):
      amap.Set(**{name: [groups, r, r, r]})
    for name in ('egcm', 'egch'):
      amap.Set(**{name: [a, g, r, r]})
    if data_mesh_axis is not None:
      # Else XLA gathers wo over the expert axis rather than move outputs.
      amap.gecm_experts = [g, a, r, r]
    return p

  @classmethod
  def ForPlatform(cls, p, platform):
    """'auto' dispatch -> AutoDispatchImpl(platform): the one place it is
    resolved (the trainer, spmd_check and a layer built directly all come
    here through base_layer.ResolveParams / __init__)."""
    keys = []
    if p.dispatch_impl == 'auto':
      p.dispatch_impl = AutoDispatchImpl(platform)
      keys.append('dispatch_impl')
    if (platform == 'tpu' and p.inference_dispatch_impl == 'sorted' and
        ExpertsSplit(p)):
      # Partitioned, sorted's per-block gather of one expert's weights
      # becomes an all-reduce of those weights per block and every token
      # row is replicated (spmd_check --mode=decode measured it): no
      # expert parallelism. Algorithm 2's all-to-all instead.
      p.inference_dispatch_impl = 'einsum'
      keys.append('inference_dispatch_impl')
    return keys

  # BaseLayer's training hooks (moe/training_hooks.py).
  @classmethod
  def ForPipeline(cls, p, owner):
    return training_hooks.ForPipeline(p, owner)

  @classmethod
  def CombineMetricParts(cls, parts):
    return routing_metrics.CombineParts(parts)  # Counts sum; CVs recomputed.

  def ExpertWeights(self):
    return {name: int(self.params.num_experts) for name in self.EXPERT_WEIGHTS
            if name in self.weight_params}

  def CheckMeshFit(self, axis_size):
    training_hooks.CheckMesh(self, axis_size)

  def CheckTokensFit(self, tokens, where):
    training_hooks.CheckTokens(self, tokens, where)

  @classmethod
  def ForInference(cls, p):
    """Decoding routes each token alone (GShard App. A.1 decodes on the
    training cluster): groups of one token (`group_size=1`), so each of a
    token's k choices, all different experts, has a slot of its own
    (C >= 1 = S) and no token is dropped. A token is then routed as in
    the full forward pass whatever its batch, beam layout or step. The
    dispatch is `inference_dispatch_impl`: 'sorted' (default) computes
    only the k choices of each token; 'einsum' (Algorithm 2, any number of
    groups on any mesh) pads every expert: E * tokens rows."""
    p.Set(num_groups=None, group_size=1, expert_capacity=None,
          dispatch_impl=p.inference_dispatch_impl)
    return ['num_groups', 'group_size', 'expert_capacity', 'dispatch_impl']

  def CheckExpertsPerToken(self):
    """For top-k layers: `num_experts_per_token` must be in [1, E]."""
    p = self.params
    if not 1 <= p.num_experts_per_token <= p.num_experts:
      raise ValueError(f'{p.name}: num_experts_per_token must be in [1, '
                       f'{p.num_experts}], got {p.num_experts_per_token}')

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'hidden_dim', 'num_experts')
    if (p.num_groups is None) == (p.group_size is None):
      raise ValueError(f'{p.name}: set exactly one of num_groups and '
                       f'group_size, got {p.num_groups}, {p.group_size}')
    self.CheckOneOf('dispatch_impl', DISPATCH_IMPLS)
    self.CheckOneOf('inference_dispatch_impl', DISPATCH_IMPLS)
    if p.sorted_block_size is not None and p.sorted_block_size < 1:
      raise ValueError(f'{p.name}: sorted_block_size must be None or >= 1, '
                       f'got {p.sorted_block_size}')
    # Built directly (params not resolved by ResolveParams): this host's.
    resolved = p.Copy()
    type(self).ForPlatform(resolved, platform_lib.Platform())
    self.dispatch_impl = resolved.dispatch_impl
    if not 0.0 <= p.dropout_rate < 1.0:
      raise ValueError(f'{p.name}: dropout_rate must be in [0, 1)')
    self._act = linear.Activation(p.activation)
    self._out_act = linear.Activation(p.output_activation)
    e, m, h = p.num_experts, p.input_dim, p.hidden_dim
    self.CreateVariable('wi', base_layer.WeightParams([e, m, h]))
    self.CreateVariable('wo', base_layer.WeightParams([e, h, m]))
    if p.use_bias:
      zero = WeightInit.Constant(0.0)
      self.CreateVariable('bi', base_layer.WeightParams([e, h], init=zero))
      self.CreateVariable('bo', base_layer.WeightParams([e, m], init=zero))
    moe_shared.CreateWeights(self)
    if p.selection_bias_rate:
      self.CreateVariable(bias_balance.WEIGHT,
                          bias_balance.BiasWeightParams(p, type(self)))

  def SelectionBias(self, theta):
    """The [E] bias a gate adds to its scores to select (no gradient), or
    None when off."""
    if not self.params.selection_bias_rate:
      return None
    return tf.stop_gradient(tf.cast(theta.selection_bias, tf.float32))

  # ------------------------------------------------------------- grouping
  def GroupShape(self, num_tokens):
    """(G, S) for `num_tokens` = B*T; ValueError if they do not divide."""
    p = self.params
    if p.num_groups is not None:
      if p.num_groups <= 0 or num_tokens % p.num_groups:
        raise ValueError(f'{p.name}: B*T = {num_tokens} tokens cannot be '
                         f'split into num_groups = {p.num_groups} equal '
                         'groups')
      return p.num_groups, num_tokens // p.num_groups
    if p.group_size <= 0 or num_tokens % p.group_size:
      raise ValueError(f'{p.name}: B*T = {num_tokens} tokens cannot be '
                       f'split into groups of group_size = {p.group_size}')
    return num_tokens // p.group_size, p.group_size

  @classmethod
  def CapacityTopK(cls, p):
    """k of C = ceil(cf * k * S / E) for params `p`: expert choices per
    token (top-2: 2; noisy / balanced: num_experts_per_token)."""
    raise NotImplementedError(f'{cls.__name__}.CapacityTopK')

  def _TopK(self):
    return type(self).CapacityTopK(self.params)

  @classmethod
  def RoutingLeaks(cls, p):
    """None if training-mode routing under params `p` is causal (a token's
    experts never depend on later tokens or other sequences), else a
    one-line reason (layers/moe/causality.py). Default: a token-choice
    gate, which leaks iff its capacity can drop tokens; groups of one
    token never leak."""
    if p.group_size == 1:
      return None
    return causality.TokenChoiceLeak(p, cls.CapacityTopK(p))

  def Capacity(self, group_size):
    """C for the current mode (training / inference).

    A factor of None (and no expert_capacity) means dropless: C = S, room
    for every token in every expert (Shazeer et al. never drop).
    """
    p = self.params
    cf = p.eval_capacity_factor if p.is_inference else p.capacity_factor
    if cf is None and p.expert_capacity is None:
      return group_size
    return routing.ExpertCapacity(group_size, p.num_experts, cf,
                                 p.expert_capacity, self._TopK())

  # --------------------------------------------------------------- experts
  def ActivateHidden(self, h, step, stream=0):
    """The experts' activation, then dropout (training only; `stream` 0 =
    routed experts, 1 = shared experts: independent masks)."""
    p = self.params
    h = self._act(h)
    if p.dropout_rate > 0.0 and not p.is_inference:
      seed = tf.stack([tf.constant(self.layer_seed, tf.int64),
                       tf.cast(0 if step is None else step, tf.int64)])
      if stream:
        seed = tf.random.experimental.stateless_fold_in(seed, stream)
      keep = tf.random.stateless_uniform(tf.shape(h), seed) >= p.dropout_rate
      h = tf.where(keep, h / (1.0 - p.dropout_rate), tf.zeros_like(h))
    return h

  def ExpertFn(self, theta, step):
    """`(x_egcm, out_layout) -> y`: the E expert FFNs on their buffers.

    einsums `EGCM,EMH->EGCH`, activation, dropout, then `EGCH,EHM->GECM`
    (out_layout 'gecm', Algorithm 2) or a batched matmul to EGCM.
    """
    p = self.params
    dtype = tf.as_dtype(p.expert_dtype or self.fprop_dtype)
    wi = tf.cast(theta.wi, dtype)
    wo = tf.cast(theta.wo, dtype)

    def Hidden(h):
      if p.use_bias:
        h += tf.cast(theta.bi, dtype)[:, tf.newaxis, tf.newaxis, :]
      return self.ShardActivation(self.ActivateHidden(h, step), 'egch')

    def Fn(x_egcm, out_layout):
      # The caller's dtype in and out; the experts compute in `dtype`.
      in_dtype = x_egcm.dtype
      return tf.cast(Experts(tf.cast(x_egcm, dtype), out_layout), in_dtype)

    def Experts(x_egcm, out_layout):
      e, g, c, m = x_egcm.shape
      if out_layout == 'gecm':
        h = Hidden(tf.einsum('egcm,emh->egch', x_egcm, wi))
        y = self.ShardActivation(tf.einsum('egch,ehm->gecm', h, wo),
                                 'gecm_experts')
        if p.use_bias:
          y += tf.cast(theta.bo, dtype)[tf.newaxis, :, tf.newaxis, :]
        return y
      # Batched matmul over experts: [E, G*C, M] @ [E, M, H].
      h = tf.matmul(tf.reshape(x_egcm, [e, -1, m]), wi)
      h = Hidden(tf.reshape(h, [e, g, c, p.hidden_dim]))
      y = tf.matmul(tf.reshape(h, [e, -1, p.hidden_dim]), wo)
      if p.use_bias:
        y += tf.cast(theta.bo, dtype)[:, tf.newaxis, :]
      return tf.reshape(y, [e, g, c, m])

    return Fn

  def BlockExpertFn(self, theta, step):
    """`(x_nbm, expert_n) -> y_nbm`: the expert FFN per block of rows of
    one expert (dispatch_sorted.py): that expert's weights gathered per
    block, einsums `NBM,NMH->NBH`, activation, dropout, `NBH,NHM->NBM`."""
    p = self.params
    dtype = tf.as_dtype(p.expert_dtype or self.fprop_dtype)

    def Fn(x_nbm, expert_n):
      in_dtype = x_nbm.dtype
      x = tf.cast(x_nbm, dtype)
      wi = tf.gather(tf.cast(theta.wi, dtype), expert_n)
      wo = tf.gather(tf.cast(theta.wo, dtype), expert_n)
      h = tf.einsum('nbm,nmh->nbh', x, wi)
      if p.use_bias:
        h += tf.gather(tf.cast(theta.bi, dtype), expert_n)[:, tf.newaxis]
      h = self.ActivateHidden(h, step)
      y = tf.einsum('nbh,nhm->nbm', h, wo)
      if p.use_bias:
        y += tf.gather(tf.cast(theta.bo, dtype), expert_n)[:, tf.newaxis]
      return tf.cast(y, in_dtype)

    return Fn

  def ManualSpec(self, num_groups):
    """Manual-partitioning spec of the gather dispatch, or None."""
    p = self.params
    mapping = p.activation_split_dims_mapping.gsm
    if p.device_mesh is None or mapping is None:
      return None
    axis = mapping[0]
    if axis is None or axis == -1:
      return None
    size = sharding.AxisSize(p.device_mesh, axis, p.mesh_axis_names)
    if num_groups % size:
      raise ValueError(f'{p.name}: num_groups = {num_groups} must be a '
                       f'multiple of the mesh axis size {size} to split '
                       'groups over it')
    # Groups split over a tuple of axes (data x expert): one merged axis.
    mesh, group_axis = sharding.MergedMeshAxis(p.device_mesh, axis,
                                               p.mesh_axis_names)
    return NestedMap(device_mesh=mesh, mesh_axis_names=None,
                     group_axis=group_axis)

  # ------------------------------------------------------------------ fprop
  def Route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    raise NotImplementedError(f'{type(self).__name__}.Route')

  def _Grouped(self, inputs, paddings, token_offset):
    """[B, T, M] -> x_gsm (annotated), nonpad_gs, token_gs, (B, T, M)."""
    p = self.params
    inputs = tf.convert_to_tensor(inputs)
    if inputs.shape.rank != 3 or not inputs.shape.is_fully_defined():
      raise ValueError(f'{p.name}: inputs must be a static [B, T, M] tensor, '
                       f'got shape {inputs.shape}')
    b, t, m = inputs.shape
    if m != p.input_dim:
      raise ValueError(f'{p.name}: inputs last dim {m} != input_dim '
                       f'{p.input_dim}')
    g, s = self.GroupShape(b * t)
    x_gsm = self.ShardActivation(
        tf.reshape(tf.cast(inputs, self.fprop_dtype), [g, s, m]), 'gsm')
    paddings = tf.convert_to_tensor(paddings)
    nonpad_gs = 1.0 - tf.reshape(tf.cast(paddings, tf.float32), [g, s])
    # A body layer a pipeline runs at several positions draws per position
    # (the layer index of its dropout key).
    token_gs = tf.reshape(routing_rng.GlobalTokenIndex(
        [b, t], token_offset, dropout.LayerIndex()), [g, s])
    return x_gsm, nonpad_gs, token_gs, (b, t, m)

  def ComputeRouting(self, theta, inputs, paddings, step=None,
                     token_offset=0):
    """(routing, aux_loss, stats) of FProp's inputs, [G, S, ...] tensors."""
    x_gsm, nonpad_gs, token_gs, _ = self._Grouped(inputs, paddings,
                                                  token_offset)
    return self.Route(theta, x_gsm, nonpad_gs, token_gs, step,
                      self.Capacity(x_gsm.shape[1]))

  def _RouteAndMetrics(self, theta, x_gsm, nonpad_gs, token_gs, step,
                       capacity):
    """(routing, aux_loss, metrics): the gate and its routing metrics."""
    p = self.params
    gate_out, aux_loss, stats = self.Route(theta, x_gsm, nonpad_gs, token_gs,
                                           step, capacity)
    if p.selection_bias_rate and not p.is_inference:
      gate_out = bias_balance.CarryCounts(gate_out, theta.selection_bias,
                                          p.num_experts)
    metrics = routing_metrics.RoutingMetrics(
        gate_out, nonpad_gs, p.num_experts, importance_e=stats.importance_e,
        load_e=stats.load_e, num_position_buckets=p.num_position_buckets)
    if stats.router_z is not None:
      metrics.router_z_loss = stats.router_z
      if p.aux_loss_weights.router_z:
        aux_loss += p.aux_loss_weights.router_z * stats.router_z
    metrics.aux_loss = aux_loss
    metrics.capacity = tf.constant(float(capacity))
    for key, value in (stats.metrics or NestedMap()).items():
      metrics[key] = tf.cast(value, tf.float32)
    # Summaries only: no gradient (a pipeline's remat differentiates every
    # stage output, and e.g. CV's sqrt at an all-padding micro-batch's zero
    # importance has an infinite derivative).
    return gate_out, aux_loss, metrics.Transform(tf.stop_gradient)

  def FProp(self, theta, inputs, paddings, step=None, token_offset=0):
    """inputs [B, T, M], paddings [B, T] -> (outputs [B, T, M], aux)."""
    p = self.params
    x_gsm, nonpad_gs, token_gs, (b, t, m) = self._Grouped(inputs, paddings,
                                                          token_offset)
    g, s = x_gsm.shape[0], x_gsm.shape[1]
    capacity = self.Capacity(s)
    gate_out, aux_loss, metrics = self._RouteAndMetrics(
        theta, x_gsm, nonpad_gs, token_gs, step, capacity)
    # Off unless an analysis opened a recorder (record.py): the routing
    # the dispatch below uses, per token of [B, T].
    routing_record.Record(self, gate_out, nonpad_gs, (b, t))
    expert_fn = self.ExpertFn(theta, step)
    shard = self.ShardActivation
    if self.dispatch_impl == 'sorted':
      out_gsm = shard(dispatch_sorted.SortedMoE(
          x_gsm, gate_out, self.BlockExpertFn(theta, step), p.num_experts,
          p.sorted_block_size, loop=p.is_inference), 'gsm')
    elif self.dispatch_impl == 'einsum':
      out_gsm = moe_dispatch.EinsumMoE(x_gsm, gate_out, expert_fn,
                                       p.num_experts, capacity, shard)
    else:
      out_gsm = moe_dispatch.GatherMoE(x_gsm, gate_out, expert_fn,
                                       p.num_experts, capacity, shard,
                                       self.ManualSpec(g))
    if p.num_shared_experts:
      # DeepSeekMoE §3.2: shared + routed; before Shazeer's App. C output
      # activation, which acts on the layer's whole FFN output.
      out_gsm += moe_shared.SharedExperts(self, theta, x_gsm, nonpad_gs, step)
    if p.output_activation != 'none':
      out_gsm = self._out_act(out_gsm) * tf.cast(nonpad_gs, out_gsm.dtype)[
          ..., tf.newaxis]
    outputs = tf.reshape(out_gsm, [b, t, m])
    # What GShard's group loss averages over (groups with real tokens): a
    # pipeline's mean over micro-batches weighted by it is the loss of the
    # whole batch (pipeline_aux).
    aux_groups = tf.reduce_sum(tf.cast(tf.reduce_sum(nonpad_gs, 1) > 0,
                                       tf.float32))
    return outputs, NestedMap(aux_loss=aux_loss, aux_groups=aux_groups,
                              metrics=metrics)
