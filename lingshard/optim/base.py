"""The optimizer contract, and plain SGD as its smallest instance.

An optimizer is configured by `Params()` and exposes two pure functions:

- `InitSlots(value)`: the initial slot tensors of one weight, a NestedMap
  (e.g. Adam's `m`, `v`), possibly empty;
- `StepScalars(lr, step)`: the per-step scalars every weight's update
  reads (bias corrections, decays), made once per `Apply`, not once per
  weight: the traced step then holds one copy, not one per weight;
- `UpdateOne(value, grad, slots, scalars)`: the new weight and slots.

`InitState` / `Apply` map them over every leaf of theta. The state of a
whole model is a NestedMap shaped like theta whose leaves are slot
NestedMaps; `step` is the int64 number of updates applied before this one.
"""

import tensorflow as tf

from lingshard import hyperparams
from lingshard.nested_map import NestedMap


class BaseOptimizer:
  """Pure, per-weight update rule (see the module docstring)."""

  @classmethod
  def Params(cls):
    return hyperparams.InstantiableParams(cls)

  def __init__(self, params):
    self.params = params.Copy().Freeze()

  def InitSlots(self, value):
    """Initial slot tensors of one weight (a NestedMap, maybe empty)."""
    del value
    return NestedMap()

  def StepScalars(self, lr, step):
    """NestedMap of this step's shared scalars (default: lr, step)."""
    return NestedMap(lr=lr, step=step)

  def UpdateOne(self, value, grad, slots, scalars):
    """Returns (new value, new slots) for one weight; `scalars` is
    StepScalars(lr, step)."""
    raise NotImplementedError(f'{type(self).__name__}.UpdateOne')

  def InitState(self, theta):
    """Slots of every weight: a NestedMap like theta, slot NestedMaps as
    leaves."""
    return theta.Pack([self.InitSlots(v) for v in theta.Flatten()])

  def Apply(self, theta, grads, state, lr, step):
    """One update of every weight: returns (theta', state')."""
    new_values, new_slots = [], []
    scalars = self.StepScalars(lr, step)
    for value, grad, slots in zip(theta.Flatten(), grads.Flatten(),
                                  FlattenSlots(theta, state)):
      v, s = self.UpdateOne(value, tf.cast(grad, value.dtype), slots,
                            scalars)
      new_values.append(v)
      new_slots.append(s)
    return theta.Pack(new_values), theta.Pack(new_slots)


def FlattenSlots(theta, state):
  """The slot NestedMap of each theta leaf, in theta.Flatten() order."""
  out = []
  _FlattenUpTo(theta, state, out)
  return out


def _FlattenUpTo(structure, value, out):
  if isinstance(structure, NestedMap):
    for key in sorted(structure):
      _FlattenUpTo(structure[key], value[key], out)
  elif isinstance(structure, (list, tuple)):
    for s, v in zip(structure, value, strict=True):
      _FlattenUpTo(s, v, out)
  else:
    out.append(value)


class Sgd(BaseOptimizer):
  """Plain gradient descent: `w' = w - lr * g` (no slots)."""

  def UpdateOne(self, value, grad, slots, scalars):
    return value - tf.cast(scalars.lr, value.dtype) * grad, slots
