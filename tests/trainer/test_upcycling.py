"""Sparse upcycling (Komatsuzaki et al. 2023) and Lingvo's
init_from_checkpoint_rules (lingshard/train/init_rules.py) through the
trainer, on m4.TinyDense / m4.TinyMoEUpcycled shrunk to 1 + 1 layers of
M = H = 32 (every FFN of the MoE an MoE layer of 8 experts).

A dense run with the FFN hidden of the experts trains 2 steps; the upcycled
MoE built from its logdir has every expert's wi / bi / wo / bo equal to the
dense layer's fc_in / fc_out weights, every non-FFN weight equal, and a
fresh router. It then computes the dense model's logits: an MoE layer's
output is sum_k gate_k * expert_k(x) with every expert the dense FFN, so
it equals the dense FFN whenever each token's combine weights sum to 1.
GShard top-2 normalises g1, g2 by g1 + g2 (Algorithm 1 lines 6, 16), so
they do when both choices are dispatched: with dropless capacity
(capacity_factor / eval_capacity_factor None: C = S, no token dropped) and
- inference (eval / decode) mode, where the `random` second-expert policy
  of the config becomes `all` (MoELayer.ForInference), or
- training mode with second_expert_policy='all' (the config's `random`
  policy would drop some second choices, leaving a weight g1 < 1).
The logits of real target tokens then agree to float32 rounding (the two
normalised gates sum to 1 within an ulp). Padding is never dispatched (an
MoE layer outputs 0 there, the dense FFN computes it), and no real token
depends on it (attention masks padded keys; targets are padded at the end),
so padded positions are left out of the comparison.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from lingshard import base_input
from lingshard import trainer
from lingshard.train import checkpointer
from lingshard.train import init_rules
from lingshard.train import state as state_lib
from lingshard.train import train_loop
from tests.trainer import trainer_testlib

DENSE = 'm4.TinyDense'
UPCYCLED = 'm4.TinyMoEUpcycled'
SMALL = ('task.num_encoder_layers=1;task.num_decoder_layers=1;'
         'task.model_dim=32;task.hidden_dim=32;task.num_heads=2;'
         'task.dim_per_head=16')
MOE = ('task.encoder_moe_layers=[0];task.decoder_moe_layers=[0];'
       'task.moe_tpl.capacity_factor=None;'
       'task.moe_tpl.eval_capacity_factor=None')
FFN = {'wi': 'fc_in/w', 'bi': 'fc_in/b', 'wo': 'fc_out/w', 'bo': 'fc_out/b'}


def _Input(prepared_dir):
  return ';'.join(trainer_testlib.CorpusOverrides(prepared_dir, 16, 8))


def _Params(model, logdir, overrides, *flags):
  cfg = trainer_testlib.ParseFlags(f'--model={model}', f'--logdir={logdir}',
                                   f'--params_override={overrides}', *flags)
  return trainer.BuildParams(cfg)[0]


def _Values(variables):
  return {name: v.numpy() for name, v in variables.items()}


@pytest.fixture(scope='module')
def dense(prepared_dir, tmp_path_factory):
  """(logdir, params, {weight path: value}) of a dense run of 2 steps."""
  logdir = str(tmp_path_factory.mktemp('dense'))
  overrides = f'{_Input(prepared_dir)};{SMALL}'
  trainer.Execute(trainer_testlib.ParseFlags(
      f'--model={DENSE}', f'--logdir={logdir}', '--max_steps=2',
      f'--params_override={overrides}'), printer=lambda _: None)
  path = checkpointer.ReadState(os.path.join(logdir, 'train'))
  assert path.endswith('ckpt-2')
  reader = tf.train.load_checkpoint(path)
  prefix, suffix = 'theta/', '/.ATTRIBUTES/VARIABLE_VALUE'
  values = {k[len(prefix):-len(suffix)]: reader.get_tensor(k)
            for k in reader.get_variable_to_shape_map()
            if k.startswith(prefix) and k.endswith(suffix)}
  return logdir, _Params(DENSE, logdir, overrides), values


@pytest.fixture(scope='module')
def upcycled(prepared_dir, dense, tmp_path_factory):
  """The upcycled MoE trainer at step 0 (rules applied by Restore)."""
  logdir = str(tmp_path_factory.mktemp('upcycled'))
  params = _Params(UPCYCLED, logdir,
                   f'{_Input(prepared_dir)};{SMALL};{MOE}')
  run = train_loop.Trainer(params, logdir, init_from_checkpoint=dense[0],
                           printer=lambda _: None)
  fresh = _Values(run.state.ThetaByPath())
  assert run.Restore() == 0
  return run, fresh


def test_every_expert_is_the_dense_ffn(dense, upcycled):
  _, _, values = dense
  run, fresh = upcycled
  theta = _Values(run.state.ThetaByPath())
  moe = sorted({n.rsplit('/moe/', 1)[0] for n in theta if '/moe/' in n})
  assert moe == ['model/dec/layer_000', 'model/enc/layer_000']
  for layer in moe:
    for name, ffn in FFN.items():
      got = theta[f'{layer}/moe/{name}']
      want = values[f'{layer}/ffn/{ffn}']
      assert got.shape == (8,) + want.shape
      for e in range(8):
        assert np.array_equal(got[e], want), (layer, name, e)
    # The router keeps its fresh init (no dense counterpart).
    assert np.array_equal(theta[f'{layer}/moe/wg'], fresh[f'{layer}/moe/wg'])
  others = [n for n in theta if '/moe/' not in n]
  assert len(others) > 20
  for name in others:
    assert np.array_equal(theta[name], values[name]), name
  # Only weights were loaded: optimizer slots fresh, step 0.
  assert int(run.state.step.numpy()) == 0
  assert all(not np.any(v) for v in _Values(run.state.SlotsByPath()).values())


def _Logits(task_params, theta, batch):
  task = task_params.Instantiate()
  return task.ComputePredictions(theta, batch, step=tf.constant(
      0, tf.int64)).logits.numpy()


def test_upcycled_moe_computes_the_dense_logits(dense, upcycled):
  _, dense_params, _ = dense
  run, _ = upcycled
  batch = base_input.NumericBatch(next(iter(run.model.GetInput()
                                            .GetDataset())))
  # The dense checkpoint's model, restored as eval / decode restore it.
  dense_task = dense_params.task.Instantiate()
  state = state_lib.TrainState(dense_task)
  ckpt = checkpointer.Checkpointer(os.path.join(dense[0], 'train'), state,
                                   include_optimizer=False)
  assert ckpt.Restore()[0] == 2
  dense_theta = state.theta.Transform(lambda v: v.read_value())
  moe_theta = run.ThetaValues()
  for inference in (True, False):
    dp, mp = dense_params.task, run.params.task
    if inference:
      dp, mp = dp.cls.InferenceParams(dp), mp.cls.InferenceParams(mp)
      assert mp.moe_tpl.second_expert_policy == 'all'
    else:
      # The config's `random` policy drops some second choices: not exact.
      assert mp.moe_tpl.second_expert_policy == 'random'
      dropped = _Logits(mp, moe_theta, batch)
      mp = mp.Copy()
      mp.moe_tpl.second_expert_policy = 'all'
    want = _Logits(dp, dense_theta, batch)
    got = _Logits(mp, moe_theta, batch)
    real = batch.tgt.paddings.numpy() == 0
    # rtol 1e-5, and 1e-5 of the largest logit for logits near zero.
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
  assert np.abs(dropped - want)[real].max() > 1e-2


def test_expert_count_changes_by_repeating_experts(prepared_dir, upcycled,
                                                   tmp_path):
  """An 8-expert checkpoint initialises a 16-expert model: target expert e
  is source expert e // 2 (each repeated twice); the router is ignored (its
  expert dim is not leading: [M, E])."""
  run, _ = upcycled
  source = str(tmp_path / 'moe8')
  checkpointer.Checkpointer(source, run.state).Save(0)
  rules = f"{{'{source}': ([('(.*)', '%s')], ['.*/moe/wg'])}}"
  params = _Params('m4.TinyMoE', tmp_path / 'moe16',
                   f'{_Input(prepared_dir)};{SMALL};{MOE};'
                   'task.moe_tpl.num_experts=16;task.moe_tpl.use_bias=True;'
                   f'task.train.init_from_checkpoint_rules={rules}')
  task = params.task.Instantiate()
  state = state_lib.TrainState(task)
  loaded = init_rules.Rules(params.task.train.init_from_checkpoint_rules
                            ).Apply(state.ThetaByPath(),
                                    init_rules.ExpertWeights(task))
  assert len(loaded) == len(state.ThetaByPath()) - 2  # All but 2 routers.
  # The source's experts are all the dense FFN (upcycled), so whichever of
  # the 16 experts its fresh router picks, the loaded model computes the
  # 8-expert model's logits (dropless, both choices kept): every expert
  # weight and bias of all 16 was loaded.
  batch = base_input.NumericBatch(next(iter(run.model.GetInput()
                                            .GetDataset())))
  real = batch.tgt.paddings.numpy() == 0
  for inference in (True, False):
    sp, tp = run.params.task, params.task
    if inference:
      sp, tp = sp.cls.InferenceParams(sp), tp.cls.InferenceParams(tp)
    else:
      sp, tp = sp.Copy(), tp.Copy()
      sp.moe_tpl.second_expert_policy = 'all'
      tp.moe_tpl.second_expert_policy = 'all'
    want = _Logits(sp, run.ThetaValues(), batch)
    got = _Logits(tp, state.theta.Transform(lambda v: v.read_value()), batch)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
  want = _Values(run.state.ThetaByPath())
  got = _Values(state.ThetaByPath())
  for name in ('wi', 'wo', 'bi', 'bo'):
    path = f'model/enc/layer_000/moe/{name}'
    assert got[path].shape[0] == 16
    for e in range(16):
      assert np.array_equal(got[path][e], want[path][e // 2]), (name, e)


def test_expert_counts_that_do_not_divide_are_one_line():
  with pytest.raises(ValueError) as e:
    init_rules.LoadedValue(np.zeros([8, 4, 5]), [12, 4, 5], num_experts=12)
  assert str(e.value) == ("12 experts are not a multiple of the checkpoint's "
                          '8 (each expert is repeated E / E1 times)')
  # A weight that is not an expert weight loads its own shape only.
  with pytest.raises(ValueError) as e:
    init_rules.LoadedValue(np.zeros([4, 5]), [8, 4, 5])
  assert str(e.value).startswith('the shapes differ (only an expert weight')
  tiled = init_rules.LoadedValue(np.arange(6.0).reshape(2, 3), [4, 2, 3], 4)
  assert np.array_equal(tiled, np.broadcast_to(np.arange(6.0).reshape(2, 3),
                                               [4, 2, 3]))


def _ApplyError(prepared_dir, dense, tmp_path, rules, require_all=False):
  params = _Params('m4.TinyMoE', tmp_path,
                   f'{_Input(prepared_dir)};{SMALL};{MOE}')
  task = params.task.Instantiate()
  state = state_lib.TrainState(task)
  with pytest.raises(init_rules.InitRulesError) as e:
    init_rules.Rules({dense[0]: rules}, require_all).Apply(
        state.ThetaByPath(), init_rules.ExpertWeights(task))
  return str(e.value)


def test_bad_rules_are_one_line(prepared_dir, dense, tmp_path):
  ckpt = checkpointer.ReadState(os.path.join(dense[0], 'train'))
  layer = 'model/dec/layer_000'
  assert _ApplyError(prepared_dir, dense, tmp_path,
                     ([('(.*)/moe/wi', '%s/ffn/wi')], [])) == (
      f"init_from_checkpoint_rules: '{layer}/moe/wi' loads "
      f"'{layer}/ffn/wi' (rule ('(.*)/moe/wi', '%s/ffn/wi')), which is not "
      f'in checkpoint {ckpt}')
  assert _ApplyError(prepared_dir, dense, tmp_path,
                     ([('(.*)/moe/wg', '%s/ffn/fc_in/w')], [])) == (
      f"init_from_checkpoint_rules: cannot load '{layer}/moe/wg' [32, 8] "
      f"from '{layer}/ffn/fc_in/w' [32, 32] of checkpoint {ckpt}: the shapes "
      'differ (only an expert weight [E, ...] loads another shape: a dense '
      '[...] copied to every expert, or [E1, ...] with E a multiple of E1)')
  assert _ApplyError(prepared_dir, dense, tmp_path,
                     ([('(.*)/moe/wi', '%s/ffn/fc_in/w')], ['.*/moe/wg']),
                     require_all=True) == (
      "init_from_checkpoint_rules: 'model/dec/final_ln/bias' is loaded by no "
      'rule and ignored by none (init_from_checkpoint_require_all); add a '
      'rule or an ignore rule for it')
  with pytest.raises(init_rules.InitRulesError) as e:
    init_rules.Rules({'x': ([('(.*)', '%s')], '.*')})
  assert str(e.value) == (
      "init_from_checkpoint_rules: the value of 'x' must be ([(target regex, "
      'source format), ...], [ignore regex, ...])')


def test_upcycled_config_needs_its_dense_checkpoint(prepared_dir, tmp_path):
  """m4.TinyMoEUpcycled without --init_from_checkpoint: one line (a
  CheckpointError: the binary prints it and exits 1), before anything is
  written."""
  message = ("init_from_checkpoint_rules: the rules keyed '' load from "
             '--init_from_checkpoint, which is not set; pass '
             "--init_from_checkpoint=<the source run's logdir or a checkpoint "
             'prefix>')
  args = [f'--model={UPCYCLED}', f'--logdir={tmp_path}', '--max_steps=1',
          f'--params_override={_Input(prepared_dir)};{SMALL};{MOE}']
  with pytest.raises(checkpointer.CheckpointError) as e:
    trainer.Execute(trainer_testlib.ParseFlags(*args), printer=lambda _: None)
  assert str(e.value) == message
  assert os.listdir(tmp_path) == []
