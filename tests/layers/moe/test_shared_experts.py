"""Shared experts (DeepSeekMoE §3.2, moe/shared.py): the layer's output is the
routed output of the same weights plus the sum of N dense FFNs on every real
token; gradients, params checks, sharding and the FLOP-matched m4 config."""

import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard import sharding
from lingshard.layers.moe import noisy_top_k
from lingshard.layers.moe import top2
from lingshard.params import m4
from lingshard.tools import count_params

B, T, M, H, E, N, HS = 2, 6, 8, 16, 4, 2, 12
GATES = {'top2': top2.MoELayer, 'noisy_top_k': noisy_top_k.NoisyTopKMoELayer}


def _Params(gate, **kw):
  return GATES[gate].Params().Set(name='moe', input_dim=M, hidden_dim=H,
                                  num_experts=E, num_groups=2, **kw)


def _Pair(gate, **kw):
  """(layer with N shared experts of hidden HS, the same layer without),
  random weights; the second's theta is the first's minus the shared."""
  layer = _Params(gate, num_shared_experts=N, shared_hidden_dim=HS,
                  **kw).Instantiate()
  rng = np.random.RandomState(0)
  for v in layer.theta.Flatten():
    v.assign(rng.normal(scale=0.5, size=v.shape).astype(np.float32))
  routed = _Params(gate, **kw).Instantiate()
  theta0 = type(layer.theta)({k: v for k, v in layer.theta.items()
                              if not k.startswith('shared_')})
  assert sorted(theta0) == sorted(routed.theta)
  return layer, routed, theta0


def _Batch():
  rng = np.random.RandomState(1)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = np.zeros([B, T], np.float32)
  pad[0, 4:] = pad[1, 5:] = 1.0
  return x, pad


def _NumpyShared(theta, x, pad, use_bias):
  """sum_n relu(x Wi_n + bi_n) Wo_n + bo_n per real token, 0 on padding."""
  th = {k: v.numpy().astype(np.float64) for k, v in theta.items()}
  out = np.zeros(x.shape)
  for n in range(N):
    h = x @ th['shared_wi'][n] + (th['shared_bi'][n] if use_bias else 0)
    out += (np.maximum(h, 0) @ th['shared_wo'][n] +
            (th['shared_bo'][n] if use_bias else 0))
  return out * (1 - pad)[..., None]


@pytest.mark.parametrize('gate,use_bias', [('top2', False), ('top2', True),
                                           ('noisy_top_k', False)])
def test_output_is_routed_plus_numpy_shared_ffns(gate, use_bias):
  layer, routed, theta0 = _Pair(gate, use_bias=use_bias)
  x, pad = _Batch()
  y, aux = layer.FProp(layer.theta, x, pad, step=1)
  y0, aux0 = routed.FProp(theta0, x, pad, step=1)
  want = y0.numpy() + _NumpyShared(layer.theta, x, pad, use_bias)
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
  assert np.all(y.numpy()[pad == 1] == 0)
  assert np.abs(want - y0.numpy())[pad == 0].min() > 0  # Shared adds.
  np.testing.assert_allclose(aux.aux_loss.numpy(), aux0.aux_loss.numpy())


def test_shared_output_adds_before_the_output_activation():
  layer, _, theta0 = _Pair('noisy_top_k', output_activation='sigmoid')
  pre = _Params('noisy_top_k').Instantiate()
  x, pad = _Batch()
  y, _ = layer.FProp(layer.theta, x, pad)
  y0, _ = pre.FProp(theta0, x, pad)
  total = y0.numpy() + _NumpyShared(layer.theta, x, pad, False)
  want = (1 / (1 + np.exp(-total))) * (1 - pad)[..., None]
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


def test_shared_hidden_dropout_in_training_only():
  """The shared hidden takes the experts' dropout_rate, with a mask of its
  own (the routed experts' masks are unchanged: y - y0 is the shared part)."""
  x, pad = _Batch()
  want = _NumpyShared(_Pair('top2')[0].theta, x, pad, False)
  for is_inference in (False, True):
    layer, routed, theta0 = _Pair('top2', dropout_rate=0.5,
                                  is_inference=is_inference)
    part = [(layer.FProp(layer.theta, x, pad, step=s)[0] -
             routed.FProp(theta0, x, pad, step=s)[0]).numpy() for s in (1, 2)]
    if is_inference:
      np.testing.assert_allclose(part[0], want, rtol=1e-5, atol=1e-5)
    else:
      assert np.abs(part[0] - want).max() > 1e-2
      assert np.abs(part[0] - part[1]).max() > 1e-2  # A mask per step.
    assert np.all(part[0][pad == 1] == 0)


def test_shared_gradients_equal_a_tf_reference():
  layer, _, _ = _Pair('top2')
  x, pad = _Batch()
  r = tf.constant(np.random.RandomState(2).normal(size=[B, T, M]),
                  tf.float32)
  wi, wo = layer.theta.shared_wi, layer.theta.shared_wo
  with tf.GradientTape() as tape:
    y, _ = layer.FProp(layer.theta, x, pad, step=1)
    loss = tf.reduce_sum(y * r)
  got = tape.gradient(loss, [wi, wo])
  # The routed part does not depend on the shared weights: the reference
  # is the gradient of the shared FFNs alone, one matmul per expert.
  x_tm = tf.reshape(x, [-1, M])
  r_tm = tf.reshape(r * (1 - pad)[..., None], [-1, M])
  with tf.GradientTape() as tape:
    ref = sum(tf.reduce_sum(tf.nn.relu(x_tm @ wi[n]) @ wo[n] * r_tm)
              for n in range(N))
  want = tape.gradient(ref, [wi, wo])
  for g, w in zip(got, want):
    assert float(tf.reduce_min(tf.reduce_max(tf.abs(g), [1, 2]))) > 0
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


