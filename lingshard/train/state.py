"""`TrainState`: the variables a training run owns.

- `theta`: the task's weights (a NestedMap of tf.Variables, created by the
  layers under the current distribution strategy's scope);
- `opt_state`: one variable per optimizer slot, a NestedMap like theta
  whose leaves are slot NestedMaps (`opt_state.fc[0].w.m`);
- `step`: int64 number of updates applied;
- `layouts`: {layer path: int array} of the layers with a WeightLayout
  (a pipeline's slot -> layer map), recorded in checkpoints, not trained;
- `seed`: the task's random_seed. Initialisation and routing randomness are
  stateless functions of (seed, step, layer path), so (seed, step) is the
  whole RNG state a resumed run needs.

Variables are named by weight path (`model/fc_000/w`, slot
`model/fc_000/w/m`), which is how checkpoints and error messages name them.
"""

import tensorflow as tf

from lingshard.nested_map import NestedMap
from lingshard.optim import base as optim_base


def VarPath(var):
  """`model/fc_000/w` for a variable named `model/fc_000/w:0`."""
  name = var.name
  return name[:-2] if name.endswith(':0') else name


def _Read(var):
  return var.read_value()


class TrainState:
  """Theta, optimizer-slot, step and seed variables of a run.

  Create it inside `strategy.scope()` so every variable is distributed.
  Without a `train_step` (eval, decode, export) there are no slots.
  """

  def __init__(self, task, train_step=None):
    task.InstantiateVariables()
    self.theta = task.vars
    if train_step is None:
      init = self.theta.Pack([NestedMap() for _ in self.theta.Flatten()])
    else:
      init = train_step.InitOptState(self.theta.Transform(_Read))
    slot_vars = []
    for var, slots in zip(self.theta.Flatten(),
                          optim_base.FlattenSlots(self.theta, init)):
      path = VarPath(var)
      slot_vars.append(NestedMap({
          name: tf.Variable(value, name=f'{path}/{name}', trainable=False)
          for name, value in sorted(slots.items())}))
    self.opt_state = self.theta.Pack(slot_vars)
    self.step = tf.Variable(0, dtype=tf.int64, name='global_step',
                            trainable=False)
    self.seed = tf.Variable(int(task.params.random_seed), dtype=tf.int64,
                            name='random_seed', trainable=False)
    self.layouts = {layer.path: layout for layer in task.AllLayers()
                    if (layout := layer.WeightLayout()) is not None}

  def ThetaByPath(self):
    """{weight path: variable}."""
    return {VarPath(v): v for v in self.theta.Flatten()}

  def SlotsByPath(self):
    """{`weight path/slot`: variable}."""
    return {VarPath(v): v for v in self.opt_state.Flatten()}

  def Values(self):
    """(theta, opt_state) as tensors read from the variables."""
    return (self.theta.Transform(_Read), self.opt_state.Transform(_Read))

  def Assign(self, theta, opt_state):
    """Writes new (theta, opt_state) values into the variables."""
    for var, value in zip(self.theta.Flatten(), tf.nest.flatten(theta)):
      var.assign(value)
    for var, value in zip(self.opt_state.Flatten(),
                          tf.nest.flatten(opt_state)):
      var.assign(value)
