"""How a pipeline combines its body's aux over layers and micro-batches.

The body's FProp returns `(y, aux)` (DEVELOPERS.md); a pipeline runs each
of L layers on each of M micro-batches and returns one aux for the stack.
Each aux key has its rule in `COMBINERS` (key -> function of the L lists of
M values); a body returning another key is refused in one line, and a new
kind of aux is one entry here:

  aux_loss  sum over layers of the mean over micro-batches (each layer's
            loss on the whole mini-batch, as the unpipelined stack);
  metrics   mean over layers and micro-batches (NestedMaps of tensors);
  moments   batch_norm.BatchNormLayer's NestedMap(count, mean, m2) (or a
            NestedMap of them) combined exactly over the micro-batches into
            L per-layer moments of the whole mini-batch (GPipe §2.2;
            `BatchNormLayer.UpdatedMoving`).
"""

import tensorflow as tf

from lingshard.layers import batch_norm
from lingshard.nested_map import NestedMap


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


def _AuxLoss(per_layer):
  return tf.add_n([tf.add_n(list(values)) / float(len(values))
                   for values in per_layer])


def _Metrics(per_layer):
  items = [m for values in per_layer for m in values]
  return items[0].Pack([tf.add_n(list(vals)) / float(len(items))
                        for vals in zip(*[x.Flatten() for x in items])])


def _Moments(per_layer):
  return [_CombineMomentsTree(list(values)) for values in per_layer]


COMBINERS = {'aux_loss': _AuxLoss, 'metrics': _Metrics, 'moments': _Moments}


def CombineAux(per_layer):
  """per_layer: L lists (one aux NestedMap per micro-batch) -> the stack's
  aux: every key combined by its COMBINERS rule, in the body's key order."""
  first = per_layer[0][0]
  out = NestedMap()
  if not first:
    return out
  unknown = sorted(set(first) - set(COMBINERS))
  if unknown:
    raise AuxError(f'the body returned aux keys {unknown}; a pipeline '
                   f'combines only {", ".join(sorted(COMBINERS))}')
  for key, combine in COMBINERS.items():
    if key in first:
      out[key] = combine([[a[key] for a in auxes] for auxes in per_layer])
  return out
