"""Observability: TensorBoard summaries, throughput and the progress line.

Every metric a step returns is written under its own name (nested metric
maps flatten with nested_map.FlattenMetrics, as the tasks' do):
scalars as scalar summaries, vectors (e.g. an MoE layer's per-expert load)
as a histogram plus one scalar per entry (`<name>/000`, ...), so both the
shape of the load and each expert's curve are visible. Throughput (steps/s,
examples/s, tokens/s) is measured on the host between two reports.

Summaries are written with the core `tf.summary.write` op and TensorBoard's
plugin metadata (scalars: a float32 scalar; histograms: [k, 3] float64 of
left edge, right edge, count), so training does not need the tensorboard
package; viewing the logdir does.
"""

import time

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from lingshard import nested_map

HISTOGRAM_BUCKETS = 30

# Vectors up to this length also get one scalar per entry.
MAX_PER_ENTRY_SCALARS = 64


def MetricsToNumpy(metrics):
  """{name: (value ndarray, weight float)} from a step's metrics."""
  out = {}
  for name, (value, weight) in metrics.items():
    out[name] = (np.asarray(value), float(np.asarray(weight)))
  return out


def FormatDuration(seconds):
  """`1:02:03`-style h:mm:ss (or `?` when unknown)."""
  if seconds is None or not np.isfinite(seconds):
    return '?'
  seconds = int(round(max(seconds, 0)))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def _Human(x):
  for unit, scale in (('M', 1e6), ('k', 1e3)):
    if abs(x) >= scale:
      return f'{x / scale:.1f}{unit}'
  return f'{x:.1f}'


class Throughput:
  """Steps, examples and tokens per second between calls to `Rates`."""

  def __init__(self, step, clock=time.time):
    self._clock = clock
    self._last_time = clock()
    self._last_step = step
    self._examples = 0.0
    self._tokens = 0.0

  def Add(self, examples, tokens):
    self._examples += examples
    self._tokens += tokens

  def Rates(self, step):
    """{steps_per_sec, examples_per_sec, tokens_per_sec}; resets the window."""
    now = self._clock()
    dt = max(now - self._last_time, 1e-9)
    rates = dict(steps_per_sec=(step - self._last_step) / dt,
                 examples_per_sec=self._examples / dt,
                 tokens_per_sec=self._tokens / dt)
    self._last_time, self._last_step = now, step
    self._examples = self._tokens = 0.0
    return rates


def ProgressLine(step, max_steps, loss, rates, seconds_left=None):
  """`step 120/1000 loss 0.012345 steps/s 41.2 tokens/s 12.3k ETA 0:00:21`.

  tokens/s is shown when the batches have target tokens, else examples/s.
  The ETA is to whichever limit binds first: `max_steps` at the current
  speed, or `seconds_left` of a time budget (None: no budget).
  """
  sps = rates['steps_per_sec']
  eta = (max_steps - step) / sps if sps > 0 else None
  if seconds_left is not None:
    seconds_left = max(float(seconds_left), 0.0)
    eta = seconds_left if eta is None else min(eta, seconds_left)
  if rates['tokens_per_sec'] > 0:
    speed = f'tokens/s {_Human(rates["tokens_per_sec"])}'
  else:
    speed = f'examples/s {_Human(rates["examples_per_sec"])}'
  return (f'step {step}/{max_steps} loss {loss:.6f} steps/s {sps:.2f} '
          f'{speed} ETA {FormatDuration(eta)}')


def _Metadata(plugin, data_class):
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin),
      data_class=data_class)


_SCALAR = _Metadata('scalars', summary_pb2.DATA_CLASS_SCALAR)
_HISTOGRAM = _Metadata('histograms', summary_pb2.DATA_CLASS_TENSOR)


def HistogramBuckets(values, bins=HISTOGRAM_BUCKETS):
  """[k, 3] (left, right, count) buckets, TensorBoard's histogram format."""
  values = np.asarray(values, np.float64).reshape([-1])
  lo, hi = float(values.min()), float(values.max())
  if lo == hi:
    return np.array([[lo - 0.5, hi + 0.5, values.size]], np.float64)
  counts, edges = np.histogram(values, bins=bins, range=(lo, hi))
  return np.stack([edges[:-1], edges[1:], counts], axis=1).astype(np.float64)


def WriteScalar(name, value, step):
  tf.summary.write(name, tf.constant(float(value), tf.float32), step=step,
                   metadata=_SCALAR)


def WriteHistogram(name, values, step):
  tf.summary.write(name, tf.constant(HistogramBuckets(values)), step=step,
                   metadata=_HISTOGRAM)


class SummaryWriter:
  """TensorBoard event files in one directory (a no-op when disabled)."""

  def __init__(self, logdir, enabled=True):
    self.logdir = logdir
    self._writer = tf.summary.create_file_writer(logdir) if enabled else None

  def Write(self, step, metrics_np, scalars=None):
    """Writes every metric (scalars, vectors as histograms) and `scalars`."""
    if self._writer is None:
      return
    values = {name: value for name, (value, _) in metrics_np.items()}
    with self._writer.as_default():
      for name, value in nested_map.FlattenMetrics(values):
        value = np.asarray(value)
        if value.size == 1:
          WriteScalar(name, value.reshape(()), step)
        else:
          flat = value.reshape([-1])
          WriteHistogram(name, flat, step)
          if flat.size <= MAX_PER_ENTRY_SCALARS:
            for i, x in enumerate(flat):
              WriteScalar(f'{name}/{i:03d}', x, step)
      for name, value in sorted((scalars or {}).items()):
        WriteScalar(name, value, step)

  def Flush(self):
    if self._writer is not None:
      self._writer.flush()
