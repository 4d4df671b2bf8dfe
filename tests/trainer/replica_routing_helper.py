"""Subprocess helper of test_replica_routing.py: one training step
(`TrainStep.Replica`, the trainer's per-replica step) of a tiny MoE
translation model with GShard's random second expert, on one device and
under MirroredStrategy over 2 and 4 virtual CPU devices, on the same global
batch. Prints one JSON object: per replica count, the step's metrics, the
updated weights' checksum and every MoE layer's routing (expert, slot and
dispatch decision of each (group, token, choice)), the replicas' groups
concatenated in order."""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import gc
import json
import threading

from lingshard.train import strategies

strategies.ConfigureCpuDevices(4)

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingshard import base_input  # noqa: E402
from lingshard.train import step as step_lib  # noqa: E402
from lingshard.layers.moe import top2  # noqa: E402
from tests.models import mt_testlib  # noqa: E402

BATCH, SRC_LEN, TGT_LEN = 8, 6, 6
_TAP = threading.local()  # MirroredStrategy runs each replica in a thread.


def _TappedRoute(route):
  def Route(self, *args, **kwargs):
    out = route(self, *args, **kwargs)
    r = out[0]
    _TAP.routing.append(tf.stack([r.expert_gsk, r.position_gsk,
                                  tf.cast(r.dispatched_gsk, tf.int32)]))
    return out
  return Route


def Params():
  """Dropout 0.1 everywhere (masks keyed by global example); groups of 2
  consecutive tokens, so a group holds the same tokens on any number of
  replicas; capacity 1 for 2 tokens x 2 choices over 4 experts: drops
  happen. Auxiliary-loss-free balancing on (its bias starts at 0, so the
  step's routing is unchanged; the update reads the batch's counts)."""
  p = mt_testlib.TinyParams(input_dropout_prob=0.1,
                            residual_dropout_prob=0.1,
                            atten_dropout_prob=0.1, label_smoothing=0.0)
  p.moe_tpl = top2.MoELayer.Params().Set(
      num_experts=4, group_size=2, num_groups=None, expert_capacity=1,
      second_expert_policy='random', selection_bias_rate=0.01,
      **{'aux_loss_weights.group_aux': 0.5})
  p.allow_noncausal_routing = True  # Drops on purpose (GShard's decoder).
  return p


def Batch(p):
  """Lengths 5 or 6 of 6: padding, but every group of 2 has a real token
  (the aux loss is a mean over non-empty groups; see ReplicaObjective)."""
  rng = np.random.RandomState(3)
  return base_input.NumericBatch(mt_testlib.SyntheticBatch(
      p, batch_size=BATCH, src_len=SRC_LEN, tgt_len=TGT_LEN,
      src_lengths=rng.randint(5, 7, [BATCH]),
      tgt_lengths=rng.randint(5, 7, [BATCH])))


def Runs():
  """{replicas: run} of 1, 2 and 4 replicas (see the module docstring)."""
  out = {}
  for n in (1, 2, 4):
    p = Params()
    strategy = tf.distribute.MirroredStrategy(
        [f'/cpu:{i}' for i in range(n)],
        cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
      task = p.Instantiate()
      train_step = step_lib.TrainStep(task)
      opt_state = train_step.InitOptState(task.theta)

    def Replica(local, task=task, train_step=train_step, opt_state=opt_state):
      _TAP.routing = []
      theta, _, metrics = train_step.Replica(task.theta, opt_state, local,
                                             tf.constant(7, tf.int64))
      return metrics, theta, _TAP.routing

    @tf.function(autograph=False)
    def Run(batch, strategy=strategy, replica=Replica):
      return strategy.run(replica, args=(strategies.DistributeBatch(
          strategy, batch),))

    metrics, theta, routing = Run(Batch(p))
    local = strategy.experimental_local_results
    metrics = local(metrics)[0]
    theta = local(theta)[0]
    layers = [np.concatenate([np.asarray(x) for x in local(layer)], axis=1)
              for layer in routing]
    out[n] = dict(
        metrics={k: np.asarray(v[0]).tolist() for k, v in metrics.items()},
        theta_sum=float(sum(np.abs(np.asarray(t)).sum()
                            for t in theta.Flatten())),
        routing=[x.tolist() for x in layers],
        # Auxiliary-loss-free bias after the step: moved by the counts of
        # the whole global batch (summed over replicas like gradients).
        selection_bias=[np.asarray(t).tolist()
                        for k, t in theta.FlattenItems()
                        if k.endswith('selection_bias')])
  return out


def Main():
  """Prints {'global': Runs(), 'zero_offset': Runs() with every replica at
  example offset 0 (what the trainer did before #15)}."""
  top2.MoELayer.Route = _TappedRoute(top2.MoELayer.Route)
  out = {'global': Runs()}
  step_lib.ExampleOffset = lambda batch: tf.constant(0, tf.int64)
  out['zero_offset'] = Runs()
  print(json.dumps(out))


if __name__ == '__main__':
  # A test process, like the pytest workers (tests/conftest.py): no
  # automatic collection while TF traces (this helper: 56.9 -> 51.6 s).
  gc.disable()
  Main()
