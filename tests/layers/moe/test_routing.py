"""The Routing type: every gate returns one, with its documented invariants."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers.moe import balanced
from lingshard.layers.moe import hierarchical
from lingshard.layers.moe import noisy_top_k
from lingshard.layers.moe import routing
from lingshard.layers.moe import top2

B, T, M, E = 2, 12, 8, 4


def _Layers():
  common = dict(name='moe', input_dim=M, hidden_dim=8, num_experts=E,
                num_groups=2, expert_capacity=3)
  return {
      'top2': top2.MoELayer.Params().Set(second_expert_policy='random',
                                        **common),
      'noisy': noisy_top_k.NoisyTopKMoELayer.Params().Set(**common),
      'hierarchical': hierarchical.HierarchicalMoELayer.Params().Set(
          num_expert_groups=2, gating_kind='top2', **common),
      'balanced': balanced.BalancedMoELayer.Params().Set(**common),
  }


@pytest.mark.parametrize('kind', ['top2', 'noisy', 'hierarchical',
                                  'balanced'])
def test_every_gate_returns_a_routing_with_its_invariants(kind):
  layer = _Layers()[kind].Instantiate()
  rng = np.random.RandomState(0)
  x = tf.constant(rng.normal(size=[B, T, M]), tf.float32)
  pad = tf.constant(rng.uniform(size=[B, T]) < 0.25, tf.float32)
  r, aux_loss, stats = layer.ComputeRouting(layer.theta, x, pad, step=3)
  assert isinstance(r, routing.Routing)
  assert aux_loss.dtype == tf.float32 and aux_loss.shape == ()
  assert all(v.dtype == tf.float32 for v in stats.Flatten())
  k = r.expert_gsk.shape[-1]
  assert r.choice_is_expert == (kind == 'balanced')
  assert k == (E if kind == 'balanced' else
               {'top2': 2, 'noisy': 2, 'hierarchical': 4}[kind])
  for name, dtype in (('expert_gsk', tf.int32), ('gate_gsk', tf.float32),
                      ('wanted_gsk', tf.bool), ('position_gsk', tf.int32),
                      ('dispatched_gsk', tf.bool), ('weight_gsk', tf.float32)):
    t = getattr(r, name)
    assert t.dtype == dtype and t.shape == (2, B * T // 2, k), name
  assert r.accept_gs.dtype == tf.bool and r.accept_gs.shape == (2, B * T // 2)
  real = pad.numpy().reshape(2, -1) == 0
  wanted, disp = r.wanted_gsk.numpy(), r.dispatched_gsk.numpy()
  # Dispatched already respects capacity; weights vanish elsewhere.
  assert not (disp & ~wanted).any()
  assert (r.position_gsk.numpy()[disp] < 3).all()
  assert (r.position_gsk.numpy()[wanted & ~disp] >= 3).all()
  assert (r.weight_gsk.numpy()[~disp] == 0).all()
  assert not wanted[~real].any() and not r.accept_gs.numpy()[~real].any()
  assert disp.any() and (wanted & ~disp).any()  # The inputs overflow C = 3.


def test_token_choice_routing_queues_rank_major_and_cuts_at_capacity():
  # One group of 4 tokens; every first choice is expert 0, every second
  # expert 1, except token 3 whose first choice is expert 1.
  expert = tf.constant([[[0, 1], [0, 1], [0, 1], [1, 0]]], tf.int32)
  gate = tf.constant([[[0.6, 0.4]] * 4], tf.float32)
  accept = tf.constant([[True, False, True, True]])
  r = routing.TokenChoiceRouting(expert, gate, tf.ones([1, 4]), 2, 2,
                                 accept_gs=accept)
  # Expert 0: firsts of tokens 0, 1, 2 (slots 0, 1, 2), then token 3's
  # second (slot 3). Expert 1: token 3's first (slot 0) before the seconds
  # of tokens 0, 1 (rejected, still takes slot 2), 2.
  np.testing.assert_array_equal(r.position_gsk.numpy()[0],
                                [[0, 1], [1, 2], [2, 3], [0, 3]])
  np.testing.assert_array_equal(
      r.dispatched_gsk.numpy()[0],
      [[True, True], [True, False], [False, False], [True, False]])
  np.testing.assert_allclose(r.weight_gsk.numpy()[0],
                             [[0.6, 0.4], [0.6, 0.0], [0.0, 0.0], [0.6, 0.0]])
  freed = routing.TokenChoiceRouting(expert, gate, tf.ones([1, 4]), 2, 2,
                                     accept_gs=accept,
                                     rejected_takes_slot=False)
  assert freed.position_gsk.numpy()[0, 2, 1] == 2  # Token 1 freed slot 2.


def test_routing_is_a_tf_nest_structure():
  r = routing.MaskRouting(tf.constant([[[True, False], [True, True]]]),
                          tf.constant([[[1.0, 0.0], [0.5, 0.5]]]),
                          tf.ones([1, 2]), 1)

  @tf.function
  def Weights(routing_in):
    return routing_in.weight_gsk * 2.0

  np.testing.assert_allclose(Weights(r).numpy()[0], [[2.0, 0.0], [0.0, 1.0]])
  assert len(tf.nest.flatten(r)) == len(routing.Routing._fields)
  assert r.choice_is_expert
