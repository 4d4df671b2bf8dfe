"""Sorted dropless dispatch: parity with the padded dispatchers and a
per-token numpy loop (outputs, aux, metrics, gradients), its block layout,
and dropless inference by default."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers.moe import balanced
from lingshard.layers.moe import dispatch_sorted
from lingshard.layers.moe import hierarchical
from lingshard.layers.moe import noisy_top_k
from lingshard.layers.moe import top2

B, T, M, H, E = 4, 12, 8, 16, 4

GATES = {
    'top2': (top2.MoELayer, {}),
    'top2_random': (top2.MoELayer, {'second_expert_policy': 'random'}),
    'noisy_top_k': (noisy_top_k.NoisyTopKMoELayer,
                    {'num_experts_per_token': 3}),
    'hierarchical': (hierarchical.HierarchicalMoELayer,
                     {'num_expert_groups': 2, 'k_primary': 1}),
    'balanced': (balanced.BalancedMoELayer, {}),
}


def _Params(gate, **kw):
  cls, extra = GATES[gate]
  p = cls.Params().Set(name='moe', input_dim=M, hidden_dim=H, num_experts=E,
                       num_groups=2, capacity_factor=None, use_bias=True)
  return p.Set(**{**extra, **kw})


def _Batch(seed=0):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  pad = (rng.uniform(size=[B, T]) < 0.2).astype(np.float32)
  return tf.constant(x), tf.constant(pad)


def _RandomTheta(layer, seed=0):
  rng = np.random.RandomState(seed)
  for v in layer.theta.Flatten():
    v.assign(rng.normal(scale=0.5, size=v.shape).astype(v.dtype.as_numpy_dtype))
  return layer.theta


def _Step(layer, theta, x, pad):
  """Outputs, aux loss, metrics and gradients of sum(y * r) + aux."""
  leaves = theta.Flatten()
  # A constant (stateless_normal draws differently under XLA).
  r = tf.constant(np.random.RandomState(7).normal(size=[B, T, M]),
                  tf.float32)
  with tf.GradientTape() as tape:
    tape.watch(leaves + [x])
    out, aux = layer.FProp(theta, x, pad, step=3)
    loss = tf.reduce_sum(out * r) + aux.aux_loss
  grads = tape.gradient(loss, leaves + [x])
  names = [k for k, _ in theta.FlattenItems()] + ['inputs']
  return out, aux.aux_loss, aux.metrics, dict(zip(names, grads))


def _Results(gate, impls, jit=False, **kw):
  x, pad = _Batch(seed=2)
  theta = None
  res = {}
  for impl in impls:
    layer = _Params(gate, dispatch_impl=impl, **kw).Instantiate()
    theta = theta or _RandomTheta(layer)
    fn = functools.partial(_Step, layer, pad=pad)
    if jit:
      fn = tf.function(fn, jit_compile=True)
    res[impl] = fn(theta, x)
  return res


def _AssertSame(a, b):
  out_a, aux_a, met_a, g_a = a
  out_b, aux_b, met_b, g_b = b
  np.testing.assert_allclose(out_b.numpy(), out_a.numpy(), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(aux_b.numpy(), aux_a.numpy(), rtol=1e-5)
  assert sorted(met_a.keys()) == sorted(met_b.keys())
  for key in met_a:
    np.testing.assert_allclose(met_b[key].numpy(), met_a[key].numpy(),
                               rtol=1e-5, atol=1e-7, err_msg=key)
  assert set(g_a) == set(g_b)
  for name in g_a:
    ga, gb = (tf.convert_to_tensor(g).numpy() for g in (g_a[name], g_b[name]))
    if name in ('wi', 'wo', 'bi', 'bo', 'inputs'):
      assert np.abs(ga).max() > 0, name  # Gradients reach every weight.
    np.testing.assert_allclose(gb, ga, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize('gate', sorted(GATES))
def test_sorted_equals_padded_dropless_for_every_token_choice_gate(gate):
  res = _Results(gate, ('gather', 'sorted'))
  _AssertSame(res['gather'], res['sorted'])


def test_sorted_equals_einsum_and_gather():
  res = _Results('top2_random', ('einsum', 'gather', 'sorted'))
  _AssertSame(res['einsum'], res['sorted'])
  _AssertSame(res['gather'], res['sorted'])


def test_sorted_compiles_with_xla_and_matches_eager():
  eager = _Results('top2_random', ('sorted',))['sorted']
  compiled = _Results('top2_random', ('sorted',), jit=True)['sorted']
  _AssertSame(eager, compiled)


def test_sorted_equals_padded_when_capacity_drops():
  """Any routing works: with C = 3 choices are dropped; sorted computes
  exactly the dispatched ones."""
  res = _Results('top2', ('gather', 'sorted'), expert_capacity=3)
  assert res['sorted'][2].over_capacity_by_choice.numpy().max() > 0.1
  _AssertSame(res['gather'], res['sorted'])


def _Forward(gate, impls, jit=False, **kw):
  """Inference: outputs, aux loss and metrics per impl (the sorted
  dispatch runs its blocks in a while loop there)."""
  x, pad = _Batch(seed=3)
  theta, res = None, {}
  for impl in impls:
    layer = _Params(gate, dispatch_impl=impl, is_inference=True,
                    eval_capacity_factor=None, **kw).Instantiate()
    theta = theta or _RandomTheta(layer)
    fn = functools.partial(layer.FProp, paddings=pad)
    if jit:
      fn = tf.function(fn, jit_compile=True)
    out, aux = fn(theta, inputs=x)
    res[impl] = (out, aux.aux_loss, aux.metrics, {})
  return res


@pytest.mark.parametrize('gate', sorted(GATES))
def test_inference_block_loop_equals_padded_dropless(gate):
  res = _Forward(gate, ('gather', 'sorted'))
  _AssertSame(res['gather'], res['sorted'])


@pytest.mark.parametrize('block_size', [None, 1])
def test_inference_block_loop_compiles_with_xla(block_size):
  eager = _Forward('top2', ('gather',))['gather']
  compiled = _Forward('top2', ('sorted',), jit=True,
                      sorted_block_size=block_size)['sorted']
  _AssertSame(eager, compiled)


def _Relu(x):
  return np.maximum(x, 0)


@pytest.mark.parametrize('block_size,inference', [
    (None, False), (1, False), (3, True), (64, False), (None, True)])
def test_sorted_matches_per_token_numpy_loop(block_size, inference):
  layer = _Params('top2', dispatch_impl='sorted', is_inference=inference,
                  sorted_block_size=block_size).Instantiate()
  theta = _RandomTheta(layer, seed=1)
  x, pad = _Batch(seed=4)
  out, _ = layer.FProp(theta, x, pad)
  routing, _, _ = layer.ComputeRouting(theta, x, pad)
  w = {k: v.numpy().astype(np.float64) for k, v in theta.items()}
  x_gsm = x.numpy().reshape([2, -1, M]).astype(np.float64)
  want = np.zeros_like(x_gsm)
  expert, weight = routing.expert_gsk.numpy(), routing.weight_gsk.numpy()
  ok = routing.dispatched_gsk.numpy()
  assert ok.sum() > 0.5 * ok.size  # Mostly real tokens, both choices.
  for g, s, k in zip(*np.nonzero(ok)):
    e = expert[g, s, k]
    y = _Relu(x_gsm[g, s] @ w['wi'][e] + w['bi'][e]) @ w['wo'][e] + w['bo'][e]
    want[g, s] += weight[g, s, k] * y
  np.testing.assert_allclose(out.numpy().reshape(want.shape), want,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('block_size', [1, 2, 5])
def test_block_layout_covers_each_dispatched_choice_once(block_size):
  layer = _Params('top2', expert_capacity=4).Instantiate()
  x, pad = _Batch(seed=6)
  routing, _, _ = layer.ComputeRouting(_RandomTheta(layer), x, pad)
  row_a, valid_a, src_r, expert_n, used = (t.numpy() for t in
                                     dispatch_sorted.SortedLayout(
                                         routing, E, block_size))
  a_len = routing.expert_gsk.numpy().size
  nb = dispatch_sorted.NumBlocks(a_len, E, block_size)
  assert src_r.shape == (nb * block_size,) and expert_n.shape == (nb,)
  expert_a = routing.expert_gsk.numpy().reshape(-1)
  np.testing.assert_array_equal(valid_a,
                                routing.dispatched_gsk.numpy().reshape(-1))
  # Every dispatched choice in exactly one row, of a block of its expert.
  filled = src_r[src_r >= 0]
  np.testing.assert_array_equal(np.sort(filled), np.nonzero(valid_a)[0])
  np.testing.assert_array_equal(src_r[row_a[valid_a]], np.nonzero(valid_a)[0])
  np.testing.assert_array_equal(expert_n[row_a[valid_a] // block_size],
                                expert_a[valid_a])
  # Blocks are in expert order (segments are contiguous); rows only in the
  # first `used` blocks.
  assert (np.diff(expert_n) >= 0).all()
  assert (src_r[used * block_size:] == -1).all()
  assert (src_r[(used - 1) * block_size:used * block_size] >= 0).any()


def test_auto_block_size_bounds_the_padding():
  assert dispatch_sorted.AutoBlockSize(16, 64) == 1
  assert dispatch_sorted.AutoBlockSize(8192, 64) == 32
  assert dispatch_sorted.AutoBlockSize(8192, 64, loop=True) == 64
  assert dispatch_sorted.AutoBlockSize(10 ** 7, 8) == 128
  for a_len, e in ((16, 64), (1000, 8), (8192, 64), (10 ** 6, 16)):
    b = dispatch_sorted.AutoBlockSize(a_len, e)
    assert e * (b - 1) <= a_len / 4
  with pytest.raises(ValueError, match=r'^moe: sorted_block_size must be '
                     r'None or >= 1, got 0$'):
    _Params('top2', sorted_block_size=0).Instantiate()


def test_inference_output_does_not_depend_on_batch_neighbours_by_default():
  """Default params, inference: a sentence's outputs are the same with
  random neighbours and with neighbours that crowd its first token's
  expert (eval_capacity_factor 2.0, the default before, drops it there)."""
  e = 8
  p = top2.MoELayer.Params().Set(name='moe', input_dim=M, hidden_dim=H,
                                 num_experts=e, num_groups=1,
                                 is_inference=True)
  theta = _RandomTheta(p.Instantiate(), seed=3)
  rng = np.random.RandomState(8)
  sentence = rng.normal(size=[1, T, M]).astype(np.float32)
  # The sentence last: its tokens come after its neighbours' in the group.
  random_batch = np.concatenate(
      [rng.normal(size=[3, T, M]).astype(np.float32), sentence])
  # 3*T copies of its first token want that token's experts first: C =
  # 2*2*4T/8 = T slots, so that token itself is dropped at cf 2.0.
  crowded_batch = np.concatenate(
      [np.broadcast_to(1.5 * sentence[:, :1], [3, T, M]), sentence])
  outs, dropped = {}, {}
  for name, layer_p in (('default', p),
                        ('cf2', p.Copy().Set(eval_capacity_factor=2.0))):
    layer = layer_p.Instantiate()
    ys = [layer.FProp(theta, tf.constant(batch), tf.zeros([4, T]))
          for batch in (random_batch, crowded_batch)]
    outs[name] = [y.numpy()[-1] for y, _ in ys]
    dropped[name] = ys[1][1].metrics.over_capacity_by_choice.numpy()
  np.testing.assert_allclose(outs['default'][1], outs['default'][0],
                             rtol=1e-5, atol=1e-6)
  assert dropped['default'].max() == 0.0
  # The same batches at capacity factor 2.0 drop tokens and change it.
  assert dropped['cf2'].max() > 0.1
  assert np.abs(outs['cf2'][1] - outs['cf2'][0]).max() > 1e-3


def test_for_inference_sets_sorted_dropless_unless_asked_otherwise():
  p = _Params('top2', num_groups=2)
  assert base_layer.ResolveParams(p, inference=True) == [
      'num_groups', 'group_size', 'expert_capacity', 'dispatch_impl',
      'second_expert_policy']
  assert (p.group_size, p.dispatch_impl, p.eval_capacity_factor) == (
      1, 'sorted', None)
  q = _Params('top2', inference_dispatch_impl='einsum')
  base_layer.ResolveParams(q, inference=True)
  assert q.dispatch_impl == 'einsum'
  with pytest.raises(ValueError, match=r"^moe: inference_dispatch_impl must "
                     r"be one of \('auto', 'einsum', 'gather', 'sorted'\), "
                     r"got 'padded'$"):
    _Params('top2', inference_dispatch_impl='padded').Instantiate()
