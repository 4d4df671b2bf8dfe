"""Subprocess helper of test_replica_routing.py: one train step's metrics
of a tiny MoE translation model (GShard random second expert) on one
device and under MirroredStrategy over 2 and 4 virtual CPU devices, for
the same global batch. Prints one JSON object."""

import json
import sys

from lingshard.train import strategies

strategies.ConfigureCpuDevices(4)

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingshard import base_input  # noqa: E402
from lingshard.layers import moe  # noqa: E402
from lingshard.train import step as step_lib  # noqa: E402
from tests.models import mt_testlib  # noqa: E402

BATCH, SRC_LEN, TGT_LEN = 8, 6, 5


def Params():
  """No dropout (its masks are per replica); groups of 2 consecutive tokens,
  so a group holds the same tokens on any number of replicas; capacity 1
  for 2 tokens x 2 choices over 4 experts: drops happen."""
  p = mt_testlib.TinyParams(input_dropout_prob=0.0,
                            residual_dropout_prob=0.0,
                            atten_dropout_prob=0.0, label_smoothing=0.0)
  p.moe_tpl = moe.MoELayer.Params().Set(
      num_experts=4, group_size=2, num_groups=None, expert_capacity=1,
      second_expert_policy='random')
  return p


def Main(zero_offset):
  if zero_offset:  # What the trainer did before: every replica at 0.
    step_lib.ExampleOffset = lambda batch: tf.constant(0, tf.int64)
  out = {}
  for n in (1, 2, 4):
    p = Params()
    devices = [f'/cpu:{i}' for i in range(n)]
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
      task = p.Instantiate()
      train_step = step_lib.TrainStep(task)
    batch = base_input.NumericBatch(mt_testlib.SyntheticBatch(
        p, batch_size=BATCH, src_len=SRC_LEN, tgt_len=TGT_LEN, seed=3))

    @tf.function(autograph=False)
    def Run(local, task=task, train_step=train_step):
      metrics, grads = train_step.LossAndGrads(task.theta, local,
                                               tf.constant(7, tf.int64))
      metrics, _ = step_lib.CrossReplicaMean(metrics, grads)
      return metrics

    metrics = strategy.run(Run, args=(strategies.DistributeBatch(
        strategy, batch),))
    metrics = strategy.experimental_local_results(metrics)[0]
    out[n] = {k: np.asarray(v[0]).tolist() for k, v in metrics.items()}
  print(json.dumps(out))


if __name__ == '__main__':
  Main(zero_offset=sys.argv[1:] == ['--zero_offset'])
