"""Learning-rate schedule values (t = step + 1)."""

import math

import pytest

from lingshard.optim import schedules


def _Lr(name, lr, warmup, step):
  return float(schedules.LearningRate(name, lr, warmup, step))


def test_constant():
  assert _Lr('constant', 0.3, 100, 0) == pytest.approx(0.3)
  assert _Lr('constant', 0.3, 100, 10**6) == pytest.approx(0.3)


def test_linear_warmup_then_rsqrt():
  # Warmup 100: t/100 up to t = 100, then sqrt(100/t).
  assert _Lr('rsqrt', 2.0, 100, 0) == pytest.approx(2.0 * 1 / 100)
  assert _Lr('rsqrt', 2.0, 100, 49) == pytest.approx(2.0 * 50 / 100)
  assert _Lr('rsqrt', 2.0, 100, 99) == pytest.approx(2.0)
  assert _Lr('rsqrt', 2.0, 100, 399) == pytest.approx(2.0 * 0.5)
  assert _Lr('rsqrt', 2.0, 100, 9999) == pytest.approx(2.0 * 0.1)


def test_gshard_rsqrt_decay():
  # GShard: lr 1.0, rsqrt decay after 10k steps = min(1e-2, 1/sqrt(t)).
  for step in (0, 5000, 9999, 10000, 39999, 10**6 - 1):
    t = step + 1
    assert _Lr('rsqrt_decay', 1.0, 10000, step) == pytest.approx(
        min(1e-2, 1 / math.sqrt(t)), rel=1e-6)


def test_unknown_schedule():
  with pytest.raises(ValueError, match=r"Unknown lr_schedule 'cosine'; one "
                     r'of constant, rsqrt, rsqrt_decay'):
    schedules.LearningRate('cosine', 1.0, 0, 0)
