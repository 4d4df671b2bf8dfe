"""The dense position-wise feed-forward layer of a Transformer.

`y = relu(x wi + bi) wo + bo`, einsums `btm,mh->bth` and `bth,hm->btm`
(Vaswani et al. 2017 §3.3; GShard §2.1 calls each MoE expert an FFN of this
shape). Only the FFN itself: the Transformer layer adds layer norm,
residual and residual dropout. Weights replicated, activations batch split
(GShard Figure 3(c)).

The FFN contract (shared with every MoE layer, moe.MoEBase):

    y, aux = ffn.FProp(theta, x, paddings, step=None, token_offset=0)

x [B, T, M], paddings [B, T] float (1.0 = pad); y [B, T, M]. `aux` is the
layer's contribution to the task: NestedMap(aux_loss=float32 scalar,
already weighted, aux_groups=what aux_loss averages over (optional; a
pipeline's micro-batch weights, pipeline_aux), metrics=NestedMap of
float32 scalars/vectors), or an empty NestedMap when the layer adds
nothing (this dense FFN). The task adds every layer's aux_loss to its
loss as is. token_offset: the global index of the batch's first token, or
an int [B] vector of each row's first token.
"""

from lingshard.layers import base_layer
from lingshard.layers import dropout
from lingshard.layers import linear
from lingshard.nested_map import NestedMap


class FeedForward(base_layer.BaseLayer):
  """Two linear layers with an activation (and its dropout) between."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Model dim M.')
    p.Define('hidden_dim', 0, 'Hidden dim H.')
    p.Define('activation', 'relu', 'Hidden activation (linear.ACTIVATIONS).')
    p.Define('activation_dropout_prob', 0.0, 'Dropout on the hidden units.')
    p.weight_split_dims_mapping.Define('wi', [-1, -1], 'wi [M, H].')
    p.weight_split_dims_mapping.Define('bi', [-1], 'bi [H].')
    p.weight_split_dims_mapping.Define('wo', [-1, -1], 'wo [H, M].')
    p.weight_split_dims_mapping.Define('bo', [-1], 'bo [M].')
    p.activation_split_dims_mapping.Define('bth', [base_layer.BATCH, -1, -1],
                                           'Hidden [B, T, H]: batch split.')
    p.activation_split_dims_mapping.Define('btm', [base_layer.BATCH, -1, -1],
                                           'Output [B, T, M]: batch split.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    wsd = p.weight_split_dims_mapping
    asd = p.activation_split_dims_mapping
    for name, (i, o, act, w, b, out) in {
        'fc_in': (p.input_dim, p.hidden_dim, p.activation, wsd.wi, wsd.bi,
                  asd.bth),
        'fc_out': (p.hidden_dim, p.input_dim, 'none', wsd.wo, wsd.bo,
                   asd.btm)}.items():
      lp = linear.LinearLayer.Params().Set(input_dim=i, output_dim=o,
                                           activation=act)
      lp.weight_split_dims_mapping.Set(w=w, b=b)
      lp.activation_split_dims_mapping.out = out
      self.CreateChild(name, lp)
    self.CreateChild('dropout', dropout.DropoutLayer.Params().Set(
        dropout_prob=p.activation_dropout_prob))

  def FProp(self, theta, inputs, paddings=None, step=None, token_offset=0):
    """inputs [B, T, M] -> ([B, T, M], empty aux); `step` keys the dropout.

    paddings and token_offset are unused (the FFN contract's arguments).
    """
    del paddings, token_offset
    h_bth = self.fc_in.FProp(theta.fc_in, inputs)
    h_bth = self.dropout.FProp(theta.dropout, h_bth, step=step)
    return self.fc_out.FProp(theta.fc_out, h_bth), NestedMap()
