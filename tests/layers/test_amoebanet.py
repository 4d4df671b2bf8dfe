"""AmoebaNet cells (layers/amoebanet.py): shapes, pure FProp, gradients to
every weight, one-line errors."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import amoebanet

_B = 2


def _Cell(genotype='D', reduction=False, filters=4, input_shape=(8, 8, 12),
          prev_shape=(8, 8, 12), **kw):
  return amoebanet.AmoebaCell.Params().Set(
      name='cell', genotype=genotype, reduction=reduction, filters=filters,
      input_shape=input_shape, prev_shape=prev_shape, bn_decay=0.9,
      **kw).Instantiate()


def _Image(shape, seed):
  rng = np.random.RandomState(seed)
  return tf.constant(rng.normal(size=[_B, *shape]).astype(np.float32))


def _Run(cell, seed=0):
  p = cell.params
  x = _Image(p.input_shape, seed)
  prev = None if p.prev_shape is None else _Image(p.prev_shape, seed + 1)
  return cell.FProp(cell.theta, x, prev)


# (reduction, input_shape, prev_shape): a normal cell after a normal cell,
# one after a reduction (x_prev twice as large: factorized reduction), a
# reduction cell, and a first cell (no previous-but-one: x_prev = x).
_CASES = [(False, (8, 8, 12), (8, 8, 12)), (False, (4, 4, 12), (8, 8, 6)),
          (True, (8, 8, 16), (8, 8, 16)), (True, (8, 8, 5), None)]


@pytest.mark.parametrize('genotype', sorted(amoebanet.GENOTYPES))
@pytest.mark.parametrize('reduction,input_shape,prev_shape', _CASES)
def test_cell_output_shapes(genotype, reduction, input_shape, prev_shape):
  """Normal cells keep H x W, reduction cells halve them; the channels are
  the concatenated states' (F each): B normal 4, reduction 2; D normal 4,
  reduction 3 (Real et al.'s genotypes)."""
  cell = _Cell(genotype, reduction, filters=4, input_shape=input_shape,
               prev_shape=prev_shape)
  y = _Run(cell)
  h, w, _ = input_shape
  s = 2 if reduction else 1
  concat = {('B', False): 4, ('B', True): 2, ('D', False): 4,
            ('D', True): 3}[genotype, reduction]
  assert y.shape == [_B, h // s, w // s, concat * 4]
  assert tuple(y.shape[1:]) == cell.OutputShape()


@pytest.mark.parametrize('genotype', sorted(amoebanet.GENOTYPES))
@pytest.mark.parametrize('reduction', [False, True])
def test_cell_is_a_pure_function_of_theta_and_every_weight_learns(
    genotype, reduction):
  """Two calls with one theta agree; another theta changes the output; the
  gradient of a random projection of the output reaches every weight
  (every state feeds the output: no dead op)."""
  cell = _Cell(genotype, reduction, filters=4, input_shape=(8, 8, 12),
               prev_shape=(16, 16, 6) if reduction else (8, 8, 12))
  theta = cell.theta
  np.testing.assert_array_equal(_Run(cell).numpy(), _Run(cell).numpy())
  other = theta.Transform(lambda w: tf.convert_to_tensor(w) * 1.5)
  p = cell.params
  x, prev = _Image(p.input_shape, 0), _Image(p.prev_shape, 1)
  assert not np.allclose(cell.FProp(other, x, prev).numpy(),
                         cell.FProp(theta, x, prev).numpy())
  leaves = theta.Flatten()
  r = _Image(cell.OutputShape(), 7)
  with tf.GradientTape() as tape:
    tape.watch(leaves)
    loss = tf.reduce_sum(cell.FProp(theta, x, prev) * r)
  grads = tape.gradient(loss, leaves)
  for (key, _), g in zip(theta.FlattenItems(), grads):
    assert g is not None and float(tf.norm(g)) > 0, key


def test_odd_size_at_a_reduction_cell_is_one_line():
  with pytest.raises(ValueError) as e:
    _Cell(reduction=True, input_shape=(7, 8, 12), prev_shape=None)
  assert str(e.value) == ('cell: a reduction cell needs even H and W, got '
                          'input_shape [7, 8, 12]')


@pytest.mark.parametrize('kw,message', [
    (dict(genotype='A'), "cell: genotype must be one of ('B', 'D'), got 'A'"),
    (dict(filters=0), 'cell: filters must be > 0, got 0'),
    (dict(prev_shape=(4, 4, 12)),
     'cell: prev_shape [4, 4, 12] must have the H and W of input_shape '
     '[8, 8, 12] or twice them'),
    (dict(input_shape=(8, 8)), 'cell: input_shape must be 3 positive ints '
     '(H, W, C), got (8, 8)'),
    (dict(prev_shape=(16, 16, 12), filters=3),
     'prev: a factorized reduction needs an even output_dim, got 3'),
])
def test_bad_cell_params_are_one_line(kw, message):
  with pytest.raises(ValueError) as e:
    _Cell(**kw)
  assert str(e.value) == message


def test_input_shape_not_the_declared_one_is_one_line():
  cell = _Cell()
  x = _Image((8, 8, 12), 0)
  with pytest.raises(ValueError) as e:
    cell.FProp(cell.theta, x, _Image((8, 8, 10), 1))
  assert str(e.value) == ('cell: x_prev must be [B, 8, 8, 12], got '
                          '[2, 8, 8, 10]')
  with pytest.raises(ValueError) as e:
    cell.FProp(cell.theta, x)
  assert str(e.value) == 'cell: x_prev is required (prev_shape [8, 8, 12])'


def test_padded_examples_are_left_out_of_every_batch_norm():
  """paddings [B] (a pipeline bubble's examples): example 0's output does
  not depend on a padded example 1, though it does when 1 is real (batch
  statistics)."""
  cell = _Cell(reduction=True, input_shape=(8, 8, 12),
               prev_shape=(16, 16, 6))
  x, prev = _Image((8, 8, 12), 0), _Image((16, 16, 6), 1)
  x2 = tf.concat([x[:1], 3.0 * x[1:] + 1.0], 0)
  prev2 = tf.concat([prev[:1], -prev[1:]], 0)
  pad = tf.constant([0.0, 1.0])
  a = cell.FProp(cell.theta, x, prev, paddings=pad)[0]
  b = cell.FProp(cell.theta, x2, prev2, paddings=pad)[0]
  np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
  c = cell.FProp(cell.theta, x2, prev2)[0]
  assert not np.allclose(a.numpy(), c.numpy(), atol=1e-3)
