"""The circular schedule (pipeline_schedule.Circular, R = 2) with MoE
bodies: a pipelined Transformer stack of 4 (dense, MoE) bodies on 2 stages
equals the plain per-layer loop over the same weights (loss, every
gradient, each MoE layer's aux) and routes every token as it: the same
(layer, token, choice) -> (expert, slot, dispatched), with MoE groups
spanning two rows (S = 8 > T = 4), GShard's random second expert, dropout
on and capacity small enough that tokens drop."""

import numpy as np
import tensorflow as tf

from lingshard.layers import dropout
from lingshard.layers import pipeline
from lingshard.layers import pipeline_schedule
from lingshard.layers import transformer
from lingshard.layers.moe import top2
from lingshard.spmd import check

_STEP = 7


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
          schedule=pipeline_schedule.Circular.Params().Set(
              repeats=2))).Instantiate()


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
