"""GShard MoELayer: einsum vs gather dispatch, capacity, paddings, grouping."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.layers.moe import dispatch as moe_dispatch
from lingshard.layers.moe import base as moe_base
from lingshard.layers.moe import top2

B, T, M, H, E = 4, 12, 8, 16, 4


def _Layer(**kw):
  p = top2.MoELayer.Params().Set(name='moe', input_dim=M, hidden_dim=H,
                                num_experts=E, num_groups=2)
  p.Set(**kw)
  return p.Instantiate()


def _Batch(seed=0, pad_frac=0.2):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = (rng.uniform(size=[B, T]) < pad_frac).astype(np.float32)
  return tf.constant(x), tf.constant(pad)


def _Relu(x):
  return np.maximum(x, 0)


def _NumpyMoE(theta, x_gsm, combine_gsec, use_bias):
  """out[g,s] = sum_{e,c} combine[g,s,e,c] * FFN_e(x[g,s]) per token."""
  wi, wo = theta.wi.numpy(), theta.wo.numpy()
  out = np.zeros_like(x_gsm, dtype=np.float64)
  for g, s, e in zip(*np.nonzero(combine_gsec.sum(-1))):
    h = x_gsm[g, s] @ wi[e]
    if use_bias:
      h = h + theta.bi.numpy()[e]
    y = _Relu(h) @ wo[e]
    if use_bias:
      y = y + theta.bo.numpy()[e]
    out[g, s] += combine_gsec[g, s, e].sum() * y
  return out


@pytest.mark.parametrize('policy', ['all', 'random'])
def test_outputs_match_per_token_reference_with_overflow(policy):
  layer = _Layer(expert_capacity=3, use_bias=True,
                 second_expert_policy=policy)
  theta = layer.theta
  theta.bi.assign(tf.random.stateless_normal([E, H], [1, 1]))
  theta.bo.assign(tf.random.stateless_normal([E, M], [1, 2]))
  x, pad = _Batch()
  routing, _, _ = layer.ComputeRouting(theta, x, pad, step=5)
  assert (routing.wanted_gsk.numpy() & ~routing.dispatched_gsk.numpy()).any()
  combine = moe_dispatch.CombineWeightsGSEC(routing, E, 3).numpy()
  ref = _NumpyMoE(theta, x.numpy().reshape(2, -1, M), combine, True)
  for impl in ('einsum', 'gather'):
    layer = _Layer(expert_capacity=3, use_bias=True,
                   second_expert_policy=policy, dispatch_impl=impl)
    out, aux = layer.FProp(theta, x, pad, step=5)
    np.testing.assert_allclose(out.numpy().reshape(ref.shape), ref,
                               rtol=1e-5, atol=1e-5)
    assert aux.aux_loss.dtype == tf.float32 and aux.aux_loss.shape == []


def test_token_with_both_choices_full_returns_exactly_zero():
  # All tokens prefer experts (0, 1): with C = 2 only the first two tokens
  # of each group get slots; the rest return exactly 0 from the layer.
  x = np.abs(np.random.RandomState(1).normal(size=[B, T, M])) + 1.0
  wg = np.zeros([M, E], np.float32)
  wg[:, 0], wg[:, 1] = 2.0, 1.0
  for impl in ('einsum', 'gather'):
    layer = _Layer(expert_capacity=2, dispatch_impl=impl)
    theta = layer.theta
    theta.wg.assign(wg)
    out, aux = layer.FProp(theta, tf.constant(x, tf.float32), tf.zeros([B, T]))
    out_gsm = out.numpy().reshape(2, -1, M)
    assert np.abs(out_gsm[:, :2]).min() > 0
    np.testing.assert_array_equal(out_gsm[:, 2:], 0.0)
    np.testing.assert_allclose(aux.metrics.frac_dispatched_0.numpy(),
                               (T * B / 2 - 2) / (T * B / 2))


def _Grads(layer, theta, x, pad, step=3):
  leaves = theta.Flatten()
  r = tf.random.stateless_normal([B, T, M], [7, 7])
  with tf.GradientTape() as tape:
    tape.watch(leaves + [x])
    out, aux = layer.FProp(theta, x, pad, step=step)
    loss = tf.reduce_sum(out * r) + 0.1 * aux.aux_loss
  grads = tape.gradient(loss, leaves + [x])
  names = [k for k, _ in theta.FlattenItems()] + ['inputs']
  return out, dict(zip(names, grads))


@pytest.mark.parametrize('mode', ['eager', 'jit'])
def test_einsum_and_gather_same_outputs_and_gradients(mode):
  x, pad = _Batch(seed=2)
  results = {}
  theta = None
  for impl in ('einsum', 'gather'):
    layer = _Layer(dispatch_impl=impl, use_bias=True, capacity_factor=0.75,
                   second_expert_policy='random')
    theta = theta or layer.theta
    fn = functools.partial(_Grads, layer, pad=pad)
    if mode == 'jit':
      fn = tf.function(fn, jit_compile=True)
    results[impl] = fn(theta, x)
  (out_e, g_e), (out_g, g_g) = results['einsum'], results['gather']
  np.testing.assert_allclose(out_g.numpy(), out_e.numpy(), rtol=1e-5,
                             atol=1e-6)
  assert set(g_e) == {'bi', 'bo', 'wg', 'wi', 'wo', 'inputs'}
  for name in g_e:
    a, b = tf.convert_to_tensor(g_e[name]), tf.convert_to_tensor(g_g[name])
    assert np.abs(a.numpy()).max() > 0, name    # Gradients reach every one.
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-5,
                               err_msg=name)


def test_uniform_routing_aux_is_one_and_collapse_is_larger():
  # x_s = one_hot(s mod E) and wg rows are cyclic shifts of v, so token s's
  # logits are v shifted by s: f_e = m_e = 1/E.
  v = np.array([1.5, -0.3, 0.4, -1.0], np.float32)
  wg = np.zeros([M, E], np.float32)
  for j in range(E):
    wg[j] = np.roll(v, j)
  x = np.eye(M, dtype=np.float32)[np.arange(B * T) % E].reshape(B, T, M)
  layer = _Layer(**{'aux_loss_weights.group_aux': 1.0})
  theta = layer.theta
  theta.wg.assign(wg)
  _, aux = layer.FProp(theta, tf.constant(x), tf.zeros([B, T]))
  np.testing.assert_allclose(aux.aux_loss.numpy(), 1.0, rtol=1e-6)
  np.testing.assert_allclose(aux.metrics.tokens_per_expert_first.numpy(),
                             np.full(E, 1.0 / E))
  theta.wg.assign(np.tile(np.array([[5.0, 0, 0, 0]], np.float32), [M, 1]))
  _, aux = layer.FProp(theta, tf.constant(np.abs(x) + 1), tf.zeros([B, T]))
  assert aux.aux_loss.numpy() > 3.0


def test_paddings_not_dispatched_outputs_zero_and_ignored():
  x, pad = _Batch(seed=4, pad_frac=0.3)
  layer = _Layer()
  theta = layer.theta
  out, aux = layer.FProp(theta, x, pad)
  mask = pad.numpy() > 0
  np.testing.assert_array_equal(out.numpy()[mask], 0.0)
  x2 = np.where(mask[..., None], 1e3, x.numpy()).astype(np.float32)
  out2, aux2 = layer.FProp(theta, tf.constant(x2), pad)
  np.testing.assert_array_equal(out2.numpy(), out.numpy())
  np.testing.assert_allclose(aux2.aux_loss.numpy(), aux.aux_loss.numpy())
  np.testing.assert_allclose(aux.metrics.num_tokens.numpy(), (~mask).sum())


def test_random_decisions_independent_of_grouping_and_microbatching():
  x, pad = _Batch(seed=5, pad_frac=0.0)
  for policy, key in (('random', 'accept_gs'), ('sampling', 'expert_gsk')):
    ref = None
    for g in (4, 2, 1):
      layer = _Layer(num_groups=g, second_expert_policy=policy)
      r, _, _ = layer.ComputeRouting(layer.theta, x, pad, step=11)
      got = getattr(r, key).numpy()
      got = got.reshape(B * T, -1) if got.ndim == 3 else got.reshape(-1)
      if ref is None:
        ref = got
      np.testing.assert_array_equal(got, ref)
    # Micro-batches: two halves with their global token offsets.
    layer = _Layer(num_groups=1, second_expert_policy=policy)
    halves = [getattr(layer.ComputeRouting(
        layer.theta, x[i * 2:(i + 1) * 2], pad[:2], step=11,
        token_offset=i * 2 * T)[0], key).numpy() for i in range(2)]
    halves = np.concatenate([h.reshape(2 * T, -1) for h in halves]).reshape(
        ref.shape)
    np.testing.assert_array_equal(halves, ref)
  # Same group contents re-ordered across groups (G=4 -> G=2 with groups
  # [2,0] and [3,1]): per-token decisions follow the tokens.
  layer = _Layer(num_groups=4, second_expert_policy='random')
  x4 = tf.reshape(x, [4, -1, M])
  tok4 = tf.reshape(tf.range(B * T, dtype=tf.int64), [4, -1])
  ones = tf.ones([4, B * T // 4])
  r4, _, _ = layer.Route(layer.theta, x4, ones, tok4, 11, 6)
  perm = [2, 0, 3, 1]
  x2 = tf.reshape(tf.gather(x4, perm), [2, -1, M])
  tok2 = tf.reshape(tf.gather(tok4, perm), [2, -1])
  r2, _, _ = layer.Route(layer.theta, x2, tf.ones([2, B * T // 2]), tok2,
                         11, 6)
  np.testing.assert_array_equal(
      tf.reshape(r2.accept_gs, [4, -1]).numpy(),
      tf.gather(r4.accept_gs, perm).numpy())
  # And they do change with the step.
  r5, _, _ = layer.Route(layer.theta, x4, ones, tok4, 12, 6)
  assert (r5.accept_gs.numpy() != r4.accept_gs.numpy()).any()


def test_eval_capacity_factor_used_in_inference():
  train = _Layer(capacity_factor=1.0, eval_capacity_factor=2.0)
  evl = _Layer(capacity_factor=1.0, eval_capacity_factor=2.0,
               is_inference=True)
  s = B * T // 2
  assert train.Capacity(s) == int(np.ceil(2 * s / E))
  assert evl.Capacity(s) == int(np.ceil(2 * 2 * s / E))
  x, pad = _Batch()
  _, aux = evl.FProp(train.theta, x, pad)
  assert aux.metrics.capacity.numpy() == evl.Capacity(s)


def test_bfloat16_inputs_and_fprop_dtype():
  layer = _Layer(fprop_dtype=tf.bfloat16)
  x, pad = _Batch()
  out, aux = layer.FProp(layer.theta, tf.cast(x, tf.bfloat16), pad)
  assert out.dtype == tf.bfloat16 and aux.aux_loss.dtype == tf.float32
  ref, _ = _Layer().FProp(layer.theta, x, pad)
  np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), ref.numpy(),
                             rtol=0.1, atol=0.1)


def test_group_validation_messages():
  x, pad = _Batch()
  with pytest.raises(ValueError, match=r'moe: B\*T = 48 tokens cannot be '
                     'split into num_groups = 5 equal groups'):
    _Layer(num_groups=5).FProp(_Layer().theta, x, pad)
  with pytest.raises(ValueError, match=r'moe: B\*T = 48 tokens cannot be '
                     'split into groups of group_size = 10'):
    _Layer(num_groups=None, group_size=10).FProp(_Layer().theta, x, pad)
  with pytest.raises(ValueError, match='moe: set exactly one of num_groups '
                     'and group_size, got 2, 12'):
    _Layer(group_size=12)
  assert _Layer(num_groups=None, group_size=12).GroupShape(48) == (4, 12)


def test_metrics_keys_and_dropout_only_in_training():
  x, pad = _Batch()
  layer = _Layer(dropout_rate=0.5)
  out1, aux = layer.FProp(layer.theta, x, pad, step=1)
  out2, _ = layer.FProp(layer.theta, x, pad, step=2)
  assert not np.allclose(out1.numpy(), out2.numpy())
  for key in ('aux_loss', 'tokens_per_expert_first', 'tokens_per_expert_all',
              'over_capacity_first', 'over_capacity_second',
              'frac_dispatched_0', 'frac_dispatched_1', 'frac_dispatched_2',
              'cv_importance', 'cv_load', 'max_over_mean_load',
              'drop_frac_by_position', 'drop_frac_by_expert',
              'random_accept_rate'):
    assert aux.metrics[key].dtype == tf.float32, key
  evl = _Layer(dropout_rate=0.5, is_inference=True)
  e1, _ = evl.FProp(layer.theta, x, pad, step=1)
  e2, _ = evl.FProp(layer.theta, x, pad, step=2)
  np.testing.assert_array_equal(e1.numpy(), e2.numpy())


def test_sharding_params_and_annotations():
  p = top2.MoELayer.Params().Set(name='moe', input_dim=M, hidden_dim=H,
                                num_experts=E, num_groups=2, use_bias=True)
  top2.MoELayer.SetExpertSharding(p, np.arange(1), mesh_axis=0)
  assert p.weight_split_dims_mapping.wi == [0, -1, -1]
  assert p.weight_split_dims_mapping.bo == [0, -1]
  assert p.weight_split_dims_mapping.wg == [-1, -1]
  assert p.activation_split_dims_mapping.gsm == [0, -1, -1]
  assert p.activation_split_dims_mapping.egcm == [0, -1, -1, -1]
  # Params (numpy mesh, None mappings) round-trip through text.
  q = top2.MoELayer.Params()
  q.FromText(p.ToText())
  assert q == p
  x, pad = _Batch()
  for impl in ('einsum', 'gather'):
    layer = p.Copy().Set(dispatch_impl=impl).Instantiate()

    @tf.function(jit_compile=True)
    def Fn(theta, x, layer=layer):
      return layer.FProp(layer.ShardTheta(theta), x, pad)[0]

    with sharding.SpmdPartitioning(1):
      graph = Fn.get_concrete_function(layer.theta, x).graph.as_graph_def()
    ops = [n.op for n in graph.node]
    assert ops.count('XlaSharding') >= 4, impl
    if impl == 'gather':   # Per-group manual partitioning (GShard §3.2).
      assert 'XlaSpmdFullToShardShape' in ops
      assert 'XlaSpmdShardToFullShape' in ops
    ref, _ = _Layer(dispatch_impl=impl, use_bias=True).FProp(layer.theta, x,
                                                             pad)
    np.testing.assert_allclose(Fn(layer.theta, x).numpy(), ref.numpy(),
                               rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='num_groups = 3 must be a multiple '
                     'of the mesh axis size 2'):
    top2.MoELayer.SetExpertSharding(p.Copy(), np.arange(2)).Set(
        num_groups=3, dispatch_impl='gather').Instantiate().ManualSpec(3)


def test_choice_params_are_checked():
  with pytest.raises(ValueError, match=r"^moe: dispatch_impl must be one of "
                     r"\('auto', 'einsum', 'gather', 'sorted'\), got 'scatter'$"):
    _Layer(dispatch_impl='scatter')
  with pytest.raises(ValueError, match=r"^moe: second_expert_policy must be "
                     r"one of \('all', 'random', 'sampling'\), got 'best'$"):
    _Layer(second_expert_policy='best')


def test_auto_dispatch_is_resolved_per_platform():
  assert moe_base.AutoDispatchImpl('cpu') == moe_base.AutoDispatchImpl('gpu') == 'gather'
  assert moe_base.AutoDispatchImpl('tpu') == 'einsum'
  with pytest.raises(ValueError, match=r"^platform must be one of \('cpu', "
                     r"'gpu', 'tpu'\), got 'TPU'$"):
    moe_base.AutoDispatchImpl('TPU')
  # A layer built directly resolves from the devices TF sees (CPU here).
  assert _Layer().params.dispatch_impl == 'auto'
  assert _Layer().dispatch_impl == 'gather'
  assert _Layer(dispatch_impl='einsum').dispatch_impl == 'einsum'


def test_resolve_dispatch_sets_every_auto_in_a_params_tree():
  from lingshard import model_registry  # pylint: disable=g-import-not-at-top
  # On TPU, inference of experts split over the mesh (m4.TinyMoE's 8
  # devices) also leaves the sorted dispatch, which has no expert
  # parallelism there, for Algorithm 2's einsum (MoEBase.ForPlatform).
  for platform, impl, inference_impl in (('cpu', 'gather', 'sorted'),
                                         ('tpu', 'einsum', 'einsum')):
    p = model_registry.GetParams('m4.TinyMoE', 'Train')
    assert p.task.moe_tpl.dispatch_impl == 'auto'
    keys = base_layer.ResolveParams(p, platform=platform)
    assert keys == ['task.moe_tpl.dispatch_impl'] + (
        ['task.moe_tpl.inference_dispatch_impl'] if platform == 'tpu' else [])
    assert p.task.moe_tpl.dispatch_impl == impl
    assert p.task.moe_tpl.inference_dispatch_impl == inference_impl
    task = p.task.Instantiate()
    impls = {layer.dispatch_impl for layer in task.AllLayers()
             if isinstance(layer, moe_base.MoEBase)}
    assert impls == {impl}
    assert base_layer.ResolveParams(p, platform=platform) == []  # None left.
  # An explicit choice is kept.
  p = model_registry.GetParams('m4.TinyMoE', 'Train')
  p.task.moe_tpl.dispatch_impl = 'einsum'
  assert base_layer.ResolveParams(p, platform='cpu') == []
  assert p.task.moe_tpl.dispatch_impl == 'einsum'



@pytest.mark.parametrize('impl', ['einsum', 'gather'])
def test_bfloat16_experts_match_float32_within_tolerance(impl):
  """expert_dtype=bfloat16: float32 master weights and gradients, experts'
  matmuls in bfloat16; outputs and gradients within bfloat16 rounding
  (8 mantissa bits: relative 2^-8 per op) of the float32 layer's."""
  layer32 = _Layer(dispatch_impl=impl, use_bias=True)
  layer16 = _Layer(dispatch_impl=impl, use_bias=True,
                   expert_dtype=tf.bfloat16)
  theta = layer32.theta
  x = tf.constant(np.random.RandomState(5).normal(size=[4, 6, M]),
                  tf.float32)
  pad = tf.zeros([4, 6])
  res = {}
  for name, layer in (('f32', layer32), ('bf16', layer16)):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y, aux = layer.FProp(theta, x, pad, step=1)
      loss = tf.reduce_sum(y * tf.sin(x)) + aux.aux_loss
    grads = tape.gradient(loss, [x, theta.wi, theta.wo, theta.wg])
    res[name] = (y, grads)
  y32, g32 = res['f32']
  y16, g16 = res['bf16']
  assert y16.dtype == tf.float32 and all(g.dtype == tf.float32 for g in g16)
  assert theta.wi.dtype == tf.float32
  def RelErr(a, b):
    return float(tf.reduce_max(tf.abs(a - b)) / tf.reduce_max(tf.abs(b)))
  assert 0 < RelErr(y16, y32) < 2e-2
  for a, b in zip(g16, g32):
    assert RelErr(a, b) < 3e-2


