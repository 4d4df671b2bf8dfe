"""The registered M4 configs: GShard Table 1 settings, text round trip, and
one train step of every CPU-sized config."""

import os

import numpy as np
import pytest
import tensorflow as tf

from lingshard import hyperparams
from lingshard import model_registry
from lingshard.data import inputs
from lingshard.params import m4
from lingshard.tools import count_params
from lingshard.train import step as step_lib
from tests.models import mt_testlib

TABLE1 = {  # key: (experts per layer, enc + dec layers)
    'm4.MoE128E12L': (128, 12), 'm4.MoE128E36L': (128, 36),
    'm4.MoE512E12L': (512, 12), 'm4.MoE512E36L': (512, 36),
    'm4.MoE2048E12L': (2048, 12), 'm4.MoE2048E36L': (2048, 36),
    'm4.MoE2048E60L': (2048, 60)}
M4_KEYS = sorted(k for k in model_registry.ListModels() if k.startswith('m4.'))


def test_every_table1_config_is_registered():
  assert set(TABLE1) <= set(M4_KEYS)
  assert {'m4.DenseT96L', 'm4.TinyMoE', 'm4.TinyDense'} <= set(M4_KEYS)


@pytest.mark.parametrize('key', sorted(TABLE1))
def test_table1_settings(key):
  experts, layers = TABLE1[key]
  p = model_registry.GetParams(key, 'Train')
  t = p.task
  assert (t.model_dim, t.hidden_dim, t.num_heads, t.dim_per_head) == (
      1024, 8192, 16, 128)
  assert (t.src_vocab_size, t.tgt_vocab_size) == (64000, 32000)
  assert t.num_encoder_layers == t.num_decoder_layers == layers // 2
  assert (t.input_dropout_prob, t.residual_dropout_prob,
          t.atten_dropout_prob) == (0.1, 0.1, 0.1)
  assert t.moe_tpl.num_experts == experts
  # GShard §2.2's k, applied once, by the MoE layer (the task has none).
  assert (t.moe_tpl.aux_loss_weights.group_aux == 0.01 and
          'aux_loss_weights' not in t)
  assert np.size(t.device_mesh) == experts  # One device per expert.
  assert (t.train.optimizer, t.train.learning_rate, t.train.lr_schedule,
          t.train.warmup_steps) == ('adafactor', 1.0, 'rsqrt_decay', 10000)
  # Experts total (Table 1 column) = E * L/2: every other layer is MoE.
  task = t.Instantiate()  # Declares weights only; allocates nothing.
  for stack in (task.enc, task.dec):
    moe_at = [i for i, layer in enumerate(stack.layer) if 'moe' in layer.children]
    assert moe_at == list(range(1, layers // 2, 2))
    for i in moe_at:
      assert stack.layer[i].moe.params.num_experts == experts
  assert sum(experts * len(s.layer) // 2 for s in (task.enc, task.dec)) == (
      experts * layers // 2)
  assert p.input.cls is inputs.MtInput
  assert p.input.file_pattern.startswith(m4.DATA_DIR)


@pytest.mark.parametrize('key', M4_KEYS)
def test_params_text_round_trip(key):
  p = model_registry.GetParams(key, 'Train')
  text = p.ToText()
  q = model_registry.GetParams(key, 'Train')
  q.task.Set(model_dim=1, train=q.task.train.Copy().Set(learning_rate=0.5))
  q.FromText(text)
  assert q == p
  assert isinstance(q.task.decode, hyperparams.Params)


# Every M4 config under 50M parameters (test_cpu_sized_configs): listed,
# not counted at import, so each xdist worker's collection skips ~3.6 CPU s
# of counting the Table 1 models.
CPU_KEYS = ['m4.TinyDense', 'm4.TinyDenseLarge', 'm4.TinyMoE',
            'm4.TinyMoE12L', 'm4.TinyMoE16E', 'm4.TinyMoE32E',
            'm4.TinyMoE4E', 'm4.TinyMoELarge', 'm4.TinyMoEShared',
            'm4.TinyMoEUpcycled']


def test_cpu_sized_configs():
  assert [k for k in M4_KEYS
          if count_params.CountModel(k).total < 50_000_000] == CPU_KEYS


# The *Large configs are TinyMoE / TinyDense reading the large corpus.
LARGE = {'m4.TinyMoELarge': 'm4.TinyMoE', 'm4.TinyDenseLarge': 'm4.TinyDense'}


@pytest.mark.parametrize('key', sorted(LARGE))
def test_large_configs_are_the_tiny_models_on_the_large_corpus(key):
  for dataset, split in (('Train', 'train'), ('Dev', 'dev_unseen_en'),
                         ('Test', 'test_unseen_en')):
    p = model_registry.GetParams(key, dataset)
    base = model_registry.GetParams(LARGE[key], dataset)
    assert p.task == base.task
    vocab = os.path.join(m4.LARGE_DATA_DIR, 'vocab', 'spm_shared.model')
    assert p.input == base.input.Copy().Set(
        file_pattern=os.path.join(m4.LARGE_DATA_DIR, f'{split}.tsv'),
        src_vocab=vocab, tgt_vocab=vocab)


@pytest.mark.parametrize('key,experts,layers', [
    ('m4.TinyMoE4E', 4, 4), ('m4.TinyMoE', 8, 4), ('m4.TinyMoE16E', 16, 4),
    ('m4.TinyMoE32E', 32, 4), ('m4.TinyMoE12L', 8, 12)])
def test_tiny_moe_variants_differ_only_in_experts_and_depth(key, experts,
                                                            layers):
  # The evidence page's arms: the same experts (hidden 256, top-2), 8
  # groups, so forward matmul FLOPs per token match TinyDense's up to the
  # gate's M * E per MoE layer (and 12L's extra layers).
  p = model_registry.GetParams(key, 'Train').task
  assert p.moe_tpl.num_experts == experts
  assert p.moe_tpl.num_groups == 8 and p.hidden_dim == 256
  assert p.num_encoder_layers + p.num_decoder_layers == layers
  flops = count_params.CountModel(key).flops_per_token
  dense = count_params.CountModel('m4.TinyDense').flops_per_token
  if layers == 4:
    gate_extra = 2 * 2 * p.model_dim * (experts - 8)  # 2 MoE layers.
    assert flops - dense == gate_extra
  else:
    assert flops > 2 * dense


# m4.TinyMoEUpcycled is m4.TinyMoE plus expert biases (their step: tests/
# layers/moe/test_moe_layer.py) and a dense checkpoint to start from
# (tests/trainer/test_upcycling.py): no step of its own here, nor for the
# *Large configs (the same models as TinyMoE / TinyDense).
STEP_KEYS = [k for k in CPU_KEYS
             if k != 'm4.TinyMoEUpcycled' and k not in LARGE]


@pytest.mark.parametrize('key', STEP_KEYS)
def test_cpu_sized_config_runs_one_train_step(key):
  model = model_registry.GetParams(key, 'Train').Instantiate()
  task = model.task
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=8, src_len=8,
                                    tgt_len=8)
  step_fn = step_lib.TrainStep(task)
  theta = task.theta.Transform(tf.convert_to_tensor)
  new_theta, _, metrics = step_fn(theta, step_fn.InitOptState(theta), batch,
                                  tf.constant(0, tf.int64))
  assert float(metrics.is_finite[0]) == 1.0
  assert np.isfinite(float(metrics.loss[0]))
  changed = [float(tf.reduce_max(tf.abs(a - b))) > 0
             for a, b in zip(new_theta.Flatten(), theta.Flatten())]
  assert sum(changed) == len(changed), 'every weight gets an update'


@pytest.mark.parametrize('key', ['m4.TinyMoE', 'm4.MoE2048E36L'])
def test_mesh_propagates_and_every_weight_has_a_layout(key):
  task = model_registry.GetParams(key, 'Train').task.Instantiate()
  mesh = task.params.device_mesh
  assert task.params.mesh_axis_names == m4.MESH_AXIS_NAMES
  for layer in task.AllLayers():
    np.testing.assert_array_equal(layer.params.device_mesh, mesh)
    assert layer.params.mesh_axis_names == m4.MESH_AXIS_NAMES
  for name, wp in task.DeclaredWeights().FlattenItems():
    np.testing.assert_array_equal(wp.device_mesh, mesh)
    mapping = wp.tensor_split_dims_mapping
    if '.moe.' in name and name.rsplit('.', 1)[1] in ('wi', 'wo'):
      assert mapping == [0, -1, -1], name  # Experts split over the mesh.
    else:
      assert mapping == [-1] * len(wp.shape), name  # Replicated.
  # Attention and dense layers split their activations on the batch dim:
  # the logical 'batch' axis, mesh axis 0.
  layer = task.enc.layer[0]
  for child in (layer.self_atten, layer.ffn.fc_in, task.tgt_emb):
    assert child.params.batch_axes == 0
    for _, mapping in child.params.activation_split_dims_mapping:
      assert mapping[0] == 'batch' and set(mapping[1:]) == {-1}


def test_tiny_moe_loss_is_xent_plus_one_hundredth_of_the_gshard_aux():
  """M4's k = 0.01 (GShard §2.2) lives in the MoE layer params and is
  applied once: loss = xent + 0.01 * sum_l aux_l, as before the move."""
  task = model_registry.GetParams('m4.TinyMoE', 'Train').task.Instantiate()
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=8, src_len=8,
                                    tgt_len=8)
  metrics, _ = task.FProp(task.theta, batch, step=tf.constant(1, tf.int64))
  m = {k: float(v[0]) for k, v in metrics.items() if v[0].shape.rank == 0}
  group_aux = [v for k, v in m.items() if k.endswith('_group_aux')]
  assert len(group_aux) == 2 and min(group_aux) > 0.5  # enc, dec layer 1.
  np.testing.assert_allclose(m['aux_loss'], 0.01 * sum(group_aux), rtol=1e-6)
  np.testing.assert_allclose(m['loss'], m['xent'] + 0.01 * sum(group_aux),
                             rtol=1e-6)
