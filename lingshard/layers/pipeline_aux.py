"""How a pipeline combines its body's aux over micro-batches and layers.

The body's FProp returns `(y, aux)` (DEVELOPERS.md); a pipeline runs each
of L layers on each of M micro-batches. `CombineMicroBatches` makes one aux
per layer from its M values, `CombineLayers` one aux for the stack from
the L per-layer ones. Each aux key has its rule; a body returning another
key is refused in one line, and a new kind of aux is one entry here. An
aux may also nest auxes under other keys (a body of several layers, e.g.
NestedMap(layer_1=aux)): CombineMicroBatches combines each of them.

Over micro-batches (the layer's aux on the whole mini-batch):
  aux_loss    weighted mean: weight `aux_groups` when the aux has one (what
              the loss averages over, e.g. GShard's groups with tokens:
              then the result is the unpipelined loss exactly), else 1;
  aux_groups  sum;
  metrics     MoE routing metrics (with `num_tokens`) by their own rule,
              moe/metrics.CombineParts (counts sum, fractions of the real
              tokens are token-weighted: exact); others the mean;
  moments     batch_norm.BatchNormLayer's NestedMap(count, mean, m2) (or a
              NestedMap of them) combined exactly (GPipe §2.2;
              `BatchNormLayer.UpdatedMoving`).
Over layers: aux_loss sums, metrics average, moments stay one per layer
(a list), aux_groups is dropped.
"""

import tensorflow as tf

from lingshard.layers import batch_norm
from lingshard.nested_map import NestedMap

KEYS = ('aux_loss', 'aux_groups', 'metrics', 'moments')


class AuxError(ValueError):
  """A body aux the pipeline cannot combine (one line)."""


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


def _WeightedMean(values, weights):
  total = tf.add_n(weights)
  return tf.add_n([v * w for v, w in zip(values, weights)]) / tf.maximum(
      total, 1.0)


def _Refuse(keys):
  raise AuxError(f'the body returned aux keys {keys}; a pipeline combines '
                 f'only {", ".join(sorted(KEYS))}')


def CombineMicroBatches(values, combine_metrics):
  """M aux NestedMaps of one layer (one structure) -> the layer's aux;
  `combine_metrics(parts)` combines their metrics (the body's
  BaseLayer.CombineMetricParts)."""
  first = values[0]
  if len(values) == 1:  # The whole batch's aux already (e.g. unpipelined).
    return NestedMap(first)
  out = NestedMap()
  if not first:
    return out
  unknown = sorted(set(first) - set(KEYS))
  if unknown:
    if all(isinstance(first[k], dict) for k in first):
      for key in first:  # Nested auxes of a body of several layers.
        out[key] = CombineMicroBatches([NestedMap(v[key]) for v in values],
                                       combine_metrics)
      return out
    _Refuse(unknown)
  if 'aux_loss' in first:
    weights = [tf.cast(v.get('aux_groups', 1.0), tf.float32) for v in values]
    out.aux_loss = _WeightedMean(
        [tf.cast(v.aux_loss, tf.float32) for v in values], weights)
  if 'aux_groups' in first:
    out.aux_groups = tf.add_n([tf.cast(v.aux_groups, tf.float32)
                               for v in values])
  if 'metrics' in first:
    out.metrics = combine_metrics([NestedMap(v.metrics) for v in values])
  if 'moments' in first:
    out.moments = _CombineMomentsTree([v.moments for v in values])
  return out


def _Expand(aux):
  """A body's aux as a list of layer auxes (nested ones in key order)."""
  if not aux or set(aux) <= set(KEYS):
    return [aux]
  if all(isinstance(v, dict) for v in aux.values()):
    return [x for key in sorted(aux) for x in _Expand(NestedMap(aux[key]))]
  _Refuse(sorted(set(aux) - set(KEYS)))


def CombineLayers(per_layer):
  """L per-layer auxes (CombineMicroBatches) -> the stack's aux: aux_loss
  summed, metrics averaged, moments a list of the layers'. A body of
  several layers contributes each of its nested auxes as a layer."""
  per_layer = [x for aux in per_layer for x in _Expand(aux)]
  first = per_layer[0]
  out = NestedMap()
  if not first:
    return out
  if 'aux_loss' in first:
    out.aux_loss = tf.add_n([a.aux_loss for a in per_layer])
  if 'metrics' in first:
    out.metrics = first.metrics.Pack(
        [tf.add_n(list(v)) / float(len(per_layer))
         for v in zip(*[a.metrics.Flatten() for a in per_layer])])
  if 'moments' in first:
    out.moments = [a.moments for a in per_layer]
  return out


def PerLayer(aux_rows, num_layers):
  """L lists (one aux per real micro-batch, in iteration order) from a
  pipeline's iterations: aux_rows = [(per slot an aux with leaves [K, ...],
  weights [K, C] (0 = bubble or padded slot), layer_ids [K, C] the layer
  each slot ran)]."""
  per_layer = [[] for _ in range(num_layers)]
  for aux_list, weights, layer_ids in aux_rows:
    for stage in range(weights.shape[0]):
      for slot, aux in enumerate(aux_list):
        if weights[stage, slot]:
          per_layer[layer_ids[stage, slot]].append(
              aux.Transform(lambda t, a=stage: t[a]))
  return per_layer
