"""AmoebaNet's normal and reduction cells (GPipe §4.1's image model).

Genotypes: Real, Aggarwal, Huang and Le 2019, "Regularized Evolution for
Image Classifier Architecture Search" (AAAI; arXiv 1802.01548), as its
authors released them with the Cloud TPU reference model
(tensorflow/tpu models/official/amoeba_net/model_specs.py:
`amoeba_net_b` = evol_net_h, `amoeba_net_d` = evol_net_x). GPipe trains
AmoebaNet-B(18, 512) (557M parameters) and measures AmoebaNet-D(L, D)
(Tables 1-3).

A cell takes two inputs, x = the previous cell's output [B, H, W, Cx] and
x_prev = the previous-but-one's [B, H', W', Cp] (None for the first cell:
then x is used), and builds hidden states, F being the cell's filters:

    h0 = BN(conv1x1(relu(x)))                                   [H, W, F]
    h1 = x_prev adapted to h0: relu + factorized reduction to F when
         (H', W') = 2 (H, W); relu + 1x1 conv + BN when only Cp != F;
         as is otherwise (the first cell: x as is)
    h_{2+i} = op_a(h_a) + op_b(h_b)       i = 0..4: GENOTYPES[g][kind]
    y = concat(h_k for k in the cell's concat list)   [H/s, W/s, n F]

`(op, a)` pairs are listed two per combination; a reduction cell (s = 2)
applies stride 2 to every op whose input is h0 or h1 (the others read
already reduced states). Reduction cells get twice the filters of the
group before them (the classifier, models/amoebanet_model.py), so they halve
H and W and double F; their concat lists have no h0 / h1.

Ops (convolutions have no bias: the BN after them has beta; F the cell's
filters, C the op's input channels):
  none             identity; relu + 1x1 conv (stride s) + BN when s = 2
                   or C != F
  1x1              relu + 1x1 conv (stride s) + BN
  3x3, 1x7_7x1     bottleneck: relu + 1x1 conv to F/4 + BN; relu + 3x3
                   conv (stride s) + BN (1x7_7x1: relu + 1x7 conv (stride
                   (1, s)) + BN, relu + 7x1 conv (stride (s, 1)) + BN);
                   relu + 1x1 conv to F + BN
  max_pool_KxK, avg_pool_KxK   SAME pooling (stride s); then 1x1 conv + BN
                   when C != F
  separable_KxK_2  twice: relu + depthwise-separable KxK conv to F (the
                   first with stride s) + BN
  dil_2_separable_5x5_2  AmoebaNet-B's dilated op, here undilated
                   (separable_5x5_2), as in the reference model (its op
                   parser reads the kernel size only); the weights are the
                   same either way (SeparableConv2DLayer has no dilation).

Factorized reduction (Zoph et al. 2018, NASNet), of an even-sized input:
two 1x1 convs to F/2 of the even and of the odd pixels (x[::2, ::2] and
x[1::2, 1::2]), concatenated, then BN. A reduction cell needs even H and W
(so that every reduction halves exactly); the reference model's drop-path
and auxiliary head are not built.

Cells take `paddings` [B] (1.0 = a padded example, left out of every BN's
statistics, as resnet.ResidualBlock) and check their input shapes against
the shapes derived at build time (`input_shape`, `prev_shape`,
`OutputShape()`).

Sharding (data parallelism): every activation's batch dim over the logical
'batch' axis (the convolutions' and pools' `out` mappings; the cell's
concatenated output by its own `activation_split_dims_mapping.out`); every
weight (conv filters, BN gamma/beta/moving) replicated.
"""

import re

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import batch_norm
from lingshard.layers import conv
from lingshard.layers import kinks
from lingshard.layers import pooling
from lingshard.layers import resnet
from lingshard.layers import separable_conv

