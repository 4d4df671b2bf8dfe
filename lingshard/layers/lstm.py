"""LSTM with forget gates (Hochreiter & Schmidhuber 1997; Gers et al. 2000)
and an optional output projection (LSTMP, Sak et al. 2014: Shazeer et al.
2017 App. C's LSTM-2048-512).

Einsum letters: b batch, t time, d input dim, g the 4 gates (input i,
forget f, output o, candidate j), c cells, p output dim (= c without a
projection). Per step t:

  z_bgc = x_bd w_dgc + h_bp u_pgc + b_gc
  c_t = sigmoid(f + forget_gate_bias) * c_{t-1} + sigmoid(i) * tanh(j)
        (clipped to +-cell_clip when cell_clip > 0)
  m_t = sigmoid(o) * tanh(c_t);   h_t = m_t w_cp (projection) or m_t

x w of every step is one matmul before the recurrence (its cost does not
depend on the sequential loop); the recurrence is a `tf.scan` over time,
which XLA compiles as one while loop with static shapes. A padded step
(paddings 1.0) keeps the previous state and outputs zeros, so padding at
the end of a sequence changes nothing before it.

No fused TF kernel: CudnnLSTM / the Keras LSTM own their weights in an
opaque layout (and cuDNN is GPU-only); `BlockLSTMV2` takes explicit
weights and its forward equals this layer's (gate order i, f, j, o), but
its registered gradient does not (on a 4 -> 6 cell toy: max |diff| 2.2 in
the w gradient, whose max entry is 2.2), and it has no XLA lowering.
"""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.weight_init import WeightInit

_GATES = 4  # i, f, o, j.


class LSTMLayer(base_layer.BaseLayer):
  """One LSTM layer over a whole sequence: [B, T, D] -> [B, T, P]."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input dim D.')
    p.Define('num_cells', 0, 'Cells C.')
    p.Define('num_output_nodes', 0, 'Projection dim P; 0 = no projection '
             '(P = C).')
    p.Define('forget_gate_bias', 1.0, 'Added to the forget gate (Gers et '
             'al. 2000: start by remembering).')
    p.Define('cell_clip', 0.0, 'Clip the cell state to +-cell_clip; 0 = '
             'no clipping.')
    p.weight_split_dims_mapping.Define('w', None, 'Mapping of w [D, 4, C].')
    p.weight_split_dims_mapping.Define('u', None, 'Mapping of u [P, 4, C].')
    p.weight_split_dims_mapping.Define('b', None, 'Mapping of b [4, C].')
    p.weight_split_dims_mapping.Define('proj', None,
                                       'Mapping of proj [C, P].')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'num_cells')
    if p.num_output_nodes < 0:
      raise ValueError(f'{p.name}: num_output_nodes must be >= 0, got '
                       f'{p.num_output_nodes}')
    c = p.num_cells
    self.CreateVariable('w', base_layer.WeightParams([p.input_dim, _GATES, c]))
    self.CreateVariable('u', base_layer.WeightParams(
        [self.output_dim, _GATES, c]))
    self.CreateVariable('b', base_layer.WeightParams(
        [_GATES, c], init=WeightInit.Constant(0.0)))
    if p.num_output_nodes:
      self.CreateVariable('proj', base_layer.WeightParams(
          [c, p.num_output_nodes]))

  @property
  def output_dim(self):
    """P: the projection dim, or C without a projection."""
    return self.params.num_output_nodes or self.params.num_cells

  def FProp(self, theta, inputs_btd, paddings_bt):
    """inputs [B, T, D], paddings [B, T] (1.0 = pad) -> outputs [B, T, P]."""
    p = self.params
    dtype = self.fprop_dtype
    x_btd = tf.cast(inputs_btd, dtype)
    w, u, b = (tf.cast(theta[k], dtype) for k in ('w', 'u', 'b'))
    proj = tf.cast(theta.proj, dtype) if p.num_output_nodes else None
    # All steps' input contributions at once; time-major for the scan.
    xw_tbgc = tf.einsum('btd,dgc->tbgc', x_btd, w) + b
    pad_tb1 = tf.transpose(tf.cast(paddings_bt, dtype))[..., tf.newaxis]
    batch = tf.shape(x_btd)[0]
    forget_bias = tf.constant(p.forget_gate_bias, dtype)

    def Step(state, elems):
      c_bc, h_bp, _ = state
      xw_bgc, pad_b1 = elems
      z_bgc = xw_bgc + tf.einsum('bp,pgc->bgc', h_bp, u)
      i, f, o, j = tf.unstack(z_bgc, num=_GATES, axis=1)
      new_c = tf.sigmoid(f + forget_bias) * c_bc + tf.sigmoid(i) * tf.tanh(j)
      if p.cell_clip > 0:
        new_c = tf.clip_by_value(new_c, -p.cell_clip, p.cell_clip)
      new_h = tf.sigmoid(o) * tf.tanh(new_c)
      if proj is not None:
        new_h = tf.einsum('bc,cp->bp', new_h, proj)
      keep = 1.0 - pad_b1
      c_bc = keep * new_c + pad_b1 * c_bc
      h_bp = keep * new_h + pad_b1 * h_bp
      return c_bc, h_bp, keep * new_h

    init = (tf.zeros([batch, p.num_cells], dtype),
            tf.zeros([batch, self.output_dim], dtype),
            tf.zeros([batch, self.output_dim], dtype))
    _, _, out_tbp = tf.scan(Step, (xw_tbgc, pad_tb1), initializer=init)
    return tf.transpose(out_tbp, [1, 0, 2])
