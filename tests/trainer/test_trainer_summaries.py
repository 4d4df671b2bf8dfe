"""Throughput, ETA, the progress line and histogram buckets (fake clock)."""

import numpy as np

from lingshard.train import summaries


def test_throughput_and_progress_line():
  now = [100.0]
  meter = summaries.Throughput(step=10, clock=lambda: now[0])
  for _ in range(20):
    meter.Add(examples=64, tokens=1500)
  now[0] = 104.0
  rates = meter.Rates(step=30)
  assert rates == {'steps_per_sec': 5.0, 'examples_per_sec': 320.0,
                   'tokens_per_sec': 7500.0}
  assert summaries.ProgressLine(30, 1000, 1.5, rates) == (
      'step 30/1000 loss 1.500000 steps/s 5.00 tokens/s 7.5k ETA 0:03:14')
  now[0] = 105.0
  rates = meter.Rates(step=30)  # The window restarted: nothing happened.
  assert rates['steps_per_sec'] == 0.0
  assert summaries.ProgressLine(30, 1000, 0.25, rates) == (
      'step 30/1000 loss 0.250000 steps/s 0.00 examples/s 0.0 ETA ?')


def test_eta_is_to_the_limit_that_binds_first():
  rates = {'steps_per_sec': 5.0, 'examples_per_sec': 320.0,
           'tokens_per_sec': 7500.0}
  # 970 steps at 5/s = 194 s, but the time budget ends in 30 s.
  assert summaries.ProgressLine(30, 1000, 1.5, rates, seconds_left=30.4) == (
      'step 30/1000 loss 1.500000 steps/s 5.00 tokens/s 7.5k ETA 0:00:30')
  # The step limit binds first.
  assert summaries.ProgressLine(30, 1000, 1.5, rates, seconds_left=900) == (
      'step 30/1000 loss 1.500000 steps/s 5.00 tokens/s 7.5k ETA 0:03:14')
  # A budget already spent, and no speed measured yet: the budget alone.
  assert summaries.ProgressLine(30, 1000, 1.5, rates, seconds_left=-2).endswith(
      'ETA 0:00:00')
  idle = dict(rates, steps_per_sec=0.0)
  assert summaries.ProgressLine(30, 1000, 1.5, idle, seconds_left=61).endswith(
      'ETA 0:01:01')


def test_format_duration():
  assert summaries.FormatDuration(3 * 3600 + 62.4) == '3:01:02'
  assert summaries.FormatDuration(float('inf')) == '?'


def test_histogram_buckets():
  buckets = summaries.HistogramBuckets([0.1, 0.2, 0.2, 0.7], bins=3)
  np.testing.assert_allclose(buckets[:, 0], [0.1, 0.3, 0.5])
  np.testing.assert_allclose(buckets[:, 1], [0.3, 0.5, 0.7])
  np.testing.assert_array_equal(buckets[:, 2], [3, 0, 1])
  single = summaries.HistogramBuckets([2.0, 2.0])
  np.testing.assert_array_equal(single, [[1.5, 2.5, 2]])
