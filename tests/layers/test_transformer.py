"""Transformer layers and stacks: sublayer wiring, MoE placement,
incremental decoding, stateless dropout."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import attention
from lingshard.layers import dropout
from lingshard.layers import transformer
from lingshard.nested_map import NestedMap
from lingshard.layers.moe import top2

SHAPE = dict(model_dim=8, hidden_dim=16, num_heads=2, dim_per_head=4)


def _Moe(**kw):
  return top2.MoELayer.Params().Set(num_experts=4, num_groups=1,
                                   expert_capacity=64, **kw)


def _Stack(**kw):
  return transformer.TransformerStack.Params().Set(
      name='stack', **SHAPE).Set(**kw).Instantiate()


def _Inputs(b=2, t=5, seed=0):
  rng = np.random.RandomState(seed)
  return rng.normal(size=[b, t, 8]).astype(np.float32)


@pytest.mark.parametrize('num_layers,moe_layers,want', [
    (6, None, [1, 3, 5]), (5, None, [1, 3]), (4, [0, 2], [0, 2]),
    (3, [], [])])
def test_moe_placement_follows_params(num_layers, moe_layers, want):
  stack = _Stack(num_layers=num_layers, moe_tpl=_Moe(), moe_layers=moe_layers)
  for i, layer in enumerate(stack.layer):
    assert ('moe' in layer.children) == (i in want)
    assert ('ffn' in layer.children) == (i not in want)
  x = _Inputs()
  _, aux = stack.FProp(stack.theta, x, np.zeros([2, 5], np.float32))
  assert sorted(aux) == [f'layer_{i:03d}' for i in want]
  for a in aux.values():
    assert a.aux_loss.shape == () and 'over_capacity_first' in a.metrics


def test_dense_stack_has_no_moe():
  stack = _Stack(num_layers=3)
  assert not any('moe' in layer.children for layer in stack.layer)
  with pytest.raises(ValueError, match='moe_layers .* given but moe_tpl is'):
    _Stack(num_layers=3, moe_layers=[1])
  with pytest.raises(ValueError, match='out of range'):
    _Stack(num_layers=3, moe_tpl=_Moe(), moe_layers=[3])


def _Manual(layer, theta, x, paddings, enc=None, enc_paddings=None):
  """Reference composition of the sublayers (module docstring formulas).

  Returns (outputs, the FFN's aux)."""
  post = layer.params.norm_policy == 'post'
  ffn_aux = []

  def Sub(name, x, fn):
    ln = getattr(layer, f'{name}_ln')

    def Norm(v):
      return ln.FProp(theta[f'{name}_ln'], v)

    return Norm(x + fn(x)) if post else x + fn(Norm(x))

  x = Sub('self_atten', x, lambda h: layer.self_atten.FProp(
      theta.self_atten, h, key_paddings_bs=paddings,
      causal=layer.params.is_decoder))
  if enc is not None:
    x = Sub('cross_atten', x, lambda h: layer.cross_atten.FProp(
        theta.cross_atten, h, enc, enc_paddings))
  name = 'moe' if 'moe' in layer.children else 'ffn'

  def Ffn(h):
    y, aux = layer.children[name].FProp(theta[name], h, paddings)
    ffn_aux.append(aux)
    return y

  return Sub('ffn', x, Ffn), ffn_aux[0]


@pytest.mark.parametrize('use_moe', [False, True])
@pytest.mark.parametrize('norm', ['pre', 'post'])
@pytest.mark.parametrize('is_decoder', [False, True])
def test_layer_is_residual_norm_composition(norm, is_decoder, use_moe):
  """Dense and MoE FFNs sit in the layer the same way (one FFN contract);
  the layer returns the FFN's aux as is (empty for the dense FFN)."""
  layer = transformer.TransformerLayer.Params().Set(
      name='layer', norm_policy=norm, is_decoder=is_decoder,
      moe_tpl=_Moe() if use_moe else None, **SHAPE).Instantiate()
  # Non-trivial norm weights so that misplaced norms show.
  theta = layer.theta.Transform(lambda v: v.numpy() + 0.1 * (
      np.arange(v.shape.num_elements()) % 3).reshape(v.shape).astype(
          np.float32))
  x = _Inputs()
  paddings = np.array([[0, 0, 0, 0, 1], [0, 0, 0, 1, 1]], np.float32)
  enc = _Inputs(t=3, seed=1) if is_decoder else None
  enc_pad = np.zeros([2, 3], np.float32) if is_decoder else None
  got, aux = layer.FProp(theta, x, paddings, enc, enc_pad)
  want, want_aux = _Manual(layer, theta, tf.constant(x), paddings, enc,
                           enc_pad)
  np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
  if not use_moe:
    assert aux == NestedMap() and want_aux == NestedMap()
  else:
    assert sorted(aux) == ['aux_groups', 'aux_loss', 'metrics']
    for (k, a), (k2, b) in zip(aux.FlattenItems(), want_aux.FlattenItems()):
      assert k == k2
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, err_msg=k)