# Per genotype: `normal` / `reduction` = ten (op, input state) pairs, two
# per combination (h2 ... h6); `*_concat` = the states concatenated (the
# reference's `used_hiddenstates` zeros).
GENOTYPES = {
    'B': dict(
        normal=(('1x1', 1), ('max_pool_3x3', 1),
                ('none', 1), ('separable_3x3_2', 0),
                ('1x1', 1), ('separable_3x3_2', 0),
                ('1x1', 2), ('none', 2),
                ('avg_pool_3x3', 1), ('1x1', 5)),
        normal_concat=(0, 3, 4, 6),
        reduction=(('max_pool_2x2', 0), ('max_pool_3x3', 0),
                   ('none', 2), ('3x3', 1),
                   ('dil_2_separable_5x5_2', 2), ('max_pool_3x3', 2),
                   ('none', 3), ('separable_3x3_2', 1),
                   ('avg_pool_3x3', 4), ('1x1', 3)),
        reduction_concat=(5, 6)),
    'D': dict(
        normal=(('1x1', 1), ('max_pool_3x3', 1),
                ('none', 1), ('1x7_7x1', 0),
                ('1x1', 0), ('1x7_7x1', 0),
                ('max_pool_3x3', 2), ('none', 2),
                ('avg_pool_3x3', 1), ('1x1', 5)),
        normal_concat=(0, 3, 4, 6),
        reduction=(('max_pool_2x2', 0), ('max_pool_3x3', 0),
                   ('none', 2), ('3x3', 1),
                   ('1x7_7x1', 2), ('max_pool_3x3', 2),
                   ('none', 3), ('max_pool_2x2', 1),
                   ('avg_pool_3x3', 2), ('1x1', 3)),
        reduction_concat=(4, 5, 6)),
}
NUM_COMBINATIONS = 5

_POOL_RE = re.compile(r'^(max|avg)_pool_(\d)x(\d)$')
_SEPARABLE_RE = re.compile(r'^(?:dil_\d_)?separable_(\d)x(\d)_(\d)$')


def Concat(genotype, reduction):
  """The states a cell of `genotype` concatenates."""
  return GENOTYPES[genotype]['reduction_concat' if reduction else
                             'normal_concat']


