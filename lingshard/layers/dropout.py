"""Dropout from a counter-based hash keyed by (layer seed, step, element).

GShard App. A.2 applies dropout 0.1 to the input, residual and attention
probabilities. The mask is a pure function of (the layer's seed, which
comes from `random_seed` and the layer path, the global training `step`,
and the element's global index: row = global example in the mini-batch,
then the element within the row), drawn from the counter-based hash of
layers/rng.py. So:

- re-materialisation, pipelining and the SPMD checker recompute the very
  same mask, with no stateful RNG;
- the mask is elementwise in iota-based counters, so XLA's SPMD partitioner
  computes each device's shard only (a stateless_uniform RNG op would be
  generated whole, replicated, on every device: 32 GiB per attention
  dropout at GShard's 4M-token batch on 128 cores, measured by
  scripts/bench_paper_scale.py);
- under `KeyedMasks(0, example_offset)` (the tasks pass the replica's
  global offset) every replica draws the rows one device would.

`KeyedMasks(layer_index, example_offset, example_stride)` sets the key;
nested, the inner offset adds to the outer one (a pipeline's micro-batch
inside a replica's batch); the offset may be a vector of per-row example
indices (a pipeline's micro-batch of blocked rows). A pipeline that runs one body layer at every
position of a stack, on micro-batches (rows `example_offset + r *
example_stride` of the mini-batch), with or without re-materialisation,
then draws exactly the masks of the unpipelined stack on the whole
mini-batch. Off when `is_inference`.
"""

import contextlib
import contextvars

import tensorflow as tf

from lingshard.layers import base_layer
from lingshard.layers import rng

# (layer_index, example_offset, example_stride) of KeyedMasks, or None.
_MASK_KEY = contextvars.ContextVar('lingshard_dropout_key', default=None)


@contextlib.contextmanager
def KeyedMasks(layer_index, example_offset, example_stride=1):
  """Dropout masks inside are keyed by layer index and global example index.

  Args:
    layer_index: int (python or int scalar tensor): the layer's position in
      its stack.
    example_offset: int (python or scalar tensor): the global index in the
      mini-batch of the first row of the inputs; or an int [R] tensor: row
      r of the inputs is example `example_offset[r]` (a pipeline's
      micro-batch, pipeline.MicroBatchRows).
    example_stride: int: row r of the inputs is example `example_offset +
      r * example_stride` of the mini-batch (scalar offsets only).
  """
  outer = _MASK_KEY.get()
  if outer is not None:
    if outer[2] != 1 or _IsRows(outer[1]):
      raise ValueError('KeyedMasks: an outer key with example_stride '
                       f'{outer[2]} or per-row examples cannot hold another '
                       'key')
    example_offset = tf.cast(outer[1], tf.int64) + tf.cast(example_offset,
                                                           tf.int64)
  if _IsRows(example_offset) and example_stride != 1:
    raise ValueError('KeyedMasks: per-row example indices take no '
                     f'example_stride, got {example_stride}')
  token = _MASK_KEY.set((layer_index, example_offset, example_stride))
  try:
    yield
  finally:
    _MASK_KEY.reset(token)


def _IsRows(example_offset):
  return getattr(example_offset, 'shape', None) is not None and len(
      example_offset.shape) == 1


def LayerIndex():
  """The layer index of the enclosing KeyedMasks (0 outside any): keys
  other per-element randomness (MoE routing) of a layer that one body
  runs at several stack positions (a pipeline)."""
  key = _MASK_KEY.get()
  return 0 if key is None else key[0]


def _Rows(example_offset, num_rows, example_stride):
  offset = tf.cast(example_offset, tf.int64)
  if _IsRows(example_offset):
    return offset
  return offset + tf.range(tf.cast(num_rows, tf.int64),
                           dtype=tf.int64) * int(example_stride)


def KeyedUniform(layer_seed, step, layer_index, example_offset, shape,
                 example_stride=1):
  """U(0, 1) [shape] of element j of row r: hash of (seed, step, index).

  The counter of an element is `layer_index * 2^40 + row(r) * E + j` with
  E = prod(shape[1:]) and row(r) = `example_offset + r * example_stride`
  (or `example_offset[r]` for per-row offsets), so a row's draws do not
  depend on which other rows are in the tensor.
  """
  shape = tf.convert_to_tensor(shape)
  per_row = tf.cast(tf.reduce_prod(shape[1:]), tf.int64)
  row = _Rows(example_offset, shape[0], example_stride)
  counter = (tf.cast(layer_index, tf.int64) * rng.LAYER_SHIFT +
             row[:, tf.newaxis] * per_row +
             tf.range(per_row, dtype=tf.int64)[tf.newaxis, :])
  u = rng.TokenUniform(layer_seed, rng.STREAM_DROPOUT, step, counter)
  return tf.reshape(u, shape)


def StepSeed(layer_seed, step):
  """A [2] int64 stateless seed from a Python layer seed and a step tensor."""
  step = tf.constant(0, tf.int64) if step is None else tf.cast(step, tf.int64)
  return tf.stack([tf.constant(layer_seed, tf.int64), tf.reshape(step, [])])


class DropoutLayer(base_layer.BaseLayer):
  """`y = x * mask / (1 - p)` with `mask ~ Bernoulli(1 - p)` per element."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dropout_prob', 0.0, 'Probability p of zeroing an element.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not 0.0 <= p.dropout_prob < 1.0:
      raise ValueError(f'{p.name}: dropout_prob must be in [0, 1), got '
                       f'{p.dropout_prob}')

  @property
  def active(self):
    """Whether FProp changes its input (p > 0 and not inference)."""
    return self.params.dropout_prob > 0.0 and not self.params.is_inference

  def FProp(self, theta, inputs, step=None):
    """inputs: any shape ([B, ...] under KeyedMasks); step: int or None."""
    del theta  # No weights.
    if not self.active:
      return inputs
    prob = self.params.dropout_prob
    key = _MASK_KEY.get() or (0, 0, 1)
    rnd = KeyedUniform(self.layer_seed, step, key[0], key[1],
                       tf.shape(inputs), example_stride=key[2])
    keep = tf.cast(rnd >= prob, inputs.dtype)
    return inputs * keep / tf.cast(1.0 - prob, inputs.dtype)
