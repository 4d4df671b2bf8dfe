"""GShard inside GPipe: a pipelined Transformer stack whose body holds a
dense + an MoE layer equals the plain per-layer loop over the same weights
on the whole batch: loss, every gradient, each MoE layer's aux and every
token's routing decision (expert, slot, dispatched), with GShard's random
second expert, dropout on and capacity small enough that tokens drop."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard.layers import base_layer
from lingshard.layers import dropout
from lingshard.layers import pipeline
from lingshard.layers import transformer
from lingshard.layers.moe import top2
from lingshard.spmd import check

_B, _T, _M, _E, _S = 16, 4, 8, 4, 4  # S: tokens per MoE group.
_STEP = 3
_OFFSET = 1000  # The batch's first global token (a replica's offset).


def _StackParams(num_stages, num_micro_batches, remat, is_decoder=False):
  moe = top2.MoELayer.Params().Set(
      num_experts=_E, group_size=_S, capacity_factor=0.5,
      second_expert_policy='random', dispatch_impl='einsum',
      **{'aux_loss_weights.group_aux': 0.5})
  return transformer.TransformerStack.Params().Set(
      name='stack', model_dim=_M, hidden_dim=16, num_heads=2, dim_per_head=4,
      num_layers=4, is_decoder=is_decoder, moe_tpl=moe,
      residual_dropout_prob=0.2, atten_dropout_prob=0.2,
      relu_dropout_prob=0.2,
      pipeline_tpl=pipeline.PipelinedLayer.Params().Set(
          num_stages=num_stages, num_micro_batches=num_micro_batches,
          remat=remat))


def _Inputs():
  rng = np.random.RandomState(0)
  x = rng.normal(size=[_B, _T, _M]).astype(np.float32)
  pad = np.zeros([_B, _T], np.float32)
  pad[:, -1] = rng.rand(_B) < 0.5  # Some padding, every group has tokens.
  enc = rng.normal(size=[_B, 3, _M]).astype(np.float32)
  enc_pad = np.zeros([_B, 3], np.float32)
  cot = rng.normal(size=[_B, _T, _M]).astype(np.float32)
  return x, pad, enc, enc_pad, cot


def _Objective(y, aux, cot):
  return tf.reduce_sum(y * cot) + tf.add_n([a.aux_loss for a in aux.values()])


def _Pipelined(stack):
  x, pad, enc, enc_pad, cot = _Inputs()
  extras = (enc, enc_pad) if stack.params.is_decoder else (None, None)
  with tf.GradientTape() as tape:
    y, aux = stack.FProp(stack.theta, x, pad, *extras,
                         step=tf.constant(_STEP, tf.int64),
                         token_offset=tf.constant(_OFFSET, tf.int64))
    loss = _Objective(y, aux, cot)
  return loss, aux, tape.gradient(loss, stack.theta)


def _PlainLoop(stack):
  """Every Transformer layer in turn on the whole batch (no pipeline
  code): the pipeline's dropout/routing key is its body index, l // 2."""
  x, pad, enc, enc_pad, cot = _Inputs()
  if not stack.params.is_decoder:
    enc = enc_pad = None
  with tf.GradientTape() as tape:
    h, aux = tf.constant(x), {}
    for i, (layer, lt) in enumerate(stack.Layers(stack.theta)):
      with dropout.KeyedMasks(i // 2, 0):
        h, layer_aux = layer.FProp(lt, h, pad, enc, enc_pad,
                                   step=tf.constant(_STEP, tf.int64),
                                   token_offset=_OFFSET)
      if layer_aux:
        aux[f'layer_{i:03d}'] = layer_aux
    y = stack.final_ln.FProp(stack.theta.final_ln, h)
    loss = _Objective(y, aux, cot)
  return loss, aux, tape.gradient(loss, stack.theta)


# Routing metrics a pipeline combines exactly (moe/metrics.CombineParts).
_EXACT_METRICS = (
    'num_tokens', 'importance', 'load', 'cv_importance', 'cv_load',
    'max_over_mean_load', 'tokens_per_expert_first', 'tokens_per_expert_all',
    'dispatched_per_expert', 'tokens_with_n_experts', 'frac_dispatched_0',
    'frac_dispatched_1', 'frac_dispatched_2', 'over_capacity_first',
    'drop_frac_by_expert', 'random_accept_rate', 'capacity')


@pytest.mark.parametrize('num_stages,num_micro_batches,remat,is_decoder', [
    (2, 4, True, False), (2, 2, False, True)])
def test_pipelined_moe_stack_equals_the_plain_loop(
    num_stages, num_micro_batches, remat, is_decoder):
  stack = _StackParams(num_stages, num_micro_batches, remat,
                       is_decoder).Instantiate()
  assert stack.pipeline.params.num_layers == 2  # Two (dense, MoE) bodies.

  loss, aux, grads = tf.function(lambda: _Pipelined(stack),
                                 autograph=False)()
  # The reference runs eagerly: the same ops (counter-based draws are the
  # same inside or outside tf.function) without the cost of tracing them.
  want_loss, want_aux, want_grads = _PlainLoop(stack)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  # Per MoE layer, as the unpipelined stack names them.
  assert sorted(aux) == sorted(want_aux) == ['layer_001', 'layer_003']
  for key in want_aux:
    np.testing.assert_allclose(aux[key].aux_loss, want_aux[key].aux_loss,
                               rtol=1e-5, err_msg=key)
    got_metrics = aux[key].metrics
    assert sorted(got_metrics) == sorted(want_aux[key].metrics)
    for name in _EXACT_METRICS:
      np.testing.assert_allclose(got_metrics[name], want_aux[key].metrics[name],
                                 rtol=1e-5, atol=1e-6, err_msg=name)
  assert len(want_grads.Flatten()) > 20
  # rtol 1e-5 of the largest entry (check.Compare): summation orders differ.
  errors = [check.Compare(name, np.asarray(want), np.asarray(got), rtol=1e-5,
                          atol=0.0)
            for (name, want), got in zip(want_grads.FlattenItems(),
                                         grads.Flatten())]
  assert all(e.ok for e in errors), [e for e in errors if not e.ok]
  # Tokens were dropped (capacity 0.5) and the second expert was random.
  for key in want_aux:
    assert 0 < float(want_aux[key].metrics.over_capacity_first) < 1
    assert 0 < float(want_aux[key].metrics.random_accept_rate) < 1


def _TapRoutes(monkeypatch):
  """Records every Route call's (layer key, rows, nonpad, routing)."""
  calls = []
  route = top2.MoELayer.Route

  def Tapped(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity):
    out = route(self, theta, x_gsm, nonpad_gs, token_gs, step, capacity)
    r = out[0]
    calls.append((int(dropout.LayerIndex()), token_gs.numpy(),
                  nonpad_gs.numpy(), r.expert_gsk.numpy(),
                  r.position_gsk.numpy(), r.dispatched_gsk.numpy()))
    return out

  monkeypatch.setattr(top2.MoELayer, 'Route', Tapped)
  return calls


def _Decisions(calls):
  """{(layer key, global token, choice): (expert, slot, dispatched)} of
  the routings over real micro-batches (bubble stages are all padding)."""
  out = {}
  for layer, token_gs, nonpad_gs, expert, position, dispatched in calls:
    if not nonpad_gs.any():
      continue
    for (g, s, k), e in np.ndenumerate(expert):
      key = (layer, int(token_gs[g, s]), k)
      assert key not in out, key  # Each token routed once per layer.
      out[key] = (int(e), int(position[g, s, k]), bool(dispatched[g, s, k]))
  return out


def test_every_routing_decision_is_the_unpipelined_ones(monkeypatch):
  """Eager, remat off (the stages run as Python calls, so each Route is
  seen): 2 stages x 4 micro-batches."""
  stack = _StackParams(2, 4, False).Instantiate()
  calls = _TapRoutes(monkeypatch)
  _Pipelined(stack)
  got = _Decisions(calls)
  # M + K - 1 = 5 iterations x 2 stages: 8 real micro-batches and 2 bubble
  # stages, whose micro-batch is all padding and dispatches nothing.
  bubbles = [c for c in calls if not c[2].any()]
  assert len(calls) == 10 and len(bubbles) == 2
  assert not any(c[5].any() for c in bubbles)
  calls.clear()
  _PlainLoop(stack)
  want = _Decisions(calls)
  # 2 MoE layers x B*T tokens x 2 choices, each decided exactly once.
  assert len(want) == 2 * _B * _T * 2
  assert got == want
  dispatched = np.array([d for _, _, d in want.values()])
  assert 0 < dispatched.sum() < dispatched.size


def test_bad_pipelined_moe_configs_are_one_line_errors():
  stack = _StackParams(2, 4, False).Instantiate()
  x, pad, *_ = _Inputs()
  with pytest.raises(ValueError) as e:
    stack.FProp(stack.theta, x[:8, :3], pad[:8, :3])
  assert str(e.value) == ('stack: a micro-batch has 6 tokens per data '
                          'shard, not a multiple of moe_tpl.group_size 4')
  p = _StackParams(2, 4, True)
  p.moe_tpl.Set(group_size=None, num_groups=2)
  with pytest.raises(ValueError) as e:
    p.Instantiate()
  assert str(e.value) == (
      "stack: a pipelined MoE stack needs moe_tpl.group_size (tokens per "
      "group); num_groups 2 would count a micro-batch's groups")
  p = _StackParams(2, 4, True)
  p.moe_tpl.Set(dropout_rate=0.1)
  with pytest.raises(ValueError) as e:
    p.Instantiate()
  assert str(e.value) == (
      'stack: a pipelined MoE stack needs moe_tpl.dropout_rate 0, got 0.1 '
      '(expert dropout is keyed by buffer slot, not by token)')
  p = _StackParams(2, 4, True)
  p.moe_tpl.Set(dispatch_impl='gather')
  with pytest.raises(pipeline.PipelineError) as e:
    p.Instantiate()
  assert str(e.value) == (
      "stack: a pipelined MoE stack needs moe_tpl.dispatch_impl 'einsum' or "
      "'auto', got 'gather' (its manual partitioning cannot be vectorised "
      'over stages)')


def test_auto_dispatch_of_a_pipelined_stack_is_einsum_on_every_platform():
  # The platform hooks (the trainer's ResolveParams) resolve 'auto' to
  # einsum for a pipelined model before the MoE layer's hook would pick
  # gather on a CPU; unpipelined, the CPU gets gather.
  for key, want in (('gpipe.TinyMoEPipelined', 'einsum'),
                    ('m4.TinyMoE', 'gather')):
    task_p = model_registry.GetParams(key, 'Train').task
    assert task_p.moe_tpl.dispatch_impl == 'auto'
    keys = base_layer.ResolveParams(task_p, platform='cpu')
    assert 'moe_tpl.dispatch_impl' in keys
    assert task_p.moe_tpl.dispatch_impl == want, key
  stack_p = _StackParams(2, 4, False)
  stack_p.moe_tpl.dispatch_impl = 'auto'
  base_layer.ResolveParams(stack_p, platform='cpu')
  assert stack_p.moe_tpl.dispatch_impl == 'einsum'
  stack_p.moe_tpl.dispatch_impl = 'auto'  # Built directly: einsum too.
  stack = stack_p.Instantiate()
  assert {x.params.dispatch_impl for x in stack.pipeline.body.AllLayers()
          if isinstance(x, top2.MoELayer)} == {'einsum'}
