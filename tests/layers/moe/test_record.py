"""moe/record.py: the routing an MoE layer's FProp used, per [B, T] token,
only inside a recorder, and a one-line error where it cannot leave the
graph."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import sharding
from lingshard.layers.moe import expert_choice
from lingshard.layers.moe import record
from lingshard.layers.moe import top2

B, T, M, E = 2, 6, 8, 4


def _Inputs():
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=[B, T, M]).astype(np.float32))
  pad = np.zeros([B, T], np.float32)
  pad[0, 4:] = pad[1, 5:] = 1.0
  return x, tf.constant(pad)


def test_records_the_routing_of_fprop_per_token():
  # 3 groups of 4 of the 2 x 6 tokens: group 1 holds the end of row 0 and
  # the start of row 1.
  layer = top2.MoELayer.Params().Set(
      name='moe', input_dim=M, hidden_dim=8, num_experts=E, num_groups=3,
      capacity_factor=0.5).Instantiate()
  x, pad = _Inputs()
  layer.FProp(layer.theta, x, pad)  # No recorder: nothing to record into.
  assert not record.Recording()
  with record.RoutingRecorder() as records:
    assert record.Recording()
    layer.FProp(layer.theta, x, pad, step=3)
  assert not record.Recording()
  (r,) = records
  routing, _, _ = layer.ComputeRouting(layer.theta, x, pad, step=3)
  assert r.layer == 'moe' and r.num_experts == E and not r.choice_is_expert
  real = pad.numpy() == 0
  np.testing.assert_array_equal(r.real_bt, real)
  np.testing.assert_array_equal(
      r.expert_btk, np.reshape(routing.expert_gsk, [B, T, 2]))
  for name in ('wanted', 'dispatched'):
    want = np.reshape(getattr(routing, f'{name}_gsk'), [B, T, 2])
    np.testing.assert_array_equal(getattr(r, f'{name}_btk'),
                                  want & real[..., None])
  # Capacity 0.5 x 2 x 4 / 4 = 1 slot per (expert, group): some dropped.
  assert np.sum(r.wanted_btk & ~r.dispatched_btk) > 0


def test_expert_choice_records_experts_not_ranks():
  layer = expert_choice.ExpertChoiceMoELayer.Params().Set(
      name='ec', input_dim=M, hidden_dim=8, num_experts=E,
      num_groups=2).Instantiate()
  x, pad = _Inputs()
  with record.RoutingRecorder() as records:
    layer.FProp(layer.theta, x, pad)
  (r,) = records
  assert r.choice_is_expert and r.expert_btk.shape == (B, T, E)
  np.testing.assert_array_equal(r.expert_btk[0, 0], np.arange(E))
  assert not np.any(r.dispatched_btk[pad.numpy() > 0])


def test_a_nested_graph_cannot_record():
  layer = top2.MoELayer.Params().Set(
      name='moe', input_dim=M, hidden_dim=8, num_experts=E,
      num_groups=1).Instantiate()
  x, pad = _Inputs()
  theta = layer.theta.Transform(tf.convert_to_tensor)

  def Fn(flag):
    with record.RoutingRecorder():
      return tf.cond(flag, lambda: layer.FProp(theta, x, pad)[0],
                     lambda: x)

  with pytest.raises(record.RecordError) as e:
    sharding.Function(Fn, xla_compiled=False)(tf.constant(True))
  assert str(e.value) == (
      'moe: its routing cannot be recorded: it runs inside a nested graph '
      '(a pipeline body or a loop), whose tensors cannot leave it')
