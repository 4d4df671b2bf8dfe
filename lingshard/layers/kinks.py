"""ReLU's and max pooling's kinks, and the SPMD checker's smoothing of
their derivatives.

relu'(z) jumps from 0 to 1 at z = 0. Two programs computing the same
pre-activation with different rounding (the partitioned and the
single-device program of `spmd/check.py`: other matmul shapes, another
summation order) put a z within rounding of 0 on different sides, so one
token's gradient through one hidden unit is in one program and not in the
other. That changes the hidden unit's weight-gradient column and also the
token's input gradient, hence every gradient upstream of the layer (a
pipelined 16-layer TinyMoE on the full corpus: 6 units seen as
weight-gradient columns (5 expert wi, 1 dense fc_in), upstream
gradients off by up to 1e-3 relative in a few % of their elements).
Nothing about the partitioning is wrong there.

`Relu` is relu; traced inside `Tracking()` it counts itself, and inside
`Tracking(smooth=True)` its forward value stays relu(z) bit for bit while
its derivative becomes sigmoid(z / BAND): continuous, its slope at most
1 / (4 BAND) = 1, as steep as GELU's derivative (0.8 at 0), for which
the checker's tolerances are set (the same 16-layer model with GELU
experts passes at max rel err 7.8e-5 < 1e-4), while relu's is infinitely
steep. Activations are layer-normed, O(1): BAND is in their units, for
every dtype (rounding, and the tolerance, grow with eps alike). The
checker compares the partitioned program with its reference again under
it when the plain comparison fails (check.py): elementwise math the
partitioner treats as any other, so a partitioning error remains.

Max pooling has the same kink in its argmax: its derivative routes a
window's gradient to the one largest input, and two inputs within
rounding of each other swap between the programs (an AmoebaNet on 2
devices, data parallel: gradients off by up to 4% relative; the same
model with average pooling matches at 2e-5). `MaxPool` is max pooling;
smoothed, its value stays bit for bit and its derivative becomes the
window's softmax(x / BAND), the derivative of the window's
BAND log-sum-exp(x / BAND).
"""

import contextlib
import contextvars

import numpy as np
import tensorflow as tf

# {'kinks': Relu / MaxPool calls traced, 'smooth': bool} of the open
# Tracking, or None.
_STATE = contextvars.ContextVar('lingshard_kinks', default=None)


@contextlib.contextmanager
def Tracking(smooth=False):
  """Yields a dict whose 'kinks' counts the `Relu` and `MaxPool` calls
  traced inside; smooth=True: their derivative is smoothed (module
  docstring)."""
  state = {'kinks': 0, 'smooth': bool(smooth)}
  token = _STATE.set(state)
  try:
    yield state
  finally:
    _STATE.reset(token)


# Width of the smoothed derivative (module docstring).
BAND = 0.25


def _Kink(exact, smoothed):
  """exact() (a function with a kink), counted inside a Tracking; with
  smooth=True its value bit for bit (it adds s - s = 0) and the derivative
  of s = smoothed()."""
  state = _STATE.get()
  if state is None:
    return exact()
  state['kinks'] += 1
  if not state['smooth']:
    return exact()
  s = smoothed()
  return tf.stop_gradient(exact()) + (s - tf.stop_gradient(s))


def Relu(x):
  """max(x, 0); see the module docstring for its traced variants."""
  # d/dx BAND * softplus(x / BAND) = sigmoid(x / BAND).
  return _Kink(lambda: tf.nn.relu(x),
               lambda: BAND * tf.nn.softplus(x / BAND))


def MaxPool(x, window_shape, strides, padding):
  """tf.nn.pool MAX of x [B, H, W, C]; see the module docstring for its
  traced variants."""

  def Smoothed():
    # BAND log(sum over the window of exp(x / BAND)) up to a constant:
    # average pooling (SAME: over the in-image positions only, as max
    # pooling) of exp((x - m) / BAND), m the per-(example, channel) max
    # (no overflow; `tiny` keeps log finite if a whole window underflows,
    # so s - s stays 0). Its derivative is the window's softmax(x / BAND).
    xf = tf.cast(x, tf.float32)
    m = tf.stop_gradient(tf.reduce_max(xf, axis=[1, 2], keepdims=True))
    avg = tf.nn.pool(tf.exp((xf - m) / BAND), window_shape=window_shape,
                     pooling_type='AVG', strides=strides, padding=padding)
    return tf.cast(BAND * tf.math.log(avg + np.finfo(np.float32).tiny),
                   x.dtype)

  return _Kink(lambda: tf.nn.pool(x, window_shape=window_shape,
                                  pooling_type='MAX', strides=strides,
                                  padding=padding), Smoothed)
