"""The circular schedule (pipeline_schedule.Circular, R = 2 chunks per
stage): the same loss, aux and gradients as the unpipelined stack over the
same weights, unrolled and as while loops, with and without remat; each
stage keeps its own chunks; an MoE stack routes every token as
unpipelined (groups spanning rows, random second expert, dropout, tokens
dropped); bad configs are one line."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import dropout
from lingshard.layers import pipeline
from lingshard.layers import pipeline_schedule
from lingshard.layers import transformer
from lingshard.layers.moe import top2
from lingshard.spmd import check
from tests.layers import pipeline_testlib

_B, _T, _D = 8, 3, 4
_STEP = 7


def _Circular(repeats=2):
  return pipeline_schedule.Circular.Params().Set(repeats=repeats)


def _Layer(num_layers, num_stages, num_micro_batches, remat, loop=True,
           **kwargs):
  return pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=num_layers, num_stages=num_stages,
      num_micro_batches=num_micro_batches, remat=remat, loop=loop,
      schedule=_Circular(), body_tpl=pipeline_testlib.MlpBody.Params().Set(
          dim=_D, dropout_prob=0.3), **kwargs).Instantiate()


def _Inputs():
  rng = np.random.RandomState(2)
  return (rng.normal(size=[_B, _T, _D]).astype(np.float32),
          (rng.rand(_B, _T) < 0.25).astype(np.float32),
          rng.normal(size=[_B, _D]).astype(np.float32),
          rng.normal(size=[_B, _T, _D]).astype(np.float32))


def _LossAndGrads(layer, pipelined):
  """(loss, per-layer gradients) of the pipeline or of its layers one
  after another on the whole batch (FPropUnpipelined: same keys)."""
  x, pad, ctx, cot = _Inputs()
  fprop = layer.FProp if pipelined else layer.FPropUnpipelined

  @tf.function(autograph=False)
  def Fn():
    with tf.GradientTape() as tape:
      y, aux = fprop(layer.theta, x, pad, ctx, step=tf.constant(_STEP))
      loss = tf.reduce_sum(y * cot) + aux.aux_loss + aux.metrics.h_mean
    return loss, tape.gradient(loss, layer.theta)

  loss, grads = Fn()
  return loss.numpy(), layer.LayerThetas(grads)


def _AssertGradsEqual(got, want):
  errors = [check.Compare(f'{i}.{key}', w.numpy(), g.numpy(), rtol=1e-5,
                          atol=0.0)
            for i, (g_layer, w_layer) in enumerate(zip(got, want))
            for (key, w), g in zip(w_layer.FlattenItems(), g_layer.Flatten())]
  assert len(errors) == 4 * len(want)
  assert all(e.ok for e in errors), [e for e in errors if not e.ok]


@pytest.mark.parametrize('num_layers,num_stages,num_micro_batches,remat,loop',
                         [(8, 2, 4, True, True), (8, 2, 2, True, False),
                          (5, 2, 4, True, True), (4, 2, 2, False, False)])
def test_circular_equals_the_unpipelined_stack(
    num_layers, num_stages, num_micro_batches, remat, loop):
  layer = _Layer(num_layers, num_stages, num_micro_batches, remat, loop)
  loss, grads = _LossAndGrads(layer, True)
  want_loss, want_grads = _LossAndGrads(layer, False)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  _AssertGradsEqual(grads, want_grads)


def test_each_stage_holds_chunks_k_and_k_plus_num_stages():
  layer = _Layer(8, 2, 4, True)
  # Chunks of 2 layers: stage 0 holds chunks 0 and 2, stage 1 chunks 1, 3.
  np.testing.assert_array_equal(layer.stack.layer_ids,
                                [[0, 1, 4, 5], [2, 3, 6, 7]])
  assert layer.theta.fc.w.shape == (2, 4, _D, 8)
  assert layer.StageSplits() == [4, 4] and layer.ChunkSplits() == [2] * 4
  # Uneven: 5 layers in 4 chunks by cost, shorter chunks padded.
  layer = _Layer(5, 2, 4, True)
  assert layer.ChunkSplits() == [2, 1, 1, 1]
  np.testing.assert_array_equal(layer.stack.active, [[1, 1, 1, 0],
                                                     [1, 0, 1, 0]])
  np.testing.assert_array_equal(layer.stack.layer_ids[layer.stack.active > 0],
                                [0, 1, 3, 2, 4])
  tables = pipeline_schedule.Tables(layer.schedule, 4, 2)
  assert tables.n == 2 * 4 + 2 - 1  # Bubble 1/9 (fill-drain: 1/5).
  np.testing.assert_array_equal(tables.outputs, [5, 6, 7, 8])


def test_bad_circular_configs_are_one_line_errors():
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: the circular schedule cuts num_layers 3 into num_stages x '
      r'repeats = 2 x 2 = 4 chunks; use at least 4 layers or fewer '
      r'repeats$')):
    _Layer(3, 2, 4, True)
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: the circular schedule needs at least num_stages 4 '
      r'micro-batches \(a micro-batch re-enters stage 0 after leaving the '
      r'last\), got 2$')):
    _Layer(8, 4, 2, True)
  layer = _Layer(8, 4, None, True, micro_batch_size=4)
  x, pad, ctx, _ = _Inputs()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: the circular schedule needs at least num_stages 4 '
      r'micro-batches .*, got 2$')):
    layer.FProp(layer.theta, x, pad, ctx)
  p = pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=8, num_stages=2, num_micro_batches=2,
      schedule=_Circular(0), body_tpl=pipeline_testlib.MlpBody.Params())
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: schedule.repeats must be an int >= 1, got 0$')):
    p.Instantiate()
  assert ('schedule.cls : type/lingshard.layers.pipeline_schedule/Circular'
          in p.ToText())
  assert 'schedule.repeats : 0' in p.ToText()


# MoE: 8 Transformer layers (4 bodies of a dense + an MoE layer), K = 2,
# R = 2, M = 4; groups of 8 tokens span two rows of 4 (S > T).
_MB, _MT, _MM, _E, _S = 16, 4, 8, 4, 8
_OFFSET = 1000


def _MoeStack(remat):
  moe = top2.MoELayer.Params().Set(
      num_experts=_E, group_size=_S, capacity_factor=0.5,
      second_expert_policy='random', dispatch_impl='einsum')
  return transformer.TransformerStack.Params().Set(
      name='stack', model_dim=_MM, hidden_dim=16, num_heads=2,
      dim_per_head=4, num_layers=8, moe_tpl=moe, residual_dropout_prob=0.2,
      atten_dropout_prob=0.2, relu_dropout_prob=0.2,
      pipeline_tpl=pipeline.PipelinedLayer.Params().Set(
          num_stages=2, num_micro_batches=4, remat=remat,
          schedule=_Circular())).Instantiate()


def _MoeRun(stack, pipelined):
  """(loss, aux, gradients): the pipelined stack, or every Transformer
  layer in turn on the whole batch (dropout / routing key: body l // 2)."""
  rng = np.random.RandomState(0)
  x = rng.normal(size=[_MB, _MT, _MM]).astype(np.float32)
  pad = np.zeros([_MB, _MT], np.float32)
  pad[:, -1] = rng.rand(_MB) < 0.5
  cot = rng.normal(size=[_MB, _MT, _MM]).astype(np.float32)
  step = tf.constant(_STEP, tf.int64)
  with tf.GradientTape() as tape:
    if pipelined:
      y, aux = stack.FProp(stack.theta, x, pad, step=step,
                           token_offset=tf.constant(_OFFSET, tf.int64))
    else:
      h, aux = tf.constant(x), {}
      for i, (layer, lt) in enumerate(stack.Layers(stack.theta)):
        with dropout.KeyedMasks(i // 2, 0):
          h, layer_aux = layer.FProp(lt, h, pad, step=step,
                                     token_offset=_OFFSET)
        if layer_aux:
          aux[f'layer_{i:03d}'] = layer_aux
      y = stack.final_ln.FProp(stack.theta.final_ln, h)
    loss = tf.reduce_sum(y * cot) + tf.add_n(
        [a.aux_loss for a in aux.values()])
  return loss, aux, tape.gradient(loss, stack.theta)


def test_circular_moe_stack_equals_the_unpipelined_loop():
  stack = _MoeStack(remat=True)
  (loss, aux, grads), (want_loss, want_aux, want_grads) = tf.function(
      lambda: (_MoeRun(stack, True), _MoeRun(stack, False)),
      autograph=False)()
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  assert sorted(aux) == sorted(want_aux) == [
      'layer_001', 'layer_003', 'layer_005', 'layer_007']
  for key in want_aux:
    np.testing.assert_allclose(aux[key].aux_loss, want_aux[key].aux_loss,
                               rtol=1e-5, err_msg=key)
    assert 0 < float(want_aux[key].metrics.over_capacity_first) < 1
    assert 0 < float(want_aux[key].metrics.random_accept_rate) < 1
  errors = [check.Compare(name, np.asarray(want), np.asarray(got), rtol=1e-5,
                          atol=0.0)
            for (name, want), got in zip(want_grads.FlattenItems(),
                                         grads.Flatten())]
  assert len(errors) > 20 and all(e.ok for e in errors), [
      e for e in errors if not e.ok]


def test_circular_routes_every_token_as_unpipelined(monkeypatch):
  """Eager, remat off: each Route call is seen."""
  stack = _MoeStack(remat=False)
  calls, route = [], top2.MoELayer.Route

  def Tapped(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    out = route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity)
    if nonpad_gs.numpy().any():  # Bubble stages are all padding.
      r = out[0]
      calls.append((int(dropout.LayerIndex()), token_gs.numpy(),
                    r.expert_gsk.numpy(), r.position_gsk.numpy(),
                    r.dispatched_gsk.numpy()))
    return out

  monkeypatch.setattr(top2.MoELayer, 'Route', Tapped)
  decisions = []
  for pipelined in (True, False):
    calls.clear()
    _MoeRun(stack, pipelined)
    out = {}
    for layer, token_gs, expert, position, dispatched in calls:
      for (g, s, k), e in np.ndenumerate(expert):
        key = (layer, int(token_gs[g, s]), k)
        assert key not in out, key  # Each token routed once per layer.
        out[key] = (int(e), int(position[g, s, k]),
                    bool(dispatched[g, s, k]))
    decisions.append(out)
  assert len(decisions[1]) == 4 * _MB * _MT * 2  # 4 MoE layers, 2 choices.
  assert decisions[0] == decisions[1]
