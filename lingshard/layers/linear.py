"""A dense projection `y = act(x w + b)` (einsum letters: `...m,mh->...h`)."""

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import kinks
from lingshard.weight_init import WeightInit

ACTIVATIONS = {
    'none': tf.identity,
    'relu': kinks.Relu,  # tf.nn.relu; the SPMD checker's hooks (kinks.py).
    'gelu': tf.nn.gelu,
    'tanh': tf.tanh,
    'sigmoid': tf.sigmoid,
    'silu': tf.nn.silu,
}


_LEAD_LETTERS = 'abcdefgijkl'  # Leading dims of x; never 'm' or 'h'.


def Activation(name):
  """The activation function called `name`; ValueError lists the choices."""
  if name not in ACTIVATIONS:
    raise ValueError(f'Unknown activation {name!r}; one of '
                     f'{", ".join(sorted(ACTIVATIONS))}')
  return ACTIVATIONS[name]


class LinearLayer(base_layer.BaseLayer):
  """Affine projection of the last dim from `input_dim` to `output_dim`."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Input (last) dim M.')
    p.Define('output_dim', 0, 'Output dim H.')
    p.Define('activation', 'none', 'Activation name: ' +
             ', '.join(sorted(ACTIVATIONS)) + '.')
    p.Define('has_bias', True, 'Whether to add a bias.')
    p.weight_split_dims_mapping.Define('w', None, 'Mapping of w [M, H].')
    p.weight_split_dims_mapping.Define('b', None, 'Mapping of b [H].')
    p.activation_split_dims_mapping.Define('out', None,
                                           'Mapping of the output.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('input_dim', 'output_dim')
    self._act = Activation(p.activation)
    self.CreateVariable('w', base_layer.WeightParams(
        [p.input_dim, p.output_dim]))
    if p.has_bias:
      self.CreateVariable('b', base_layer.WeightParams(
          [p.output_dim], init=WeightInit.Constant(0.0)))

  def FProp(self, theta, inputs):
    """inputs [..., M] -> [..., H]."""
    x = tf.cast(inputs, self.fprop_dtype)
    # Named letters, not '...': TF's einsum gradient for an ellipsis only
    # one operand has materialises w's gradient per token ([..., M, H])
    # before summing (tests/layers/test_linear.py checks the HLO).
    lead = _LEAD_LETTERS[:x.shape.rank - 1]
    y = tf.einsum(f'{lead}m,mh->{lead}h', x,
                  tf.cast(theta.w, self.fprop_dtype))
    if self.params.has_bias:
      y += tf.cast(theta.b, self.fprop_dtype)
    return self.ShardActivation(self._act(y), 'out')
