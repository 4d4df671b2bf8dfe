"""Restore on another mesh: a checkpoint of m4.TinyMoE (shrunk: 1 + 1
layers, each FFN an MoE layer of 8 experts) written by the trainer's
checkpointer on a 1-device mesh restores into the same model on an 8-device mesh, whose experts are split
8 ways (GShard §3.2), with every weight and optimizer slot identical, and
the restored model's loss, partitioned over 8 virtual CPU devices by XLA's
SPMD partitioner, equals the 1-device model's.

Checkpoints hold each weight whole (tf.Variables of the full shape, named by
weight path; train/checkpointer.py): the mesh is a layout the step's
sharding annotations give the weights inside a compiled program, not part
of the checkpoint, so nothing is re-split on restore. Both models keep
num_groups = 8 (the registered value): the groups, and so the routing, do
not depend on the mesh.

Instead of training steps (5 s of tracing here), the 1-device run's weights
are moved off their initial values and its optimizer slots filled with
random values before the save: a model built fresh draws the same initial
weights on any mesh (stateless init by seed and weight path), so only
values it cannot draw itself show that the restore read them.
"""


import numpy as np
import tensorflow as tf

from lingshard import base_input
from lingshard import sharding
from lingshard import trainer
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from lingshard.train import train_loop
from tests.trainer import trainer_testlib

MODEL = 'm4.TinyMoE'
# m4.TinyMoE's mesh is np.arange(8) (its 8 experts, one per device).
ONE_DEVICE = 'task.device_mesh=[0];task.moe_tpl.device_mesh=[0]'


def _Overrides(prepared_dir):
  return ';'.join(trainer_testlib.CorpusOverrides(prepared_dir, 16, 8) + [
      'task.num_encoder_layers=1', 'task.num_decoder_layers=1',
      'task.encoder_moe_layers=[0]', 'task.decoder_moe_layers=[0]',
      'task.model_dim=32', 'task.hidden_dim=32', 'task.num_heads=2',
      'task.dim_per_head=16'])


def _Trainer(logdir, overrides):
  cfg = trainer_testlib.ParseFlags(f'--model={MODEL}', f'--logdir={logdir}',
                                   f'--params_override={overrides}')
  params, _ = trainer.BuildParams(cfg)
  return train_loop.Trainer(params, str(logdir), printer=lambda _: None)


def _Perturb(state, step):
  """Random values (seeded) into every weight and slot; step = `step`."""
  rng = np.random.default_rng(0)
  for var in state.ThetaByPath().values():
    noise = rng.normal(scale=0.1, size=var.shape)
    var.assign(var.numpy() + noise.astype(var.dtype.as_numpy_dtype))
  for var in state.SlotsByPath().values():
    var.assign(np.abs(rng.normal(size=var.shape)).astype(
        var.dtype.as_numpy_dtype))
  state.step.assign(step)


def _Values(variables):
  return {name: v.numpy() for name, v in variables.items()}


def _PartitionedLoss(task, batch, step):
  """The task's loss on `batch`, XLA-partitioned over its mesh (batch split
  over mesh axis 0 as the trainer's data parallelism splits it)."""
  mesh = task.params.device_mesh

  def Loss(inputs):
    split = inputs.batch.Transform(lambda t: sharding.mesh_split(
        t, mesh, [0] + [-1] * (t.shape.rank - 1)))
    metrics, _ = task.FProp(task.ShardTheta(inputs.theta), split,
                            step=tf.constant(step, tf.int64))
    return NestedMap(loss=metrics.loss[0])

  inputs = NestedMap(theta=task.theta.Transform(lambda v: v.numpy()),
                     batch=batch.Transform(np.asarray))
  result = check.CheckFunction(Loss, inputs, np.size(mesh), compare=False,
                               run=True)
  return result, float(result.outputs['loss'])


def test_checkpoint_of_one_device_restores_on_eight(prepared_dir, tmp_path):
  base = _Overrides(prepared_dir)
  one = _Trainer(tmp_path, f'{base};{ONE_DEVICE}')
  assert np.array_equal(one.params.task.moe_tpl.device_mesh, [0])
  _Perturb(one.state, 3)
  one.checkpointer.Save(3)
  eight = _Trainer(tmp_path, base)
  assert np.array_equal(eight.params.task.moe_tpl.device_mesh, np.arange(8))
  fresh = _Values(eight.state.ThetaByPath())
  assert eight.Restore() == 3
  assert int(eight.state.step.numpy()) == 3

  theta1, theta8 = (_Values(t.state.ThetaByPath()) for t in (one, eight))
  slots1, slots8 = (_Values(t.state.SlotsByPath()) for t in (one, eight))
  assert sorted(theta8) == sorted(theta1) and sorted(slots8) == sorted(slots1)
  for name in theta1:
    assert np.array_equal(theta8[name], theta1[name]), name
  for name in slots1:
    assert np.array_equal(slots8[name], slots1[name]), name
  # The restore did something: no restored weight is its initial value.
  for name in theta1:
    assert not np.array_equal(fresh[name], theta8[name]), name

  batch = base_input.NumericBatch(next(iter(one.model.GetInput()
                                            .GetDataset())))
  metrics, _ = one.task.FProp(one.task.theta, batch,
                              step=tf.constant(3, tf.int64))
  loss1 = float(metrics.loss[0])
  result, loss8 = _PartitionedLoss(eight.task, batch, 3)
  # Experts are split 8 ways in the partitioned program.
  for name in ('enc.layer[0].moe.wi', 'dec.layer[0].moe.wo'):
    assert result.input_shardings[f'theta.{name}'].startswith(
        '{devices=[8,1,1]'), result.input_shardings
  assert result.CollectiveCounts()['all-to-all'] > 0, result.Report()
  np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
