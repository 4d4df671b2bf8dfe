"""The pipelined TransformerMTModel (GPipe): same loss and gradients as the
unpipelined model on the same weights, decoding on the pipelined weights,
the registered GPipe configs."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import hyperparams
from lingshard import model_registry
from lingshard.layers import pipeline
from lingshard.nested_map import NestedMap
from tests.models import mt_testlib

STACKS = ('enc', 'dec')


def _Params(num_stages=None, num_micro_batches=None, layers=(3, 4), **kw):
  # 3 + 4 layers: the encoder's cells are unequal (2 + 1 over 2 stages).
  p = mt_testlib.TinyParams(num_encoder_layers=layers[0],
                            num_decoder_layers=layers[1], **kw)
  if num_stages is not None:
    p.pipeline_tpl = pipeline.PipelinedLayer.Params().Set(
        num_stages=num_stages, num_micro_batches=num_micro_batches,
        remat=True)
  return p


def _Unpipelined(task, theta):
  """theta of the unpipelined model: per-layer thetas of each stack."""
  out = theta.DeepCopy()
  for stack in STACKS:
    s = out[stack]
    s.layer = getattr(task, stack).pipeline.LayerThetas(s.pop('pipeline'))
  return out


def _Stacked(layer, stacked_like, per_layer):
  """The stacked theta whose LayerThetas are `per_layer` (padded slots 0).

  LayerThetas selects one stacked element per per-layer element, so its
  transpose (the gradient of <LayerThetas(x), per_layer>) puts each layer's
  weights in its slot and zeros in the padded ones, whatever the layout.
  """
  leaves = stacked_like.Flatten()
  with tf.GradientTape() as tape:
    tape.watch(leaves)
    picked = NestedMap(x=layer.LayerThetas(stacked_like.Pack(leaves)))
    want = NestedMap(x=per_layer)
    total = tf.add_n([tf.reduce_sum(a * b) for a, b in
                      zip(picked.Flatten(), want.Flatten())])
  return stacked_like.Pack(tape.gradient(total, leaves))


def _Tensors(theta):
  return theta.Transform(tf.convert_to_tensor)


def _StepFn(task, step=3):
  """The train step's (loss, grads) as a tf.function (graph mode is
  faster); calls with same-shaped theta and batch reuse its trace."""

  def Step(th, b):
    metrics, _, grads = task.LossAndGradients(
        th, b, step=tf.constant(step, tf.int64))
    return metrics.loss[0], grads

  return tf.function(Step, autograph=False)


def _LossAndGrads(task, theta, batch, step_fn=None):
  """(loss, grads) of the train step (`step_fn`: a traced _StepFn(task))."""
  batch = batch.copy()
  batch.pop('lang', None)
  loss, grads = (step_fn or _StepFn(task))(theta, batch)
  return float(loss), grads


@pytest.fixture(scope='module')
def plain():
  """The unpipelined 3 + 4 layer reference and its step, traced once for
  both parametrizations below (each feeds it its own weights)."""
  task = _Params().Instantiate()
  return task, _StepFn(task)


@pytest.mark.parametrize('num_stages,num_micro_batches', [(1, 1), (2, 4)])
def test_pipelined_model_matches_unpipelined(num_stages, num_micro_batches,
                                             plain):
  piped = _Params(num_stages, num_micro_batches).Instantiate()
  plain, plain_step = plain
  batch = mt_testlib.SyntheticBatch(piped.params, batch_size=8, seed=1)
  theta = _Tensors(piped.theta)
  ref_theta = _Unpipelined(piped, theta)
  assert ref_theta.Transform(lambda t: t.shape).FlattenItems() == (
      plain.theta.Transform(lambda t: t.shape).FlattenItems())
  loss, grads = _LossAndGrads(piped, theta, batch)
  ref_loss, ref_grads = _LossAndGrads(plain, ref_theta, batch, plain_step)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  got = _Unpipelined(piped, grads).FlattenItems()
  want = ref_grads.FlattenItems()
  assert [k for k, _ in got] == [k for k, _ in want]
  for (name, g), (_, r) in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6, err_msg=name)


def test_pipelined_dropout_matches_one_stage_one_micro_batch():
  """Dropout masks are keyed by layer and example: any K, M and remat
  draw the masks of the K = 1, M = 1 run."""
  drop = dict(residual_dropout_prob=0.2, atten_dropout_prob=0.1,
              relu_dropout_prob=0.1)
  ref = _Params(1, 1, layers=(2, 2), **drop).Instantiate()
  piped = _Params(2, 2, layers=(2, 2), **drop).Instantiate()
  batch = mt_testlib.SyntheticBatch(piped.params, batch_size=8, seed=2)
  ref_loss, ref_grads = _LossAndGrads(ref, _Tensors(ref.theta), batch)
  theta = _Unpipelined(ref, _Tensors(ref.theta))
  # The same weights in the 2-stage layout.
  piped_theta = _Tensors(piped.theta)
  for stack in STACKS:
    piped_theta[stack].pipeline = _Stacked(
        getattr(piped, stack).pipeline, piped_theta[stack].pipeline,
        theta[stack].layer)
  loss, grads = _LossAndGrads(piped, piped_theta, batch)
  body = piped.dec.pipeline.body
  assert body.self_atten_dropout.active and body.ffn.dropout.active
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  got = _Unpipelined(piped, grads).FlattenItems()
  for (name, g), (_, r) in zip(got,
                               _Unpipelined(ref, ref_grads).FlattenItems()):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize('beam_size', [1, 3])
def test_decoding_runs_the_pipelined_weights_unpipelined(beam_size):
  piped_p = _Params(2, 2)
  piped = piped_p.Instantiate()
  plain = _Params().Instantiate()
  infer = type(piped).InferenceParams(piped_p).Instantiate()
  plain_infer = type(plain).InferenceParams(plain.params).Instantiate()
  batch = mt_testlib.SyntheticBatch(piped.params, batch_size=2, seed=4)
  theta = _Tensors(piped.theta)
  kw = dict(beam_size=beam_size, max_decode_len=6)
  got = infer.Decode(theta, batch.src.ids, batch.src.paddings, **kw)
  want = plain_infer.Decode(_Unpipelined(piped, theta), batch.src.ids,
                            batch.src.paddings, **kw)
  np.testing.assert_array_equal(got.ids, want.ids)
  np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5)
  assert got.ids.shape == (2, 6)


def test_moe_in_a_pipelined_model_routes_as_one_stage_one_micro_batch():
  """GShard in GPipe at the model level: MoE every other layer, groups of
  S = 6 tokens (one source row), GShard's random second expert, capacity
  that drops and dropout on: K = 2, M = 2 gives the K = 1, M = 1 loss and
  gradients (tests/layers/test_pipeline_moe.py: the plain loop and every
  routing decision). Groups must be given by size (one line)."""
  kw = dict(layers=(2, 2), use_moe=True, residual_dropout_prob=0.2)
  with pytest.raises(ValueError, match=(
      r'^enc: num_stages 2 exceeds the 1 pipeline bodies of 2 layers \(the '
      r'MoE pattern repeats every 2 layers\); use at most 1 stages$')):
    _Params(2, 2, **kw).Instantiate()
  kw['layers'] = (4, 4)
  p = _Params(2, 2, **kw)
  with pytest.raises(ValueError, match=(
      r"^enc: a pipelined MoE stack needs moe_tpl.group_size \(tokens per "
      r"group\); num_groups 1 would count a micro-batch's groups$")):
    p.Instantiate()

  def Params(k, m):
    p = _Params(k, m, **kw)
    p.moe_tpl.Set(num_groups=None, group_size=6, expert_capacity=None,
                  capacity_factor=0.5, second_expert_policy='random')
    p.allow_noncausal_routing = True  # Drops on purpose (GShard's decoder).
    return p

  ref = Params(1, 1).Instantiate()
  piped = Params(2, 2).Instantiate()
  batch = mt_testlib.SyntheticBatch(piped.params, batch_size=8, src_len=6,
                                    tgt_len=6, seed=2)
  ref_loss, ref_grads = _LossAndGrads(ref, _Tensors(ref.theta), batch)
  theta = _Unpipelined(ref, _Tensors(ref.theta))
  piped_theta = _Tensors(piped.theta)  # The same weights, 2 stages.
  for stack in STACKS:
    piped_theta[stack].pipeline = _Stacked(
        getattr(piped, stack).pipeline, piped_theta[stack].pipeline,
        theta[stack].layer)
  loss, grads = _LossAndGrads(piped, piped_theta, batch)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  got = _Unpipelined(piped, grads).FlattenItems()
  want = _Unpipelined(ref, ref_grads).FlattenItems()
  assert [k for k, _ in got] == [k for k, _ in want]
  for (name, g), (_, r) in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6, err_msg=name)


GPIPE_KEYS = sorted(k for k in model_registry.ListModels()
                    if k.startswith('gpipe.'))


@pytest.mark.parametrize('key', GPIPE_KEYS)
def test_gpipe_params_text_round_trip(key):
  p = model_registry.GetParams(key, 'Train')
  q = model_registry.GetParams(key, 'Train')
  q.task.Set(name='perturbed')  # Every task has a name (image ones no model_dim).
  q.FromText(p.ToText())
  assert q == p
  if 'pipeline_tpl' in q.task:  # AmoebaNet's is unpipelined (no such param).
    assert isinstance(q.task.pipeline_tpl, (hyperparams.Params, type(None)))


def test_stages_only_mesh_keeps_the_batch_whole_and_only_shifts():
  """A 1-D mesh [K] is read as [1, K] (data axis of 1): the batch is not
  split over the stage axis, so forming micro-batches moves nothing and
  the step's only collectives are the stage shifts and all-reduces.
  (Parity: the layer on this mesh in test_pipeline.py, the model on 2 x 4
  by the README's spmd_check.)"""
  from lingshard.spmd import check  # pylint: disable=g-import-not-at-top
  p = _Params(4, 2, layers=(4, 4))
  p.device_mesh = np.arange(4)
  task = p.Instantiate()
  assert task.params.device_mesh.shape == (1, 4)
  enc = task.enc.pipeline.params
  assert (enc.stage_mesh_axis, enc.batch_mesh_axis) == (1, 0)
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=4, seed=2)
  r = check.CheckTask(task, batch, (4,), expect=[
      'has:collective-permute', 'only:collective-permute,all-reduce',
      r'no-all-gather:\.pipeline\.'], compare=False)
  assert r.ok, r.Report()
