"""Transformer encoder/decoder layers and the stack that places MoE layers.

A Transformer encoder layer is a self-attention sublayer and a feed-forward
sublayer; a decoder layer adds cross-attention over the encoder output
between them (GShard §2.1). Each sublayer is wrapped with a residual
connection, residual dropout and layer norm:

  pre-norm (default):  x + dropout(f(LN(x)))      (plus a final LN per stack)
  post-norm:           LN(x + dropout(f(x)))      (Vaswani et al. 2017)

GShard §2.1 / Figure 3(b): MoE layers replace every other feed-forward
layer; `TransformerStack.Params().moe_layers` lists the layer indices whose
FFN is an MoE layer (None = every other one: 1, 3, 5, ...). Dense and MoE
FFNs share one contract (ffn.py): `FProp(theta, x, paddings, step,
token_offset) -> (y, aux)`; the stack returns the non-empty aux per layer.

GPipe (Huang et al. 2019 §2): with `TransformerStack.Params().pipeline_tpl`
set (a `pipeline.PipelinedLayer.Params()` giving num_stages K,
num_micro_batches M, remat, ...), the stack's layers run as one
`PipelinedLayer` whose body is the stack's TransformerLayer params: K cells
of consecutive layers, M micro-batches, weights stacked on a stage dim. The
final layer norm stays outside the pipeline; the decoder's encoder output
and paddings go through it as per-example extras. Incremental decoding
(`InitCache`, `CrossKeyValues`, `ExtendStep`) runs the same weights
unpipelined, layer by layer (`PipelinedLayer.LayerThetas`).

MoE inside the pipeline (GShard in GPipe): a pipeline stacks one weight
structure, so a stack whose MoE layers repeat with period g (GShard's
every other layer: g = 2, a dense + an MoE layer) pipelines L/g copies of
a `TransformerLayerGroup` of g layers. Each micro-batch passes its rows'
global token offsets and the pipeline keys dropout and routing by layer
and example (pipeline.py), the body keeps its annotations (experts split
over their mesh axis inside each stage), and each MoE layer's aux comes
back per layer (`layer_XXX`, as unpipelined), combined over micro-batches
exactly (pipeline_aux). Requirements, each a one-line error: MoE params
with `group_size` (a group must be the unpipelined model's group, and
`num_groups` would count a micro-batch's), no expert dropout (its mask is
keyed by buffer slot, not by token), and micro-batch tokens per data shard
divisible by the group size. The dispatch is GShard's einsum ('auto'
resolves to it; an explicit 'gather' is refused: its manual partitioning
cannot be vectorised over stages).

Re-materialisation (GShard §5.1; `TransformerStack.Params().remat`):
'layer' recomputes each layer's forward in the backward pass (remat.py), so
between the passes only layer boundaries (inputs, outputs, aux) are kept;
'none' keeps every activation. Numerics are the same either way.

Einsum letters: b batch, t target/query position, s source/key position,
m model dim, q new tokens of an incremental step.
"""

import tensorflow as tf

from lingshard.layers import attention
from lingshard.layers import base_layer
from lingshard.layers import dropout
from lingshard.layers import ffn
from lingshard.layers import layer_norm
from lingshard.layers import micro_batches
from lingshard.layers import pipeline
from lingshard.layers import remat
from lingshard.nested_map import NestedMap

NORM_POLICIES = ('pre', 'post')
REMAT_POLICIES = ('none', 'layer')


def _DefineShape(p):
  """Params shared by a Transformer layer and a stack of them."""
  p.Define('model_dim', 0, 'Model dim M.')
  p.Define('hidden_dim', 0, 'FFN (and MoE expert) hidden dim H.')
  p.Define('num_heads', 0, 'Attention heads N.')
  p.Define('dim_per_head', 0, 'Attention key/value dim per head.')
  p.Define('is_decoder', False,
           'Causal self-attention plus cross-attention over the encoder.')
  p.Define('norm_policy', 'pre', 'pre | post layer norm.')
  p.Define('ln_epsilon', 1e-6, 'Layer norm epsilon.')
  p.Define('residual_dropout_prob', 0.0, 'Dropout on each sublayer output.')
  p.Define('atten_dropout_prob', 0.0, 'Dropout on attention probs.')
  p.Define('relu_dropout_prob', 0.0, 'Dropout on FFN hidden units.')


