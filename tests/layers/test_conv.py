"""Convolution and pooling layers against plain numpy loops."""

import numpy as np
import pytest

from lingshard.layers import conv
from lingshard.layers import pooling
from lingshard.layers import separable_conv


def _Images(b=2, h=7, w=6, c=3, seed=0):
  return np.random.RandomState(seed).normal(size=[b, h, w, c]).astype(
      np.float32)


def _Padded(x, kh, kw, sh, sw, padding, fill=0.0):
  """x padded by TensorFlow's rule; returns (padded, out_h, out_w)."""
  _, h, w, _ = x.shape
  if padding == 'VALID':
    return x, (h - kh) // sh + 1, (w - kw) // sw + 1
  oh, ow = -(-h // sh), -(-w // sw)
  ph = max((oh - 1) * sh + kh - h, 0)
  pw = max((ow - 1) * sw + kw - w, 0)
  pads = [(0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)]
  return np.pad(x, pads, constant_values=fill), oh, ow


def _ConvLoop(x, w, sh, sw, padding):
  kh, kw, _, cout = w.shape
  xp, oh, ow = _Padded(x, kh, kw, sh, sw, padding)
  y = np.zeros([x.shape[0], oh, ow, cout], np.float64)
  for b in range(x.shape[0]):
    for i in range(oh):
      for j in range(ow):
        for u in range(kh):
          for v in range(kw):
            y[b, i, j] += xp[b, i * sh + u, j * sw + v] @ w[u, v]
  return y


@pytest.mark.parametrize('stride,padding', [((1, 1), 'SAME'), ((2, 2), 'SAME'),
                                            ((2, 1), 'VALID')])
def test_conv2d_equals_a_numpy_loop(stride, padding):
  layer = conv.Conv2DLayer.Params().Set(
      name='conv', filter_shape=(3, 2, 3, 4), filter_stride=stride,
      padding=padding, activation='relu').Instantiate()
  theta = layer.theta
  theta.b.assign(np.arange(4, dtype=np.float32) * 0.1)
  x = _Images()
  y = layer.FProp(layer.theta, x).numpy()
  want = np.maximum(_ConvLoop(x, theta.w.numpy(), *stride, padding) +
                    theta.b.numpy(), 0.0)
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_conv2d_init_is_he_scaled_and_bad_params_are_one_line():
  layer = conv.Conv2DLayer.Params().Set(
      name='conv', filter_shape=(3, 3, 16, 64)).Instantiate()
  std = float(np.std(layer.theta.w.numpy()))
  assert abs(std - np.sqrt(2.0 / (9 * 16))) < 0.1 * np.sqrt(2.0 / (9 * 16))
  with pytest.raises(ValueError, match=r'^conv: filter_shape must be 4 '
                     r'positive ints \(KH, KW, Cin, Cout\), got \(3, 3, 0, 4\)$'):
    conv.Conv2DLayer.Params().Set(name='conv',
                                  filter_shape=(3, 3, 0, 4)).Instantiate()
  with pytest.raises(ValueError, match=r'^conv: filter_stride must be two '
                     r'positive ints, got \(0, 1\)$'):
    conv.Conv2DLayer.Params().Set(name='conv', filter_shape=(3, 3, 1, 4),
                                  filter_stride=(0, 1)).Instantiate()
  with pytest.raises(ValueError, match=r'input must be \[B, H, W, 16\]'):
    layer.FProp(layer.theta, _Images(c=3))


@pytest.mark.parametrize('stride,padding', [((1, 1), 'SAME'),
                                            ((2, 2), 'VALID')])
def test_separable_conv_is_a_per_channel_loop_then_a_projection(stride,
                                                                padding):
  layer = separable_conv.SeparableConv2DLayer.Params().Set(
      name='sep', input_dim=3, output_dim=5, kernel_size=(3, 3), multiplier=2,
      filter_stride=stride, padding=padding).Instantiate()
  theta = layer.theta
  theta.b.assign(np.linspace(-1, 1, 5).astype(np.float32))
  x = _Images()
  dw, pw = theta.dw.numpy(), theta.pw.numpy()
  # Channel c's m-th filter: a [KH, KW, 1, 1] convolution of channel c.
  parts = []
  for c in range(3):
    for m in range(2):
      parts.append(_ConvLoop(x[..., c:c + 1], dw[:, :, c:c + 1, m:m + 1],
                             *stride, padding))
  d = np.concatenate(parts, axis=-1)
  want = d @ pw + theta.b.numpy()
  y = layer.FProp(theta, x).numpy()
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _PoolLoop(x, k, s, padding, kind):
  fill = -np.inf if kind == 'MAX' else np.nan
  xp, oh, ow = _Padded(x, *k, *s, padding, fill=fill)
  y = np.zeros([x.shape[0], oh, ow, x.shape[3]])
  for i in range(oh):
    for j in range(ow):
      win = xp[:, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
      y[:, i, j] = (win.max(axis=(1, 2)) if kind == 'MAX' else
                    np.nanmean(win, axis=(1, 2)))
  return y


@pytest.mark.parametrize('kind', ['MAX', 'AVG'])
@pytest.mark.parametrize('padding', ['SAME', 'VALID'])
def test_pooling_equals_a_numpy_loop(kind, padding):
  layer = pooling.PoolingLayer.Params().Set(
      name='pool', window_shape=(3, 2), window_stride=(2, 2),
      padding=padding, pooling_type=kind).Instantiate()
  x = _Images()
  np.testing.assert_allclose(layer.FProp(None, x).numpy(),
                             _PoolLoop(x, (3, 2), (2, 2), padding, kind),
                             rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"^pool: pooling_type must be one of "
                     r"\('MAX', 'AVG'\), got 'MIN'$"):
    pooling.PoolingLayer.Params().Set(name='pool',
                                      pooling_type='MIN').Instantiate()


def test_global_average_pool_is_the_spatial_mean():
  layer = pooling.GlobalAvgPoolLayer.Params().Set(name='gap').Instantiate()
  x = _Images()
  want = np.array([[x[b, :, :, c].sum() / (7 * 6) for c in range(3)]
                   for b in range(2)])
  np.testing.assert_allclose(layer.FProp(None, x).numpy(), want, rtol=1e-5)
