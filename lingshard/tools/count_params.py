"""Parameter counts and per-device memory of a registered model, from params.

  python -m lingshard.tools.count_params --model=m4.MoE2048E36L[,m4.TinyMoE]

Instantiates the task's layer tree (layers declare weights in `__init__`;
variables are created lazily, so nothing is allocated) and walks
`DeclaredWeights()`-style declarations: shape, dtype, device mesh and split
mapping of every weight. Reports

- parameters by kind: embedding (source/target embeddings and softmax),
  attention (q/k/v/o projections), dense FFN, experts (MoE routed expert
  weights), shared experts (MoE always-on experts, DeepSeekMoE), gating
  (MoE router weights), layer norm, LSTM;
- bytes per device on the config's mesh: each weight's shard is
  prod_d ceil(dim_d / mesh size of its split axis) elements (XLA pads an
  uneven last shard); replicated weights count in full;
- bytes per device of Adafactor slots (Shazeer & Stern 2018, as in
  lingshard/optim/adafactor.py with the task's `train.adafactor` params):
  a factored weight [..., R, C] keeps float32 row/column second moments
  [..., R] and [..., C] split like the weight's dims; others keep a full
  float32 second moment, plus a first moment when beta1 > 0;
- forward matmul FLOPs per token pair (one source + one target token):
  2 x the weights one token multiplies by (MoE: gating + k routed experts,
  the nominal top-k count without capacity padding, + every shared expert;
  softmax included;
  embedding lookups, biases, norms and the length-dependent attention
  scores excluded).

A GPipe stack (`pipeline.PipelinedLayer`, weights [K, S, ...] stacked over
K stages of S slots) counts as its L layers: parameters and FLOPs are each
layer's own (the body's times L, or for a list of layers of different
shapes each one's unpadded weights; padded slots are not parameters);
bytes per device count the stacked [K, S, ...] weights (padded slots
included: they are allocated) split over the stage mesh axis. A pipeline
of cells of different shapes (`pipeline_cells.CellPipelinedLayer`, flat
rows [K, Wmax] per stage) counts each cell's own weights
(`CellParamCounts`, and its batch norms' moving averages as an unpipelined
cell's `moving` counts), not the padding up to the largest stage; its
stages' boundary shapes (`StageShapes`) are listed.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import dataclasses
import math
import sys

from absl import flags
import numpy as np

from lingshard import cli
from lingshard import config_check
from lingshard import model_registry
from lingshard import sharding
from lingshard.layers import attention
from lingshard.layers import embedding
from lingshard.layers import ffn
from lingshard.layers import layer_norm
from lingshard.layers import lstm
from lingshard.layers import pipeline
from lingshard.layers import pipeline_cells
from lingshard.layers import softmax
from lingshard.optim import adafactor
from lingshard.layers.moe import base as moe_base
from lingshard.layers.moe import shared as moe_shared

# Private flag values: tools can be imported together without clashes.
FLAGS = flags.FlagValues()
flags.DEFINE_string('model', 'm4.TinyMoE',
                    'Registered model key(s), comma separated.', flag_values=FLAGS)

KINDS = ('embedding', 'attention', 'dense_ffn', 'experts', 'shared_experts',
         'gating', 'layer_norm', 'lstm', 'other')
_LAYER_KINDS = (
    (embedding.EmbeddingLayer, 'embedding'),
    (softmax.SoftmaxLayer, 'embedding'),
    (attention.MultiHeadAttention, 'attention'),
    (ffn.FeedForward, 'dense_ffn'),
    (moe_base.MoEBase, 'moe'),
    (layer_norm.LayerNorm, 'layer_norm'),
    (lstm.LSTMLayer, 'lstm'),
)
_DTYPE_BYTES = {'float32': 4, 'bfloat16': 2, 'float16': 2, 'float64': 8,
                'int32': 4, 'int64': 8}


@dataclasses.dataclass
class Counts:
  """What `CountTask` measured (parameter counts are element counts)."""
  by_kind: dict
  total: int
  num_devices: int
  weight_bytes_per_device: int
  adafactor_bytes_per_device: int
  flops_per_token: int
  num_weights: int
  stage_shapes: list = dataclasses.field(default_factory=list)


def _Kind(layer, parent_kind):
  for cls, kind in _LAYER_KINDS:
    if isinstance(layer, cls):
      return kind
  return parent_kind


def _ShardElements(shape, mapping, mesh, mesh_axis_names):
  """Elements of one device's shard of a weight."""
  if mesh is None or mapping is None:
    return int(np.prod(shape, dtype=np.int64))
  mesh = np.asarray(mesh)
  axes = sharding.ResolveSplitDimsMapping(mapping, mesh.ndim, len(shape),
                                          mesh_axis_names)
  n = 1
  for dim, axis in zip(shape, axes):
    n *= dim if axis == -1 else math.ceil(dim / mesh.shape[axis])
  return n