def test_shared_weights_shapes_and_none_without_shared_experts():
  layer = _Params('top2', num_shared_experts=N, use_bias=True).Instantiate()
  shapes = {k: list(wp.shape) for k, wp in layer.weight_params.items()
            if k.startswith('shared_')}
  assert shapes == {'shared_wi': [N, M, H], 'shared_wo': [N, H, M],
                    'shared_bi': [N, H], 'shared_bo': [N, M]}
  for gate in GATES:
    names = _Params(gate).Instantiate().weight_params
    assert not [k for k in names if 'shared' in k]
  task = model_registry.GetParams('m4.TinyMoE', 'Train').task.Instantiate()
  assert not [k for k, _ in task.DeclaredWeights().FlattenItems()
              if 'shared' in k]


def test_bad_shared_params_are_one_line_errors():
  with pytest.raises(ValueError, match=r'^moe: num_shared_experts must be '
                     r'>= 0, got -1$'):
    _Params('top2', num_shared_experts=-1).Instantiate()
  with pytest.raises(ValueError, match=r'^moe: shared_hidden_dim must be > '
                     r'0, got 0$'):
    _Params('top2', num_shared_experts=1, shared_hidden_dim=0).Instantiate()


def test_set_expert_sharding_replicates_shared_weights():
  for gate, cls in GATES.items():
    p = cls.SetExpertSharding(_Params(gate, num_shared_experts=N,
                                      use_bias=True), np.arange(2))
    wmap, amap = p.weight_split_dims_mapping, p.activation_split_dims_mapping
    assert wmap.shared_wi == wmap.shared_wo == [-1, -1, -1]
    assert wmap.shared_bi == wmap.shared_bo == [-1, -1]
    assert wmap.wi == [0, -1, -1]  # Routed experts stay split on E.
    assert amap.gsnh == [0, -1, -1, -1]  # Like the tokens' groups.
    layer = p.Instantiate()
    assert layer.weight_params['shared_wi'].tensor_split_dims_mapping == (
        [-1, -1, -1])
  p = top2.MoELayer.SetExpertSharding(
      _Params('top2', num_shared_experts=N), np.arange(4).reshape(2, 2),
      mesh_axis=1, mesh_axis_names=['data', 'expert'], data_mesh_axis=0)
  assert p.activation_split_dims_mapping.gsnh == [(0, 1), -1, -1, -1]


def test_shared_hidden_is_annotated_under_spmd():
  x, pad = _Batch()

  def Shardings(n):
    p = top2.MoELayer.SetExpertSharding(
        _Params('top2', num_shared_experts=n, dispatch_impl='einsum'),
        np.arange(1))
    layer = p.Instantiate()
    fn = sharding.Function(lambda th: layer.FProp(th, x, pad)[0],
                           xla_compiled=True)
    with sharding.SpmdPartitioning(1):
      graph = fn.get_concrete_function(layer.theta).graph.as_graph_def()
    return [n.op for n in graph.node].count('XlaSharding')

  # The hidden [G, S, N, Hs] is annotated (and the replicated weights).
  assert Shardings(N) > Shardings(0)


def _Docstring(key):
  """(weights, FLOPs) a registered config's docstring states."""
  doc = ' '.join(model_registry.GetClass(key).__doc__.split())
  weights = re.search(r'([\d,]+) weights', doc).group(1)
  flops = re.search(r'([\d,]+) forward matmul FLOPs', doc).group(1)
  return int(weights.replace(',', '')), int(flops.replace(',', ''))


def test_registered_variant_matches_tiny_moe_flops_up_to_the_gate():
  p = model_registry.GetParams('m4.TinyMoEShared', 'Train').task
  mp = p.moe_tpl
  assert mp.cls is noisy_top_k.NoisyTopKMoELayer
  assert (mp.num_experts_per_token, mp.gate_softmax, mp.num_shared_experts,
          mp.num_experts) == (1, 'all', 1, m4.TINY_EXPERTS)
  moe = count_params.CountModel('m4.TinyMoE')
  shared = count_params.CountModel('m4.TinyMoEShared')
  # 1 shared + top-1 routed = TinyMoE's top-2 expert FFNs per token; the
  # FLOPs differ by the gates only (Wnoise [M, E] beside Wg).
  assert (shared.flops_per_token - moe.flops_per_token ==
          2 * (shared.by_kind['gating'] - moe.by_kind['gating']) > 0)
  moe_layers = 2
  assert shared.by_kind['shared_experts'] == (
      moe_layers * 2 * p.model_dim * p.hidden_dim)
  assert shared.by_kind['experts'] == moe.by_kind['experts']
  for key, c in (('m4.TinyMoE', moe), ('m4.TinyMoEShared', shared)):
    assert _Docstring(key) == (c.total, c.flops_per_token)
