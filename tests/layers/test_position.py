"""Sinusoidal position encoding (Vaswani et al. §3.5)."""

import math

import numpy as np
import pytest

from lingshard.layers import position


def _Layer(dim=6):
  return position.PositionalEncoding.Params().Set(
      name='pos', embedding_dim=dim).Instantiate()


def test_matches_formula():
  layer = _Layer()
  got = layer.FProp(layer.theta, seq_length=5).numpy()
  half = 3
  inc = math.log(1e4) / (half - 1)
  for t in range(5):
    for i in range(half):
      ts = math.exp(i * inc)
      np.testing.assert_allclose(got[t, i], math.sin(t / ts), atol=1e-6)
      np.testing.assert_allclose(got[t, half + i], math.cos(t / ts),
                                 atol=1e-6)


def test_positions_give_the_same_rows():
  layer = _Layer()
  table = layer.FProp(layer.theta, seq_length=8).numpy()
  pos = np.array([[7, 0], [3, 3]])
  np.testing.assert_allclose(layer.FProp(layer.theta, positions=pos).numpy(),
                             table[pos], atol=1e-6)


def test_errors():
  with pytest.raises(ValueError, match='embedding_dim must be even'):
    _Layer(5)
  layer = _Layer()
  with pytest.raises(ValueError, match='exactly one of seq_length'):
    layer.FProp(layer.theta)