_SHAPE_KEYS = ('model_dim', 'hidden_dim', 'num_heads', 'dim_per_head',
               'is_decoder', 'norm_policy', 'ln_epsilon',
               'residual_dropout_prob', 'atten_dropout_prob',
               'relu_dropout_prob')


class TransformerLayer(base_layer.BaseLayer):
  """One encoder or decoder layer; its FFN is dense or an MoE layer."""

  @classmethod
  def Params(cls):
    p = super().Params()
    _DefineShape(p)
    p.Define('moe_tpl', None,
             'MoE layer params for the FFN (input_dim/hidden_dim are set '
             'from model_dim/hidden_dim); None = dense FFN.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckOneOf('norm_policy', NORM_POLICIES)
    ln = layer_norm.LayerNorm.Params().Set(input_dim=p.model_dim,
                                           epsilon=p.ln_epsilon)
    drop = dropout.DropoutLayer.Params().Set(
        dropout_prob=p.residual_dropout_prob)
    atten = attention.MultiHeadAttention.Params().Set(
        input_dim=p.model_dim, num_heads=p.num_heads,
        dim_per_head=p.dim_per_head,
        atten_dropout_prob=p.atten_dropout_prob)
    sublayers = ['self_atten'] + (['cross_atten'] if p.is_decoder else [])
    for name in sublayers:
      self.CreateChild(name, atten)
      self.CreateChild(f'{name}_ln', ln)
      self.CreateChild(f'{name}_dropout', drop)
    # Child names keep the weight paths (`.../ffn/...`, `.../moe/...`).
    if p.moe_tpl is None:
      self._ffn_child = 'ffn'
      ffn_p = ffn.FeedForward.Params().Set(
          activation_dropout_prob=p.relu_dropout_prob)
    else:
      self._ffn_child = 'moe'
      ffn_p = p.moe_tpl.Copy()
    self.CreateChild(self._ffn_child, ffn_p.Set(input_dim=p.model_dim,
                                                hidden_dim=p.hidden_dim))
    self.CreateChild('ffn_ln', ln)
    self.CreateChild('ffn_dropout', drop)

  def _Sublayer(self, theta, name, x_btm, fn, step):
    """Residual + dropout + layer norm around `fn` (see module docstring).

    `fn(h) -> (y, extra)`; returns (sublayer output, extra).
    """
    ln, drop = getattr(self, f'{name}_ln'), getattr(self, f'{name}_dropout')
    ln_theta, drop_theta = theta[f'{name}_ln'], theta[f'{name}_dropout']
    if self.params.norm_policy == 'pre':
      y, extra = fn(ln.FProp(ln_theta, x_btm))
      return x_btm + drop.FProp(drop_theta, y, step=step), extra
    y, extra = fn(x_btm)
    return (ln.FProp(ln_theta, x_btm + drop.FProp(drop_theta, y, step=step)),
            extra)

  def _Ffn(self, theta, x_btm, paddings_bt, step, token_offset):
    """The FFN sublayer (dense or MoE, one contract): (out, aux)."""
    name = self._ffn_child
    return self._Sublayer(
        theta, 'ffn', x_btm,
        lambda h: self.children[name].FProp(
            theta[name], h, paddings_bt, step=step,
            token_offset=token_offset),
        step)

  def _Attention(self, theta, name, x_btm, fn, step):
    """An attention sublayer: `fn(h) -> y`; returns the sublayer output."""
    return self._Sublayer(theta, name, x_btm, lambda h: (fn(h), None),
                          step)[0]

  def FProp(self, theta, inputs_btm, paddings_bt, enc_bsm=None,
            enc_paddings_bs=None, step=None, token_offset=0):
    """One layer over a whole sequence.

    Args:
      theta: weights.
      inputs_btm: [B, T, M].
      paddings_bt: [B, T] float, 1.0 = padding.
      enc_bsm: encoder output [B, S, M] (decoder only).
      enc_paddings_bs: encoder paddings [B, S] (decoder only).
      step: int scalar: dropout masks and MoE routing randomness.
      token_offset: global index of this batch's first token, for the MoE
        layer's counter-based routing randomness (e.g. micro-batch i of a
        pipeline passes i * B * T).

    Returns:
      (outputs [B, T, M], the FFN's aux (ffn.py; empty for a dense FFN)).
    """
    p = self.params
    x = self._Attention(
        theta, 'self_atten', inputs_btm,
        lambda h: self.self_atten.FProp(theta.self_atten, h,
                                        key_paddings_bs=paddings_bt,
                                        causal=p.is_decoder, step=step),
        step)
    if p.is_decoder:
      if enc_bsm is None:
        raise ValueError(f'{p.name}: a decoder layer needs enc_bsm')
      x = self._Attention(
          theta, 'cross_atten', x,
          lambda h: self.cross_atten.FProp(theta.cross_atten, h, enc_bsm,
                                           enc_paddings_bs, step=step),
          step)
    return self._Ffn(theta, x, paddings_bt, step, token_offset)

  def ExtendStep(self, theta, inputs_bqm, cache, positions_q, self_mask_bqs,
                 cross_kv, cross_mask_bqs):
    """Incremental decoding of Q new tokens per row (inference only).

    Args:
      theta: weights.
      inputs_bqm: [B, Q, M] the new tokens' inputs.
      cache: NestedMap(k, v) [B, S, N, H] of this layer's self-attention.
      positions_q: [Q] cache positions of the new tokens.
      self_mask_bqs: [B, Q, S] self-attention mask over the cache.
      cross_kv: NestedMap(k, v) [B, S_src, N, H] projected encoder output.
      cross_mask_bqs: [B, Q, S_src] cross-attention mask.

    Returns:
      (outputs [B, Q, M], updated cache).
    """
    x, new_cache = self._Sublayer(
        theta, 'self_atten', inputs_bqm,
        lambda h: self.self_atten.ExtendStep(theta.self_atten, h, cache,
                                             positions_q, self_mask_bqs),
        None)
    x = self._Attention(
        theta, 'cross_atten', x,
        lambda h: self.cross_atten.Attend(theta.cross_atten, h, cross_kv,
                                          cross_mask_bqs),
        None)
    paddings_bq = tf.zeros(tf.shape(x)[:2], tf.float32)
    out, _ = self._Ffn(theta, x, paddings_bq, None, 0)
    return out, new_cache


class TransformerLayerGroup(base_layer.BaseLayer):
  """g consecutive Transformer layers as one pipeline body (a stage slot):
  FProp as TransformerLayer's; aux {layer_j: aux of sub-layer j}."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('layer_tpls', [], 'TransformerLayer params of the g layers.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChildren('layer', list(self.params.layer_tpls))

  def FProp(self, theta, inputs_btm, paddings_bt, enc_bsm=None,
            enc_paddings_bs=None, step=None, token_offset=0):
    x, group_aux = inputs_btm, NestedMap()
    for j, (layer, layer_theta) in enumerate(zip(self.layer, theta.layer)):
      x, aux = layer.FProp(layer_theta, x, paddings_bt, enc_bsm,
                           enc_paddings_bs, step=step,
                           token_offset=token_offset)
      if aux:
        group_aux[f'layer_{j}'] = aux
    return x, group_aux


def _Period(pattern):
  """The smallest g dividing len(pattern) with pattern periodic in g."""
  n = len(pattern)
  for g in range(1, n + 1):
    if n % g == 0 and pattern == pattern[:g] * (n // g):
      return g
  return n


def PipelinedMoEDispatch(p):
  """The platform hook of a pipelined MoE stack's params, or a model's
  holding `pipeline_tpl` and `moe_tpl`: 'auto' dispatch is einsum on every
  platform (module doc), resolved before the MoE layer's own hook (children
  come after) would pick gather. Returns the keys set."""
  if (p.pipeline_tpl is None or p.moe_tpl is None or
      p.moe_tpl.dispatch_impl != 'auto'):
    return []
  p.moe_tpl.dispatch_impl = 'einsum'
  return ['moe_tpl.dispatch_impl']


class TransformerStack(base_layer.BaseLayer):
  """`num_layers` Transformer layers; `moe_layers` say which FFNs are MoE."""

  @classmethod
  def Params(cls):
    p = super().Params()
    _DefineShape(p)
    p.Define('num_layers', 0, 'Number of Transformer layers.')
    p.Define('moe_tpl', None, 'MoE layer params; None = every FFN dense.')
    p.Define('moe_layers', None,
             'Indices of the layers whose FFN is MoE; None = every other '
             'layer (1, 3, 5, ...; GShard §2.1) when moe_tpl is set.')
    p.Define('pipeline_tpl', None,
             'pipeline.PipelinedLayer params (num_stages, num_micro_batches '
             'or micro_batch_size, remat, stage_splits, layer_costs, '
             'stage_mesh_axis); the stack sets body_tpl and num_layers. '
             'None = the layers run one after another (no pipeline).')
    p.Define('remat', 'none',
             "Re-materialisation of an unpipelined stack: 'none' keeps every "
             "activation for the backward pass; 'layer' keeps only layer "
             'boundaries and recomputes each layer in the backward pass '
             '(GShard §5.1). A pipelined stack remats per stage '
             '(pipeline_tpl.remat).')
    return p

  @staticmethod
  def MoeLayerIndices(p):
    """Sorted indices of the MoE layers that params `p` describe."""
    if p.moe_tpl is None:
      if p.moe_layers:
        raise ValueError(f'{p.name}: moe_layers {p.moe_layers} given but '
                         'moe_tpl is None')
      return []
    if p.moe_layers is None:
      return list(range(1, p.num_layers, 2))
    indices = sorted(set(int(i) for i in p.moe_layers))
    if indices and not 0 <= indices[0] <= indices[-1] < p.num_layers:
      raise ValueError(f'{p.name}: moe_layers {p.moe_layers} out of range '
                       f'for {p.num_layers} layers')
    return indices

  @classmethod
  def ForPlatform(cls, p, platform):
    del platform
    return PipelinedMoEDispatch(p)

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.num_layers <= 0:
      raise ValueError(f'{p.name}: num_layers must be > 0')
    self.CheckOneOf('remat', REMAT_POLICIES)
    if p.remat != 'none' and p.pipeline_tpl is not None:
      raise ValueError(f"{p.name}: remat={p.remat!r} is for an unpipelined "
                       "stack; a pipeline remats per stage (set remat='none' "
                       'and pipeline_tpl.remat)')
    moe = set(self.MoeLayerIndices(p))
    layers = []
    for i in range(p.num_layers):
      lp = TransformerLayer.Params()
      for key in _SHAPE_KEYS:
        lp.Set(**{key: p.Get(key)})
      lp.moe_tpl = p.moe_tpl if i in moe else None
      layers.append(lp)
    if p.pipeline_tpl is None:
      self.CreateChildren('layer', layers)
    else:
      self._CreatePipeline(layers, moe)
    if p.norm_policy == 'pre':
      self.CreateChild('final_ln', layer_norm.LayerNorm.Params().Set(
          input_dim=p.model_dim, epsilon=p.ln_epsilon))

  def _CreatePipeline(self, layers, moe):
    """The pipeline child: L/g copies of a body of g layers (module doc)."""
    p = self.params
    g = _Period([i in moe for i in range(p.num_layers)]) if moe else 1
    self._group = g
    pp = p.pipeline_tpl.Copy().Set(num_layers=p.num_layers // g)
    if g > 1 and pp.num_stages > pp.num_layers:
      raise ValueError(f'{p.name}: num_stages {pp.num_stages} exceeds the '
                       f'{pp.num_layers} pipeline bodies of {g} layers (the '
                       f'MoE pattern repeats every {g} layers); use at most '
                       f'{pp.num_layers} stages')
    if moe:
      # What the MoE layer needs inside a pipeline body (its ForPipeline);
      # its one-line refusal is the trainer's PipelineError.
      try:
        mp = p.moe_tpl.cls.ForPipeline(p.moe_tpl, p.name)
      except ValueError as e:
        raise pipeline.PipelineError(str(e)) from None
      for i in moe:
        layers[i].moe_tpl = mp
      pp.body_annotations = True
      pp.metrics_cls = p.moe_tpl.cls
    if g == 1:
      pp.body_tpl = layers[0]
    else:
      pp.body_tpl = TransformerLayerGroup.Params().Set(
          layer_tpls=layers[:g])
    self.CreateChild('pipeline', pp)

  @property
  def is_pipelined(self):
    return self.params.pipeline_tpl is not None

  def _PipelineBodies(self):
    """The TransformerLayers of the pipeline body, in order (g of them)."""
    body = self.pipeline.body
    return list(body.layer) if self._group > 1 else [body]

  def Layers(self, theta):
    """[(layer, layer theta)] in order; a pipelined stack's share its
    body's g layers."""
    if self.is_pipelined:
      out = []
      for t in self.pipeline.LayerThetas(theta.pipeline):
        thetas = t.layer if self._group > 1 else [t]
        out += list(zip(self._PipelineBodies(), thetas))
      return out
    return list(zip(self.layer, theta.layer))

  def _FinalNorm(self, theta, x):
    if self.params.norm_policy == 'pre':
      return self.final_ln.FProp(theta.final_ln, x)
    return x

  def FProp(self, theta, inputs_btm, paddings_bt, enc_bsm=None,
            enc_paddings_bs=None, step=None, token_offset=0):
    """All layers; returns (outputs [B, T, M], {layer_xxx: non-empty aux}).

    Arguments as `TransformerLayer.FProp`. Pipelined: the layers run in
    `PipelinedLayer.FPropPerLayer`; the aux keys are the unpipelined
    stack's.
    """
    if self.is_pipelined:
      return self._PipelinedFProp(theta, inputs_btm, paddings_bt, enc_bsm,
                                  enc_paddings_bs, step, token_offset)
    x = inputs_btm
    stack_aux = NestedMap()
    run = self._LayerFProp if self.params.remat == 'none' else (
        self._RematLayerFProp)
    for i, (layer, layer_theta) in enumerate(zip(self.layer, theta.layer)):
      x, aux = run(layer, layer_theta, x, paddings_bt, enc_bsm,
                   enc_paddings_bs, step, token_offset)
      if aux:
        stack_aux[f'layer_{i:03d}'] = aux
    return self._FinalNorm(theta, x), stack_aux

  def _PipelinedFProp(self, theta, x, paddings, enc, enc_paddings, step,
                      token_offset):
    p, g = self.params, self._group
    extras = (enc, enc_paddings) if p.is_decoder else ()
    if self.MoeLayerIndices(p):
      self._CheckMicroBatchGroups(x)
    x, per_layer = self.pipeline.FPropPerLayer(
        theta.pipeline, x, paddings, *extras, step=step,
        token_offset=token_offset)
    stack_aux = NestedMap()
    for index, aux in enumerate(per_layer):
      subs = aux if g > 1 else ({'layer_0': aux} if aux else {})
      for key, sub in subs.items():
        layer = index * g + int(key.split('_')[1])
        stack_aux[f'layer_{layer:03d}'] = sub
    return self._FinalNorm(theta, x), stack_aux

  def _CheckMicroBatchGroups(self, x):
    """A micro-batch's tokens per data shard must hold whole MoE groups."""
    p, pipe = self.params, self.pipeline
    if p.is_inference or x.shape[0] is None:
      return
    batch, length = int(x.shape[0]), int(x.shape[1])
    m = micro_batches.NumMicroBatches(pipe.params, batch, pipe.DataShards(),
                                      error=pipeline.PipelineError)
    tokens = batch // m // pipe.DataShards() * length
    if tokens % p.moe_tpl.group_size:
      raise ValueError(f'{p.name}: a micro-batch has {tokens} tokens per '
                       'data shard, not a multiple of moe_tpl.group_size '
                       f'{p.moe_tpl.group_size}')

  @staticmethod
  def _LayerFProp(layer, theta, x, paddings, enc, enc_paddings, step,
                  token_offset):
    return layer.FProp(theta, x, paddings, enc, enc_paddings, step=step,
                       token_offset=token_offset)

  def _RematLayerFProp(self, layer, theta, x, paddings, enc, enc_paddings,
                       step, token_offset):
    """layer.FProp as one remat.Recompute: theta leaves and the float
    inputs are its differentiable inputs; step and token_offset (ints) its
    constants. Returns what layer.FProp returns."""
    extras = [t for t in (enc, enc_paddings) if t is not None]
    leaves = theta.Flatten()
    num = len(leaves)
    consts = [tf.constant(0, tf.int64) if step is None else step,
              token_offset]
    outs_tpl = []

    def Fn(ins):
      layer_theta = theta.Pack(ins[:num])
      h, pads, *rest = ins[num:len(ins) - 2]
      enc_in, enc_pads = (rest + [None, None])[:2]
      step_in = None if step is None else ins[-2]
      y, aux = layer.FProp(layer_theta, h, pads, enc_in, enc_pads,
                           step=step_in, token_offset=ins[-1])
      aux = NestedMap(aux) if aux else NestedMap()
      outs_tpl[:] = [aux]
      return [y] + aux.Flatten()

    # The activations the recomputation starts from: x and the encoder
    # output (remat.TieToCotangent).
    acts = [num] + ([num + 2] if extras else [])
    outs = remat.Recompute(Fn, leaves + [x, paddings] + extras, consts,
                           activations=acts)
    return outs[0], outs_tpl[0].Pack(outs[1:])

  # ---------------------------------------------------- incremental decoding
  def InitCache(self, batch_size, max_len):
    """Per-layer zero self-attention caches [B, S=max_len, N, H]."""
    layers = (self._PipelineBodies() * self.pipeline.params.num_layers
              if self.is_pipelined else self.layer)
    return [layer.self_atten.InitCache(batch_size, max_len)
            for layer in layers]

  def CrossKeyValues(self, theta, enc_bsm):
    """Per-layer projected encoder keys/values (computed once per decode)."""
    return [layer.cross_atten.ProjectKeyValue(lt.cross_atten, enc_bsm)
            for layer, lt in self.Layers(theta)]

  def ExtendStep(self, theta, inputs_bqm, caches, positions_q, self_mask_bqs,
                 cross_kvs, cross_mask_bqs):
    """Q new tokens through every decoder layer; returns (out, caches)."""
    if not self.params.is_decoder:
      raise ValueError('ExtendStep is for decoder stacks')
    x = inputs_bqm
    new_caches = []
    for (layer, lt), cache, kv in zip(self.Layers(theta), caches,
                                      cross_kvs):
      x, cache = layer.ExtendStep(lt, x, cache, positions_q, self_mask_bqs,
                                  kv, cross_mask_bqs)
      new_caches.append(cache)
    return self._FinalNorm(theta, x), new_caches

