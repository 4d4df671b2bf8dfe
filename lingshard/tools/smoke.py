"""Smoke run: instantiate a registered model, run a few training steps.

  python -m lingshard.tools.smoke --model=toy.FFRegression --steps=20

Each step is `tf.function(step)(batch)` on the batch without its string
leaves (base_input.NumericBatch): forward, backward and a Keras Adam update
of the task's variables.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import time

from absl import flags
import tensorflow as tf

from lingshard import base_input
from lingshard import model_registry
from lingshard import sharding
from lingshard import cli

# Private flag values: tools can be imported together without clashes.
FLAGS = flags.FlagValues()
flags.DEFINE_string('model', 'toy.FFRegression', 'Registered model key.', flag_values=FLAGS)
flags.DEFINE_integer('steps', 20, 'Training steps to run.', flag_values=FLAGS)
flags.DEFINE_integer('log_every', 5, 'Print the loss every N steps.', flag_values=FLAGS)


def TrainSteps(model_key, steps, log_every=5, printer=print):
  """Trains `steps` steps; returns the list of losses."""
  params = model_registry.GetParams(model_key, 'Train')
  model = params.Instantiate()
  task = model.task
  batches = iter(model.GetInput().GetDataset())
  variables = task.vars.Flatten()
  opt = tf.keras.optimizers.Adam(task.params.train.learning_rate)

  @sharding.Function(xla_compiled=False)
  def Step(batch):
    with tf.GradientTape() as tape:
      metrics, _ = task.FProp(task.ShardTheta(task.theta), batch)
      loss = metrics.loss[0]
    grads = tape.gradient(loss, variables)
    opt.apply_gradients(zip(grads, variables))
    return loss

  losses = []
  start = time.time()
  for step in range(1, steps + 1):
    losses.append(float(Step(base_input.NumericBatch(next(batches)))))
    if step % log_every == 0 or step == 1 or step == steps:
      printer(f'step {step:4d}  loss {losses[-1]:.5f}')
  n = sum(v.shape.num_elements() for v in variables)
  printer(f'{model_key}: {n} parameters, {steps} steps in '
          f'{time.time() - start:.1f}s, loss {losses[0]:.4f} -> '
          f'{losses[-1]:.4f}')
  return losses


def main(argv):
  del argv
  TrainSteps(FLAGS.model, FLAGS.steps, FLAGS.log_every)


if __name__ == '__main__':
  cli.RunMain(main, FLAGS)
