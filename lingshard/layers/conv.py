"""2-D convolution on `[B, H, W, C]` images (NHWC).

`y[b, i, j, o] = act(sum_{u, v, c} x[b, s i + u - p_h, s j + v - p_w, c]
w[u, v, c, o] + b[o])` (einsum-like letters: `bhwc,uvco->bhwo`), with
TensorFlow's SAME (output ceil(H / s), the padding split with the extra row
after) or VALID padding.

`impl`: 'conv2d' is tf.nn.conv2d; 'patches' computes the same sum as
KH KW Cin patches times the filter, `p[b, i, j, (u KW + v) Cin + c] =
x[b, s i + u - p_h, s j + v - p_w, c]` (a pad, KH KW static strided
slices and a concat) and then `bhwk,ko->bhwo` with w as [KH KW Cin,
Cout]. `tf.vectorized_map` has no vectorised Conv2D for a filter that
differs per iteration (nor a depthwise one for a shared filter): it falls
back to a while loop over the iterations, which XLA SPMD can only run by
gathering the stacked filters; pads, slices, concats and einsums
vectorise. A GPipe body's stages run vectorised over the stacked [K, ...]
weights (layers/pipeline.py), so a pipelined body on a mesh uses
'patches' (models/image_model.py). It holds KH KW times the input.

Sharding: the batch dim B of the output is split over the logical 'batch'
axis (data parallelism; `activation_split_dims_mapping.out`, default
['batch', -1, -1, -1]); the filter w [KH, KW, Cin, Cout] and bias [Cout]
are replicated by default (`weight_split_dims_mapping.w` may split Cout,
e.g. [-1, -1, -1, 'model']).
"""

import math

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import linear
from lingshard.weight_init import WeightInit

PADDINGS = ('SAME', 'VALID')
IMPLS = ('conv2d', 'patches')


def CheckPair(layer, name):
  """One-line ValueError unless params `name` is two positive ints."""
  value = layer.params.Get(name)
  if (not isinstance(value, (list, tuple)) or len(value) != 2 or
      any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
          for v in value)):
    raise ValueError(f'{layer.params.name}: {name} must be two positive ints, got '
                     f'{value!r}')


def CheckImageInput(layer, x, channels):
  """x must be [B, H, W, channels]."""
  shape = tuple(x.shape)
  if len(shape) != 4 or shape[-1] != channels:
    raise ValueError(f'{layer.path}: input must be [B, H, W, {channels}], got '
                     f'{list(shape)}')


class Conv2DLayer(base_layer.BaseLayer):
  """`[B, H, W, Cin] -> [B, H', W', Cout]` convolution (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('filter_shape', (3, 3, 0, 0), 'Filter (KH, KW, Cin, Cout).')
    p.Define('filter_stride', (1, 1), 'Strides (SH, SW).')
    p.Define('padding', 'SAME', 'SAME or VALID (TensorFlow\'s rules).')
    p.Define('activation', 'none', 'Activation name (linear.ACTIVATIONS).')
    p.Define('has_bias', True, 'Whether to add a bias [Cout].')
    p.Define('impl', 'conv2d', 'conv2d | patches (module docstring: patches '
             'vectorises over stacked filters, for pipeline bodies).')
    p.weight_split_dims_mapping.Define('w', None, 'Mapping of w [KH, KW, '
                                       'Cin, Cout]; None: replicated on '
                                       'every device.')
    p.weight_split_dims_mapping.Define('b', None, 'Mapping of b [Cout]; '
                                       'None: replicated.')
    p.activation_split_dims_mapping.Define(
        'out', [base_layer.BATCH, -1, -1, -1],
        'Mapping of the output [B, H, W, Cout]: batch over data.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    shape = tuple(p.filter_shape)
    if len(shape) != 4 or any(isinstance(v, bool) or not isinstance(v, int) or
                              v <= 0 for v in shape):
      raise ValueError(f'{p.name}: filter_shape must be 4 positive ints '
                       f'(KH, KW, Cin, Cout), got {p.filter_shape!r}')
    CheckPair(self, 'filter_stride')
    self.CheckOneOf('padding', PADDINGS)
    self.CheckOneOf('impl', IMPLS)
    self._act = linear.Activation(p.activation)
    kh, kw, _, cout = shape
    # He et al. 2015: std sqrt(2 / (KH KW Cin)); Fans gives fan_in = Cin.
    self.CreateVariable('w', base_layer.WeightParams(
        list(shape), init=WeightInit.GaussianSqrtFanIn(
            math.sqrt(2.0 / (kh * kw)))))
    if p.has_bias:
      self.CreateVariable('b', base_layer.WeightParams(
          [cout], init=WeightInit.Constant(0.0)))

  def FProp(self, theta, inputs):
    """inputs [B, H, W, Cin] -> [B, H', W', Cout]."""
    p = self.params
    CheckImageInput(self, inputs, p.filter_shape[2])
    x = tf.cast(inputs, self.fprop_dtype)
    w = tf.cast(theta.w, self.fprop_dtype)
    if p.impl == 'patches':
      y = self._PatchesConv(x, w)
    else:
      y = tf.nn.conv2d(x, w, strides=[1, *p.filter_stride, 1],
                       padding=p.padding)
    if p.has_bias:
      y += tf.cast(theta.b, self.fprop_dtype)
    return self.ShardActivation(self._act(y), 'out')


  def _PatchesConv(self, x, w):
    """impl 'patches' (module docstring): [B, H', W', KH KW Cin] patches
    `bhwk,ko->bhwo` w as [KH KW Cin, Cout]."""
    p = self.params
    kh, kw, cin, cout = p.filter_shape
    (sh, sw), (h, wd) = p.filter_stride, x.shape[1:3]
    pads, outs = [], []
    for size, k, st in ((h, kh, sh), (wd, kw, sw)):
      if p.padding == 'SAME':  # TensorFlow's: the extra row after.
        out = -(-size // st)
        total = max((out - 1) * st + k - size, 0)
        pads.append([total // 2, total - total // 2])
      else:
        out = -(-(size - k + 1) // st)
        pads.append([0, 0])
      outs.append(out)
    xp = tf.pad(x, [[0, 0]] + pads + [[0, 0]])
    # Tap (u, v): x[b, s i + u - p_h, s j + v - p_w, c] for every (i, j);
    # static slices and a concat, which vectorise (tf.vectorized_map).
    taps = [xp[:, u:u + (outs[0] - 1) * sh + 1:sh,
               v:v + (outs[1] - 1) * sw + 1:sw, :]
            for u in range(kh) for v in range(kw)]
    patches = tf.concat(taps, axis=-1)  # [B, H', W', KH KW Cin]
    return tf.einsum('bhwk,ko->bhwo', patches,
                     tf.reshape(w, [kh * kw * cin, cout]))