def CellOutputShape(genotype, reduction, filters, input_shape):
  """(H, W, C) of a cell's output from its input x's (H, W, C)."""
  h, w, _ = input_shape
  s = 2 if reduction else 1
  return (h // s, w // s, len(Concat(genotype, reduction)) * filters)


def _CheckShape(layer, x, want, what):
  if tuple(x.shape[1:]) != tuple(want) or x.shape.rank != 4:
    raise ValueError(f'{layer.path}: {what} must be [B, {want[0]}, {want[1]}, '
                     f'{want[2]}], got {list(x.shape)}')


class ReluConvBnLayer(base_layer.BaseLayer):
  """`[B, H, W, Cin] -> [B, H', W', Cout]`: BN(conv(relu(x))), the conv
  plain or depthwise-separable (multiplier 1), without bias."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Cin.')
    p.Define('output_dim', 0, 'Cout.')
    p.Define('kernel_size', (1, 1), '(KH, KW).')
    p.Define('stride', (1, 1), '(SH, SW).')
    p.Define('separable', False, 'A depthwise-separable conv.')
    p.Define('relu', True, 'relu before the conv.')
    p.Define('bn_decay', 0.99, 'BatchNormLayer.decay.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'output_dim')
    if p.separable:
      self.CreateChild('conv', separable_conv.SeparableConv2DLayer.Params().Set(
          input_dim=p.input_dim, output_dim=p.output_dim,
          kernel_size=tuple(p.kernel_size), filter_stride=tuple(p.stride),
          has_bias=False))
    else:
      self.CreateChild('conv', conv.Conv2DLayer.Params().Set(
          filter_shape=(*p.kernel_size, p.input_dim, p.output_dim),
          filter_stride=tuple(p.stride), has_bias=False))
    self.CreateChild('bn', batch_norm.BatchNormLayer.Params().Set(
        input_dim=p.output_dim, decay=p.bn_decay))

  def FProp(self, theta, x, paddings=None):
    """x [B, H, W, Cin], paddings None or [B] -> [B, H', W', Cout]."""
    if self.params.relu:
      x = kinks.Relu(x)
    h = self.conv.FProp(theta.conv, x)
    return self.bn.FProp(theta.bn, h, resnet.ImagePaddings(paddings, h))


class FactorizedReductionLayer(base_layer.BaseLayer):
  """`[B, 2H, 2W, Cin] -> [B, H, W, F]`: relu, then the even and the odd
  pixels each through a 1x1 conv to F/2, concatenated, BN (module doc)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Cin.')
    p.Define('output_dim', 0, 'F (even).')
    p.Define('bn_decay', 0.99, 'BatchNormLayer.decay.')
    p.activation_split_dims_mapping.Define(
        'out', [base_layer.BATCH, -1, -1, -1],
        'Mapping of the concatenated paths [B, H, W, F]: batch over data.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'output_dim')
    if p.output_dim % 2:
      raise ValueError(f'{p.name}: a factorized reduction needs an even '
                       f'output_dim, got {p.output_dim}')
    half = (1, 1, p.input_dim, p.output_dim // 2)
    for name in ('conv_even', 'conv_odd'):
      self.CreateChild(name, conv.Conv2DLayer.Params().Set(
          filter_shape=half, filter_stride=(2, 2), has_bias=False))
    self.CreateChild('bn', batch_norm.BatchNormLayer.Params().Set(
        input_dim=p.output_dim, decay=p.bn_decay))

  def FProp(self, theta, x, paddings=None):
    """x [B, 2H, 2W, Cin] (even sizes), paddings None or [B]."""
    h, w = x.shape[1], x.shape[2]
    if h % 2 or w % 2:
      raise ValueError(f'{self.path}: a factorized reduction needs even H '
                       f'and W, got [{h}, {w}]')
    x = kinks.Relu(x)
    # A stride-2 1x1 conv reads pixels (0, 0), (0, 2), ...; from x[1:, 1:]
    # the odd ones (1, 1), (1, 3), ...
    even = self.conv_even.FProp(theta.conv_even, x)
    odd = self.conv_odd.FProp(theta.conv_odd, x[:, 1:, 1:, :])
    y = self.ShardActivation(tf.concat([even, odd], axis=-1), 'out')
    return self.bn.FProp(theta.bn, y, resnet.ImagePaddings(paddings, y))


def _OpPlan(op, input_dim, filters, stride):
  """(pool (type, (KH, KW)) or None, [ReluConvBnLayer params]) of an op."""
  s = (stride, stride)

  def Unit(cin, cout, kernel=(1, 1), strides=(1, 1), **kw):
    return ReluConvBnLayer.Params().Set(
        input_dim=cin, output_dim=cout, kernel_size=kernel, stride=strides,
        **kw)

  if op in ('none', '1x1'):
    if op == '1x1' or stride > 1 or input_dim != filters:
      return None, [Unit(input_dim, filters, strides=s)]
    return None, []
  pool = _POOL_RE.match(op)
  if pool:
    kind, kh, kw = pool.groups()
    units = ([] if input_dim == filters else
             [Unit(input_dim, filters, relu=False)])
    return (kind.upper(), (int(kh), int(kw))), units
  sep = _SEPARABLE_RE.match(op)
  if sep:
    kh, kw, num = (int(v) for v in sep.groups())
    return None, [Unit(input_dim if i == 0 else filters, filters, (kh, kw),
                       s if i == 0 else (1, 1), separable=True)
                  for i in range(num)]
  if op in ('3x3', '1x7_7x1'):
    mid = filters // 4
    if op == '3x3':
      core = lambda cin, cout: [Unit(cin, cout, (3, 3), s)]  # noqa: E731
    else:
      core = lambda cin, cout: [  # noqa: E731
          Unit(cin, cout, (1, 7), (1, stride)),
          Unit(cout, cout, (7, 1), (stride, 1))]
    if mid < 1:  # Too few filters for a bottleneck.
      return None, core(input_dim, filters)
    return None, ([Unit(input_dim, mid)] + core(mid, mid) +
                  [Unit(mid, filters)])
  raise ValueError(f'unknown AmoebaNet op {op!r}')


class CellOpLayer(base_layer.BaseLayer):
  """One op of a cell (module docstring): `[B, H, W, C] -> [B, H/s, W/s,
  F]`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('op', 'none', 'The op name (module docstring).')
    p.Define('input_dim', 0, 'C: the input state\'s channels.')
    p.Define('filters', 0, 'F: the output channels.')
    p.Define('stride', 1, 's: 1 or 2.')
    p.Define('bn_decay', 0.99, 'BatchNormLayer.decay.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'filters')
    self.CheckOneOf('stride', (1, 2))
    try:
      pool, units = _OpPlan(p.op, p.input_dim, p.filters, p.stride)
    except ValueError as e:
      raise ValueError(f'{p.name}: {e}') from None
    self._has_pool = pool is not None
    if pool is not None:
      self.CreateChild('pool', pooling.PoolingLayer.Params().Set(
          pooling_type=pool[0], window_shape=pool[1],
          window_stride=(p.stride, p.stride), padding='SAME'))
    self._num_units = len(units)
    if units:
      self.CreateChildren('units', [u.Set(bn_decay=p.bn_decay)
                                    for u in units])

  def FProp(self, theta, x, paddings=None):
    if self._has_pool:
      x = self.pool.FProp(None, x)
    for unit, unit_theta in zip(self.children.get('units', []),
                                theta.get('units', [])):
      x = unit.FProp(unit_theta, x, paddings)
    return x


class AmoebaCell(base_layer.BaseLayer):
  """An AmoebaNet normal or reduction cell (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('genotype', 'D', 'A key of GENOTYPES (B or D).')
    p.Define('reduction', False, 'A reduction cell (stride 2).')
    p.Define('filters', 0, 'F: every op\'s output channels.')
    p.Define('input_shape', (0, 0, 0), '(H, W, C) of x, the previous cell\'s '
             'output.')
    p.Define('prev_shape', None, '(H, W, C) of x_prev, the previous-but-one '
             'cell\'s output; None: none (the first cell).')
    p.Define('bn_decay', 0.99, 'Every BatchNormLayer.decay.')
    p.activation_split_dims_mapping.Define(
        'out', [base_layer.BATCH, -1, -1, -1],
        'Mapping of the output [B, H, W, n F]: batch over data.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckOneOf('genotype', tuple(sorted(GENOTYPES)))
    self.CheckPositive('filters')
    shape = tuple(p.input_shape)
    if len(shape) != 3 or min(shape) <= 0:
      raise ValueError(f'{p.name}: input_shape must be 3 positive ints '
                       f'(H, W, C), got {p.input_shape!r}')
    h, w, c = shape
    f = p.filters
    if p.reduction and (h % 2 or w % 2):
      raise ValueError(f'{p.name}: a reduction cell needs even H and W, got '
                       f'input_shape {list(shape)}')
    self._stride = 2 if p.reduction else 1
    self.CreateChild('base', ReluConvBnLayer.Params().Set(
        input_dim=c, output_dim=f, bn_decay=p.bn_decay))
    # States' channels (h0, h1); ops bring every later state to F.
    dims = [f, self._AdaptPrev(shape)]
    genotype = GENOTYPES[p.genotype]['reduction' if p.reduction else 'normal']
    ops = []
    for i, (op, state) in enumerate(genotype):
      ops.append(CellOpLayer.Params().Set(
          op=op, input_dim=dims[state], filters=f,
          stride=self._stride if state < 2 else 1, bn_decay=p.bn_decay))
      if i % 2:
        dims.append(f)
    self.CreateChildren('ops', ops)
    self._genotype = genotype
    self._concat = Concat(p.genotype, p.reduction)

  def _AdaptPrev(self, shape):
    """Creates the x_prev adapter (module doc); returns h1's channels."""
    p = self.params
    h, w, c = shape
    if p.prev_shape is None:
      self._prev_mode = 'x'
      return c
    prev = tuple(p.prev_shape)
    if len(prev) != 3 or min(prev) <= 0:
      raise ValueError(f'{p.name}: prev_shape must be 3 positive ints (H, W, '
                       f'C) or None, got {p.prev_shape!r}')
    if prev[:2] == (2 * h, 2 * w):
      self._prev_mode = 'reduce'
      self.CreateChild('prev', FactorizedReductionLayer.Params().Set(
          input_dim=prev[2], output_dim=p.filters, bn_decay=p.bn_decay))
      return p.filters
    if prev[:2] != (h, w):
      raise ValueError(f'{p.name}: prev_shape {list(prev)} must have the H '
                       f'and W of input_shape {list(shape)} or twice them')
    if prev[2] == p.filters:
      self._prev_mode = 'as_is'
      return prev[2]
    self._prev_mode = 'conv'
    self.CreateChild('prev', ReluConvBnLayer.Params().Set(
        input_dim=prev[2], output_dim=p.filters, bn_decay=p.bn_decay))
    return p.filters

  def OutputShape(self):
    """(H, W, C) of the output."""
    p = self.params
    return CellOutputShape(p.genotype, p.reduction, p.filters, p.input_shape)

  def FProp(self, theta, x, x_prev=None, paddings=None):
    """x [B, H, W, C], x_prev [B, H', W', C'] (None in the first cell),
    paddings None or [B] -> [B, H/s, W/s, n F]."""
    p = self.params
    _CheckShape(self, x, p.input_shape, 'x')
    if p.prev_shape is None:
      if x_prev is not None:
        raise ValueError(f'{self.path}: the first cell (prev_shape None) '
                         'takes no x_prev')
      h1 = x
    else:
      if x_prev is None:
        raise ValueError(f'{self.path}: x_prev is required (prev_shape '
                         f'{list(p.prev_shape)})')
      _CheckShape(self, x_prev, p.prev_shape, 'x_prev')
      h1 = (x_prev if self._prev_mode == 'as_is' else
            self.prev.FProp(theta.prev, x_prev, paddings))
    states = [self.base.FProp(theta.base, x, paddings), h1]
    for i in range(NUM_COMBINATIONS):
      pair = []
      for j in (2 * i, 2 * i + 1):
        state = self._genotype[j][1]
        pair.append(self.ops[j].FProp(theta.ops[j], states[state], paddings))
      states.append(tf.cast(pair[0], pair[1].dtype) + pair[1])
    y = tf.concat([tf.cast(states[k], states[-1].dtype)
                   for k in self._concat], axis=-1)
    return self.ShardActivation(y, 'out')