def test_post_norm_stack_output_is_normalised():
  stack = _Stack(num_layers=2, norm_policy='post')
  assert 'final_ln' not in stack.children
  y, _ = stack.FProp(stack.theta, _Inputs(), np.zeros([2, 5], np.float32))
  np.testing.assert_allclose(y.numpy().mean(-1), 0.0, atol=1e-5)


@pytest.mark.parametrize('use_moe', [False, True])
def test_decoder_extend_step_equals_fprop(use_moe):
  stack = _Stack(num_layers=2, is_decoder=True,
                 moe_tpl=_Moe() if use_moe else None)
  x = _Inputs(t=4)
  enc = _Inputs(t=3, seed=1)
  enc_pad = np.array([[0, 0, 1], [0, 0, 0]], np.float32)
  full, _ = stack.FProp(stack.theta, x, np.zeros([2, 4], np.float32), enc,
                        enc_pad)
  caches = stack.InitCache(2, 4)
  kvs = stack.CrossKeyValues(stack.theta, enc)
  cross_mask = attention.PaddingMask(enc_pad, 1)
  for t in range(4):
    mask = np.tile((np.arange(4) <= t)[None, None], [2, 1, 1]).astype(
        np.float32)
    out, caches = stack.ExtendStep(stack.theta, x[:, t:t + 1], caches,
                                   tf.constant([t]), mask, kvs, cross_mask)
    np.testing.assert_allclose(out.numpy()[:, 0], full.numpy()[:, t],
                               atol=1e-5)


def test_residual_dropout_is_stateless_per_step_and_layer():
  stack = _Stack(num_layers=2, residual_dropout_prob=0.3)
  x, pad = _Inputs(), np.zeros([2, 5], np.float32)

  def run(step):
    return stack.FProp(stack.theta, x, pad, step=step)[0].numpy()

  np.testing.assert_array_equal(run(5), run(5))
  assert np.abs(run(5) - run(6)).max() > 1e-3
  inference = transformer.TransformerStack.Params().Set(
      name='stack', num_layers=2, residual_dropout_prob=0.3,
      is_inference=True, **SHAPE).Instantiate()
  no_drop = _Stack(num_layers=2)
  np.testing.assert_allclose(
      inference.FProp(stack.theta, x, pad, step=5)[0].numpy(),
      no_drop.FProp(stack.theta, x, pad)[0].numpy(), atol=1e-6)
  # Each dropout layer has its own seed (from its path).
  seeds = {d.layer_seed for d in stack.AllLayers()
           if isinstance(d, dropout.DropoutLayer)}
  assert len(seeds) == 2 * 4  # 2 layers x (2 residual + atten + relu).


def test_dropout_mask_statistics():
  layer = dropout.DropoutLayer.Params().Set(name='d',
                                            dropout_prob=0.25).Instantiate()
  y = layer.FProp(layer.theta, tf.ones([200, 100]), step=3).numpy()
  assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
  assert abs((y == 0).mean() - 0.25) < 0.02
  with pytest.raises(ValueError, match=r'dropout_prob must be in \[0, 1\)'):
    dropout.DropoutLayer.Params().Set(dropout_prob=1.0).Instantiate()


def test_norm_policy_is_checked():
  with pytest.raises(ValueError, match=r": norm_policy must be one of "
                     r"\('pre', 'post'\), got 'sandwich'$"):
    _Stack(num_layers=1, norm_policy='sandwich')