def _AdafactorSlotShapes(opt, shape, mapping):
  """[(slot shape, slot split mapping)] of one weight under Adafactor."""
  mapping = list(mapping) if mapping is not None else None
  out = []
  if opt._IsFactored(shape):  # pylint: disable=protected-access
    out.append((shape[:-1], mapping and mapping[:-1]))
    out.append((shape[:-2] + shape[-1:],
                mapping and mapping[:-2] + mapping[-1:]))
  else:
    out.append((shape, mapping))
  if opt.params.beta1 > 0:
    out.append((shape, mapping))
  return out


def _Walk(layer, parent_kind, visit, stacked=None):
  """Calls visit(layer, kind, name, weight_params, stacked) for every weight.

  `stacked` is None, or for the body of a pipelined layer (pipeline) the
  pipelined layer: its weights stand for L layers stacked [K, S, ...].
  """
  if isinstance(layer, pipeline.PipelinedLayer):
    _Walk(layer.body, parent_kind, visit, stacked=layer)
    return
  kind = _Kind(layer, parent_kind)
  for name, wp in sorted(layer.weight_params.items()):
    visit(layer, kind, name, wp, stacked)
  for _, child in sorted(layer.children.items()):
    kids = (child if isinstance(child, list) else
            [child[k] for k in sorted(child)] if isinstance(child, dict) else
            [child])
    for kid in kids:
      _Walk(kid, kind, visit, stacked)


def _Stacked(pipe, shape, mapping):
  """(layers, [K, S] + shape, its split mapping) of a pipelined weight."""
  p = pipe.params
  splits = pipe.ChunkSplits()
  mesh = p.device_mesh
  axis = -1 if p.stage_mesh_axis is None else p.stage_mesh_axis
  if isinstance(axis, str):
    axis = list(p.mesh_axis_names).index(axis)
  if mapping is None:
    mapping = [-1] * len(shape)
  stacked_mapping = None if mesh is None else [axis, -1] + list(mapping)
  return (sum(splits), [p.num_stages, pipe.stack.slots] + shape,
          stacked_mapping,
          mesh, p.mesh_axis_names)


def _BodyKey(pipe, layer, name):
  """The key ('ffn.fc_in.w', 'layer[1].moe.wi') of `layer`'s weight `name`
  in the body: the body's declared weight that is this very WeightParams."""
  wp = layer.weight_params[name]
  for key, body_wp in pipe.body.DeclaredWeights().FlattenItems():
    if body_wp is wp:
      return key
  raise KeyError(f'{layer.path}/{name} is not a weight of {pipe.path}')


def CountTask(task):
  """Counts of an instantiated (variable-free) task; see module doc."""
  by_kind = {k: 0 for k in KINDS}
  mesh = task.params.device_mesh
  opt = adafactor.Adafactor(task.params.train.adafactor)
  acc = dict(weight_bytes=0, slot_bytes=0, active=0, num=0)
  share = getattr(task.params, 'share_tgt_embedding_softmax', False)

  def Visit(layer, kind, name, wp, stacked):
    shape = [int(d) for d in wp.shape]
    n = int(np.prod(shape, dtype=np.int64))
    if kind == 'moe':
      kind = ('experts' if name in moe_base.MoEBase.EXPERT_WEIGHTS else 'shared_experts'
              if name in moe_shared.WEIGHTS else 'gating')
    layers, mapping = 1, wp.tensor_split_dims_mapping
    mesh, names = wp.device_mesh, layer.params.mesh_axis_names
    active = _ActiveParams(layer, kind, name, shape, n, share)
    if isinstance(layer, pipeline_cells.CellPipelinedLayer):
      n, active = _CellPipelineOwn(layer, name)
    if stacked is not None:
      own = [int(np.prod(s, dtype=np.int64))
             for s in stacked.LayerShapes(_BodyKey(stacked, layer, name))]
      # Each layer's own weights (listed layers may be narrower than the
      # stacked, widest shape); a weight of rank >= 2 is multiplied.
      n, active = sum(own), (sum(own) if active else 0)
      layers, shape, mapping, mesh, names = _Stacked(stacked, shape, mapping)
    by_kind[kind] += layers * n if stacked is None else n
    acc['num'] += 1
    nbytes = _DTYPE_BYTES[wp.dtype.name if hasattr(wp.dtype, 'name') else
                          str(wp.dtype)]
    acc['weight_bytes'] += nbytes * _ShardElements(shape, mapping, mesh,
                                                   names)
    for slot_shape, slot_map in _AdafactorSlotShapes(opt, shape, mapping):
      acc['slot_bytes'] += 4 * _ShardElements(slot_shape, slot_map, mesh,
                                              names)
    acc['active'] += layers * active if stacked is None else active

  _Walk(task, 'other', Visit)
  return Counts(by_kind=by_kind, total=sum(by_kind.values()),
                num_devices=1 if mesh is None else int(np.size(mesh)),
                weight_bytes_per_device=acc['weight_bytes'],
                adafactor_bytes_per_device=acc['slot_bytes'],
                flops_per_token=2 * acc['active'], num_weights=acc['num'],
                stage_shapes=config_check.StageShapeLines(task))


