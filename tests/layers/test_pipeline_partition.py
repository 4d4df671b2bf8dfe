"""PartitionByCost (GPipe §2.2): optimal consecutive cells by cost."""

import itertools

import numpy as np
import pytest

from lingshard.layers import pipeline_partition


def _BruteForce(costs, k):
  n = len(costs)
  best = None
  for cuts in itertools.combinations(range(1, n), k - 1):
    bounds = (0,) + cuts + (n,)
    splits = [b - a for a, b in zip(bounds, bounds[1:])]
    value = pipeline_partition.MaxCellCost(costs, splits)
    best = value if best is None else min(best, value)
  return best


def _RandomCases(seed, count, max_layers, max_cost, real_frac=0.0):
  """`count` random (costs, k): integer costs in [0, max_cost) (ties), a
  `real_frac` of them U(0, 1) instead."""
  rng = np.random.RandomState(seed)
  for _ in range(count):
    n = rng.randint(1, max_layers)
    k = rng.randint(1, n + 1)
    costs = rng.randint(0, max_cost, size=n).astype(float).tolist()
    if rng.rand() < real_frac:
      costs = rng.rand(n).tolist()
    yield costs, k


def test_cost_partition_beats_equal_count_split_of_unequal_layers():
  # An embedding-like heavy first layer, then light layers (GPipe §2.2).
  costs = [8.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
  splits = pipeline_partition.PartitionByCost(costs, 4)
  assert splits[0] == 1 and sum(splits) == 8
  assert pipeline_partition.MaxCellCost(costs, splits) == 8.0
  assert pipeline_partition.MaxCellCost(costs, [2, 2, 2, 2]) == 9.0


def test_cost_partition_is_optimal_against_brute_force():
  for costs, k in _RandomCases(0, 40, 9, 10):
    splits = pipeline_partition.PartitionByCost(costs, k)
    assert len(splits) == k and min(splits) >= 1 and sum(splits) == len(
        costs)
    assert pipeline_partition.MaxCellCost(costs, splits) == _BruteForce(
        costs, k)


def test_bad_partition_arguments_are_one_line_errors():
  with pytest.raises(ValueError, match=r'^num_stages 3 must be in \[1, 2\] '
                     r'for 2 layers$'):
    pipeline_partition.PartitionByCost([1.0, 2.0], 3)
  with pytest.raises(ValueError, match=r'^splits \[1, 2\] cover 3 layers, '
                     r'not 2$'):
    pipeline_partition.MaxCellCost([1.0, 2.0], [1, 2])


def _QuadraticDp(costs, k):
  """The O(K * L^2) DP: every cut of every cell tried; ties to the latest
  cut (the reference PartitionByCost must equal split for split)."""
  n = len(costs)
  prefix = np.concatenate([[0.0], np.cumsum(costs)]).tolist()
  best = [[float('inf')] * (n + 1) for _ in range(k + 1)]
  cut = [[0] * (n + 1) for _ in range(k + 1)]
  best[0][0] = 0.0
  for s in range(1, k + 1):
    for j in range(s, n + 1):
      for i in range(s - 1, j):
        value = max(best[s - 1][i], prefix[j] - prefix[i])
        if value <= best[s][j]:
          best[s][j], cut[s][j] = value, i
  splits, j = [], n
  for s in range(k, 0, -1):
    splits.append(j - cut[s][j])
    j = cut[s][j]
  return splits[::-1]


def test_bisected_dp_equals_the_quadratic_dp_split_for_split():
  # Many ties: small integers, zeros, equal runs.
  for costs, k in _RandomCases(1, 300, 40, 4, real_frac=0.3):
    assert pipeline_partition.PartitionByCost(costs, k) == _QuadraticDp(
        costs, k), (costs, k)
