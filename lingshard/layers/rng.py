"""Counter-based randomness keyed by (seed, stream, step, counter).

Used by every layer that draws per element: dropout (layers/dropout.py,
its element index as counter) and MoE routing, which draws per token: the uniform `rnd` of GShard
Algorithm 1 line 17 (random second expert), Gumbel noise for the `sampling`
second-expert policy and the StandardNormal() of Shazeer et al. eq. (4). A
draw must be a function of *which* token it is, not of where the token sits:
the same token gets the same decision whether the batch is split into G=4 or
G=2 groups, sharded over devices or cut into pipeline micro-batches. Stateful
RNGs and `tf.random.stateless_*` with one seed per call cannot give that (they
number draws by position in the tensor), so every draw here is a pure integer
hash of

    (layer_seed, stream, step, global token index, sub index)

computed with uint32 ops (wrap-around multiply, xor, shift). The same
integers give bit-identical draws on every backend (TF CPU kernels and XLA),
inside or outside tf.function, whatever the tensor's shape.

The mixer is `lowbias32` (C. Wellons, "Hash function prospector", 2018), a
bijective 32-bit finaliser with low avalanche bias; keys are absorbed one
32-bit word at a time (`h = mix(h ^ word)`), like a tiny sponge.
"""

import numpy as np
import tensorflow as tf

# Stream ids: independent sequences for independent uses in one layer.
STREAM_SECOND_EXPERT = 1      # GShard Algorithm 1 line 17, `random` policy.
STREAM_GUMBEL = 2             # `sampling` second-expert policy.
STREAM_NOISE = 3              # Shazeer eq. (4) StandardNormal().
STREAM_NOISE_SECONDARY = 4    # Hierarchical MoE secondary gates.
STREAM_DROPOUT = 5            # layers/dropout.py masks.

_M1 = 0x21F0AAAD
_M2 = 0x735A2D97
_INIT = 0x9E3779B9  # Golden-ratio constant: a non-zero starting state.


_MASK32 = 0xFFFFFFFF


def _Consts():
  """The mixer's shift and multiplier constants as uint32 graph constants,
  made once per hash (not once per use: hashing is most of the ops that
  tracing a step with dropout creates)."""
  return tuple(tf.constant(v, tf.uint32) for v in (16, 15, _M1, _M2))


def _Mix(h, consts):
  """lowbias32: x ^= x>>16; x *= M1; x ^= x>>15; x *= M2; x ^= x>>15."""
  s16, s15, m1, m2 = consts
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, s16))
  h = h * m1
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, s15))
  h = h * m2
  return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, s15))


def _MixInt(x):
  """_Mix of a Python int, in Python: the same uint32 arithmetic, so words
  known at trace time are absorbed without graph ops."""
  x &= _MASK32
  x ^= x >> 16
  x = (x * _M1) & _MASK32
  x ^= x >> 15
  x = (x * _M2) & _MASK32
  return x ^ (x >> 15)


def _Absorb(h, word_u32, consts):
  return _Mix(tf.bitwise.bitwise_xor(h, word_u32), consts)


def _Split64(x):
  """(low, high) uint32 words of an int64 tensor (two's complement)."""
  x = tf.cast(x, tf.int64)
  mask = np.int64(_MASK32)
  lo = tf.cast(tf.bitwise.bitwise_and(x, mask), tf.uint32)
  hi = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(
      x, np.int64(32)), mask), tf.uint32)
  return lo, hi


def KeyHash(layer_seed, stream, step, consts=None):
  """The uint32 scalar state after absorbing (layer_seed, stream, step);
  the words known at trace time (all but a tensor step) in Python."""
  if step is None:
    step = 0
  h = _MixInt(_MixInt(_INIT ^ (int(layer_seed) & _MASK32)) ^
              (int(stream) & _MASK32))
  if not tf.is_tensor(step):
    step = int(step)
    h = _MixInt(_MixInt(h ^ (step & _MASK32)) ^ ((step >> 32) & _MASK32))
    return tf.constant(h, tf.uint32)
  consts = consts or _Consts()
  lo, hi = _Split64(step)
  return _Absorb(_Absorb(tf.constant(h, tf.uint32), lo, consts), hi, consts)


def TokenHash(layer_seed, stream, step, token_index, num_sub=None):
  """uint32 hash per token (and per sub index 0..num_sub-1 if given).

  Args:
    layer_seed: python int, the layer's seed (`BaseLayer.layer_seed`).
    stream: python int, one of the STREAM_* ids.
    step: None (= 0), python int or int scalar tensor (the training step).
    token_index: int tensor [...] of GLOBAL token indices.
    num_sub: None, or the size of a trailing sub index (e.g. experts).

  Returns:
    uint32 tensor [...] or [..., num_sub].
  """
  consts = _Consts()
  h = KeyHash(layer_seed, stream, step, consts)
  lo, hi = _Split64(token_index)
  h = _Absorb(_Absorb(h, lo, consts), hi, consts)
  if num_sub is not None:
    sub = tf.cast(tf.range(num_sub, dtype=tf.int32), tf.uint32)
    h = _Absorb(h[..., tf.newaxis], sub, consts)
  return h


def HashToUniform(h):
  """uint32 -> float32 in the open interval (0, 1): (top 23 bits + .5)/2^23.

  23 bits, not 24: `top + 0.5` must be exact in float32's 24-bit
  significand. With 24 bits, (2^24 - 1) + 0.5 rounds to 2^24, u = 1.0 and
  ndtri(u) = inf: one draw in 2^24, which put a NaN into the noisy gates of
  an LM about once every thousand training steps.
  """
  top = tf.cast(tf.bitwise.right_shift(h, tf.constant(9, tf.uint32)),
                tf.float32)
  return (top + 0.5) * np.float32(2.0**-23)


def TokenUniform(layer_seed, stream, step, token_index, num_sub=None):
  """U(0, 1) draws, a pure function of (seed, stream, step, token, sub)."""
  return HashToUniform(TokenHash(layer_seed, stream, step, token_index,
                                 num_sub))


def TokenGumbel(layer_seed, stream, step, token_index, num_sub=None):
  """Standard Gumbel draws: -log(-log(u))."""
  u = TokenUniform(layer_seed, stream, step, token_index, num_sub)
  return -tf.math.log(-tf.math.log(u))


def TokenNormal(layer_seed, stream, step, token_index, num_sub=None):
  """Standard normal draws by inverse CDF: ndtri(u), |z| <= 5.2."""
  u = TokenUniform(layer_seed, stream, step, token_index, num_sub)
  return tf.math.ndtri(u)


# Counter bits below the layer index: routing's tokens here, dropout's
# elements in dropout.py.
LAYER_SHIFT = 2**40


def GlobalTokenIndex(batch_shape, token_offset=0, layer_index=0):
  """int64 [B, T] global token indices (row-major).

  Token t of row b is `layer_index * 2^40 + token_offset + b*T + t`, or
  with `token_offset` an int [B] vector (each row's own first token, e.g. a
  pipeline micro-batch's rows) `layer_index * 2^40 + token_offset[b] + t`.
  `layer_index` (0 for a layer of its own) keeps apart the draws of one
  body layer run at several stack positions (a pipeline).
  """
  b, t = batch_shape
  offset = tf.cast(token_offset, tf.int64)
  base = tf.cast(layer_index, tf.int64) * LAYER_SHIFT
  if offset.shape.rank == 1:
    return base + offset[:, tf.newaxis] + tf.range(t, dtype=tf.int64)
  return base + offset + tf.reshape(tf.range(b * t, dtype=tf.int64), [b, t])
