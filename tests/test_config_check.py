"""config_check.Validate: every registered config passes on its own mesh;
each kind of inconsistency is one exact line naming the parameter, its
value and the constraint; the trainer refuses such params before building
anything."""

import numpy as np
import pytest

from lingshard import config_check
from lingshard import model_registry
from lingshard import trainer
from lingshard.layers import attention
from lingshard.models import base_model
from lingshard.spmd import layer_task
from tests.trainer import trainer_testlib

model_registry.ImportAllParams()


@pytest.mark.parametrize('key', model_registry.ListModels())
def test_registered_configs_pass_on_their_mesh(key):
  params = model_registry.GetParams(key, 'Train')
  task = config_check.Validate(params)
  assert task.params.name == params.task.name


@pytest.mark.parametrize('key,tokens', [
    ('m4.MoE128E12L', 2**20), ('m4.MoE128E36L', 2**20),
    ('m4.MoE512E12L', 2**20), ('m4.MoE512E36L', 2**20),
    ('m4.MoE2048E12L', 4 * 2**20), ('m4.MoE2048E36L', 4 * 2**20),
    ('m4.MoE2048E60L', 4 * 2**20), ('m4.DenseT96L', 4 * 2**20)])
def test_paper_configs_batch_and_groups(key, tokens):
  """GShard Table 3's batch: 4M tokens per step on 2048 cores (and T(96L)),
  1M on 512 and 128 cores; groups of 2048 tokens in every config."""
  params = model_registry.GetParams(key, 'Train')
  inp = params.input
  assert [b * t for b, t in zip(inp.bucket_batch_limits,
                                inp.bucket_upper_bounds)] == [tokens] * 3
  if params.task.moe_tpl is not None:
    assert params.task.moe_tpl.num_groups * 2048 == tokens
    # Against the config's real replica count on a pod slice: one replica
    # spans the mesh (TPUStrategy + SPMD).
    config_check.Validate(params, num_replicas=1)


def _Tiny():
  return model_registry.GetParams('m4.TinyMoE', 'Train')


def _Error(params, **kw):
  with pytest.raises(config_check.ConfigCheckError) as e:
    config_check.Validate(params, **kw)
  return str(e.value)


def test_batch_vs_replicas_and_hosts():
  params = _Tiny()
  assert _Error(params, num_replicas=3) == (
      'input.bucket_batch_limits[0]=128 (the global batch) must be divisible '
      'by the 3 replicas of 1 input host(s)')
  assert _Error(params, num_replicas=4, num_input_pipelines=3) == (
      'input.bucket_batch_limits[0]=128 (the global batch) must be divisible '
      'by the 4 replicas of 3 input host(s)')


def test_batch_vs_mesh_axis():
  params = model_registry.GetParams('m4.MoE2048E36L', 'Train')
  params.input.bucket_batch_limits = [128, 64, 32]
  assert _Error(params) == (
      "input.bucket_batch_limits[0]=128 must be divisible by mesh axis 'x' of "
      'size 2048 (the batch is split over it)')
  params = _Tiny()
  assert _Error(params, num_replicas=16) == (
      'input.bucket_batch_limits[1]=64 / 16 replicas = 4 must be divisible by '
      "mesh axis 'x' of size 8 (the batch is split over it)")


def test_groups_vs_tokens_and_mesh():
  params = _Tiny()
  params.task.moe_tpl.num_groups = 24
  assert _Error(params) == (
      'model/dec/layer_001/moe: num_groups=24 must divide the 1024 tokens of '
      "a replica's batch (input.bucket_batch_limits[0]=128 x "
      'input.bucket_upper_bounds[0]=8) (GShard §2.2: G equal groups)')
  params.task.moe_tpl.num_groups = 12
  assert _Error(params) == (
      "model/dec/layer_001/moe: num_groups=12 must be a multiple of mesh axis "
      "'x' of size 8 (groups are split over it)")
  params.task.moe_tpl.Set(num_groups=None, group_size=48)
  assert _Error(params) == (
      'model/dec/layer_001/moe: group_size=48 must divide the 1024 tokens of '
      "a replica's batch (input.bucket_batch_limits[0]=128 x "
      'input.bucket_upper_bounds[0]=8)')


def test_experts_vs_expert_axis():
  params = _Tiny()
  params.task.moe_tpl.num_experts = 12
  assert _Error(params) == (
      "model/dec/layer_001/moe: num_experts=12 must be divisible by mesh axis "
      "'x' of size 8 (experts are split over it)")


def test_weight_dims_vs_split_axes():
  """A 2-D mesh with the experts' hidden dim split over its second axis."""
  params = _Tiny()
  mesh = np.arange(8).reshape(2, 4)
  params.task.Set(device_mesh=mesh, mesh_axis_names=['x', 'h'],
                  hidden_dim=258)
  moe = params.task.moe_tpl
  moe.Set(device_mesh=mesh, mesh_axis_names=['x', 'h'], num_groups=2)
  moe.weight_split_dims_mapping.Set(wi=['x', -1, 'h'], wo=['x', 'h', -1])
  moe.activation_split_dims_mapping.gsm = ['x', -1, -1]
  assert _Error(params) == (
      "model/dec/layer_001/moe/wi [8, 128, 258]: dim 2 = 258 must be "
      "divisible by mesh axis 'h' of size 4 (the weight is split over it)")