def _CellPipelineOwn(pipe, name):
  """(parameters, weights one example multiplies by) of a cell pipeline's
  stacked `name`: the cells' own, without the stage rows' padding."""
  trainable = pipe.CellParamCounts()
  if name == 'w':
    active = sum(int(np.prod(wp.shape, dtype=np.int64))
                 for cell in pipe.cells
                 for wp in cell.DeclaredWeights().Flatten()
                 if wp.trainable and len(wp.shape) >= 2)
    return sum(trainable), active
  total = sum(int(np.prod(wp.shape, dtype=np.int64)) for cell in pipe.cells
              for wp in cell.DeclaredWeights().Flatten())
  return total - sum(trainable), 0  # The moving averages.


def _ActiveParams(layer, kind, name, shape, n, share_tgt_softmax):
  """Weights one token multiplies by (see the module docstring)."""
  if len(shape) < 2:
    return 0  # Biases, norms.
  if kind == 'embedding':
    # Lookups are free; the softmax (or the shared target table) is not.
    is_softmax = isinstance(layer, softmax.SoftmaxLayer) or (
        share_tgt_softmax and layer.params.name == 'tgt_emb')
    return n if is_softmax else 0
  if kind == 'experts':
    top_k = layer._TopK()  # pylint: disable=protected-access
    return n * top_k // layer.params.num_experts
  return n  # Shared experts too: every token.


def CountModel(model_key):
  """Counts of a registered model (its Train params), allocating nothing."""
  params = model_registry.GetParams(model_key, 'Train')
  return CountTask(config_check.Validate(params))


def _Human(n, unit=''):
  for scale, suffix in ((1e12, 'T'), (1e9, 'B'), (1e6, 'M'), (1e3, 'K')):
    if abs(n) >= scale:
      return f'{n / scale:.3g}{suffix}{unit}'
  return f'{n}{unit}'


def _HumanBytes(n):
  for scale, suffix in ((2**40, 'TiB'), (2**30, 'GiB'), (2**20, 'MiB'),
                        (2**10, 'KiB')):
    if n >= scale:
      return f'{n / scale:.3g} {suffix}'
  return f'{n} B'


def FormatCounts(model_key, c):
  """A text report of one model's counts."""
  lines = [f'{model_key}: {c.total:,} parameters ({_Human(c.total)}) in '
           f'{c.num_weights} weights']
  for kind in KINDS:
    if c.by_kind[kind]:
      lines.append(f'  {kind:<14} {c.by_kind[kind]:>14,}  '
                   f'{100.0 * c.by_kind[kind] / c.total:6.2f}%')
  lines.append(f'  per device ({c.num_devices} devices): weights '
               f'{_HumanBytes(c.weight_bytes_per_device)}, Adafactor slots '
               f'{_HumanBytes(c.adafactor_bytes_per_device)}')
  lines.append(f'  forward matmul FLOPs per (source + target) token: '
               f'{_Human(c.flops_per_token)}')
  lines += [f'  {line}' for line in c.stage_shapes]
  return '\n'.join(lines)


def main(argv):
  del argv
  for key in FLAGS.model.split(','):
    try:
      counts = CountModel(key.strip())
    except (LookupError, config_check.ConfigCheckError) as e:
      sys.exit(f'count_params: error: {e}')
    print(FormatCounts(key, counts))


if __name__ == '__main__':
  cli.RunMain(main, FLAGS)