def test_inference_hooks_set_decoding_routing_through_the_visitor():
  from lingshard import model_registry  # pylint: disable=g-import-not-at-top
  from lingshard.models import mt_model  # pylint: disable=g-import-not-at-top
  task_p = model_registry.GetParams('m4.TinyMoE', 'Train').task
  assert task_p.moe_tpl.second_expert_policy == 'random'
  p = mt_model.TransformerMTModel.InferenceParams(task_p)
  # GShard App. A.1: one-token groups, no drops; top-2 kept; the sorted
  # dispatch computes only each token's 2 choices.
  assert (p.moe_tpl.num_groups, p.moe_tpl.group_size,
          p.moe_tpl.expert_capacity, p.moe_tpl.dispatch_impl,
          p.moe_tpl.second_expert_policy) == (None, 1, None, 'sorted', 'all')
  assert p.is_inference and not task_p.is_inference  # A copy.
  assert task_p.moe_tpl.group_size is None
  # The visitor reports what each class hook set.
  q = task_p.Copy()
  assert base_layer.ResolveParams(q, inference=True) == [
      'moe_tpl.num_groups', 'moe_tpl.group_size', 'moe_tpl.expert_capacity',
      'moe_tpl.dispatch_impl', 'moe_tpl.second_expert_policy']
  # A dense model has nothing to change.
  dense = model_registry.GetParams('m4.TinyDense', 'Train').task
  assert base_layer.ResolveParams(dense, inference=True) == []