def test_micro_batches_vs_batch():
  params = model_registry.GetParams('m4.DenseT96L', 'Train')
  params.input.bucket_batch_limits = [4096, 4096, 4096]
  assert _Error(params) == (
      'input.bucket_batch_limits[0]=4096 must be divisible by '
      'model/dec/pipeline: num_micro_batches=64 x mesh axis \'data\' of size '
      '128 = 8192 (each micro-batch is split over it)')


def test_micro_batch_size_must_divide_a_replicas_batch():
  # The pipeline's own count (layers/micro_batches.py): refused here, not
  # at the first step.
  params = model_registry.GetParams('gpipe.TinyMoEPipelined', 'Train')
  params.task.pipeline_tpl.Set(num_micro_batches=None, micro_batch_size=48)
  assert _Error(params) == (
      'input.bucket_batch_limits[0]=128: model/dec/pipeline: '
      'micro_batch_size 48 does not divide the batch 128; use a divisor of '
      '128')


def test_pipelined_moe_experts_and_groups_inside_a_stage():
  """MoE layers in a pipeline's body: experts vs the expert axis inside a
  stage; the group size vs a micro-batch's tokens per data shard."""
  params = model_registry.GetParams('gpipe.TinyMoEPipelined', 'Train')
  params.task.moe_tpl.num_experts = 3
  assert _Error(params) == (
      "model/dec/pipeline/body/layer_001/moe: num_experts=3 must be "
      "divisible by mesh axis 'expert' of size 2 (experts are split over it)")
  params = model_registry.GetParams('gpipe.TinyMoEPipelined', 'Train')
  params.task.moe_tpl.group_size = 48
  assert _Error(params) == (
      'model/dec/pipeline/body/layer_001/moe: group_size=48 must divide the '
      '64 tokens of one of 4 data shards of a micro-batch (4 per batch) of a '
      "replica's batch (input.bucket_batch_limits[0]=128 x "
      'input.bucket_upper_bounds[0]=8)')
  # The paper-scale pipelined MoE: 9 (dense, MoE) pairs per stack on 2
  # stages, experts over each stage's 1,024 devices.
  task = config_check.Validate(model_registry.GetParams(
      'm4.MoE2048E36LPipelined', 'Train'))
  assert task.enc.pipeline.StageSplits() == [5, 4]
  assert task.enc.pipeline.params.body_annotations


def test_trainer_refuses_before_building(tmp_path):
  fv = trainer_testlib.ParseFlags(
      '--model=m4.MoE2048E36L', f'--logdir={tmp_path}',
      '--params_override=input.bucket_batch_limits=[1024,512,256]')
  with pytest.raises(config_check.ConfigCheckError) as e:
    trainer.Execute(fv, printer=lambda line: None)
  assert str(e.value) == (
      "input.bucket_batch_limits[0]=1024 must be divisible by mesh axis 'x' "
      'of size 2048 (the batch is split over it)')
  assert not list(tmp_path.iterdir())  # Nothing written.


def test_single_device_replicas_do_not_split_the_batch_over_the_mesh():
  """Mirrored / multi-worker replicas are single devices: the mesh is not
  partitioned there, so only the replica and group constraints apply."""
  params = _Tiny()
  config_check.Validate(params, num_replicas=16, spmd=False)
  params.task.moe_tpl.num_groups = 128
  assert _Error(params, num_replicas=16, spmd=False) == (
      'model/dec/layer_001/moe: num_groups=128 must divide the 64 tokens of '
      "a replica's batch (input.bucket_batch_limits[0]=128 / 16 replicas = 8 "
      'x input.bucket_upper_bounds[0]=8) (GShard §2.2: G equal groups)')


def test_heads_vs_their_split_axis():
  """Attention heads split over an 8-device mesh: 4 heads do not divide."""
  att = attention.MultiHeadAttention.Params().Set(
      name='atten', input_dim=16, num_heads=4, dim_per_head=8)
  for w in ('wq', 'wk', 'wv'):
    att.weight_split_dims_mapping.Set(**{w: [-1, 0, -1]})
  att.weight_split_dims_mapping.wo = [0, -1, -1]
  task = layer_task.LayerTask.Params().Set(
      name='task', layer=att, device_mesh=np.arange(8))
  params = base_model.SingleTaskModel.Params().Set(task=task)
  assert _Error(params) == (
      'task/layer/wk [16, 4, 8]: dim 1 = 4 must be divisible by mesh axis 0 '
      'of size 8 (the weight is split over it)')
  att.num_heads = 8
  config_check.Validate(params)
