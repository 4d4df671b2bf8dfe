"""Partitioning a stack of layers into K cells by cost (GPipe §2.2).

GPipe splits a sequence of L layers into K cells of consecutive layers and
places cell k on accelerator k; to balance the pipeline it minimises the
variance of the estimated cell costs. Here the objective is the maximum
cell cost (the slowest cell sets the pace of every pipeline iteration),
solved exactly by dynamic programming over prefixes. Each DP cell's best
cut is found by bisection (below), O(K * L log L): GPipe's 1663-layer
Transformer partitions in well under a second, not a minute.
"""

import bisect

from lingshard.layers import pipeline_weights


class PartitionError(ValueError):
  """Stage splits or layer costs that do not fit the stack (one line)."""


def StageSplits(name, k, n, stage_splits, layer_costs, layer_wps):
  """K layer counts per stage for the pipeline `name` of n layers: the given
  `stage_splits` (checked), else PartitionByCost of `layer_costs` (None =
  each layer's matmul FLOPs, pipeline_weights.LayerCosts of `layer_wps`)."""
  if stage_splits is not None:
    splits = [int(x) for x in stage_splits]
    if len(splits) != k or sum(splits) != n or min(splits) < 1:
      raise PartitionError(f'{name}: stage_splits {splits} must be {k} '
                           f'counts >= 1 summing to num_layers {n}')
    return splits
  costs = layer_costs
  if costs is None:
    costs = pipeline_weights.LayerCosts(layer_wps)
  if len(costs) != n:
    raise PartitionError(f'{name}: layer_costs has {len(costs)} entries for '
                         f'num_layers {n}')
  return PartitionByCost(costs, k)


def _CheckCosts(costs, num_stages):
  costs = [float(c) for c in costs]
  if any(c < 0 for c in costs):
    raise ValueError(f'layer costs must be >= 0, got {costs}')
  if not 1 <= num_stages <= len(costs):
    raise ValueError(f'num_stages {num_stages} must be in [1, {len(costs)}] '
                     f'for {len(costs)} layers')
  return costs


def MaxCellCost(costs, splits):
  """The largest total cost of a cell; splits = layers per cell, in order."""
  costs = [float(c) for c in costs]
  if sum(splits) != len(costs):
    raise ValueError(f'splits {list(splits)} cover {sum(splits)} layers, '
                     f'not {len(costs)}')
  out, start = 0.0, 0
  for n in splits:
    out = max(out, sum(costs[start:start + n]))
    start += n
  return out


def PartitionByCost(costs, num_stages):
  """K cell sizes (each >= 1) minimising the maximum cell cost.

  Exact dynamic programming: best[k][j] is the smallest achievable maximum
  cost of splitting the first j layers into k cells. Among optimal splits
  the one with the latest cut points is returned (deterministic).

  Args:
    costs: L non-negative floats, the estimated cost of each layer.
    num_stages: K, 1 <= K <= L.

  Returns:
    list of K ints summing to L.
  """
  costs = _CheckCosts(costs, num_stages)
  n = len(costs)
  prefix = [0.0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  inf = float('inf')
  best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
  cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
  best[0][0] = 0.0
  for k in range(1, num_stages + 1):
    prev = best[k - 1]
    for j in range(k, n + 1):
      best[k][j], cut[k][j] = _BestCut(prev, prefix, k - 1, j)
  splits, j = [], n
  for k in range(num_stages, 0, -1):
    i = cut[k][j]
    splits.append(j - i)
    j = i
  return splits[::-1]


def _BestCut(prev, prefix, lo, j):
  """(min over i in [lo, j) of max(prev[i], prefix[j] - prefix[i]), the
  latest i attaining it).

  prev (the best cost of i layers in one cell fewer) is non-decreasing in
  i and the last cell's cost prefix[j] - prefix[i] non-increasing, so the
  minimum sits where they cross: at `c`, the first i with prev[i] >= the
  last cell's cost, or at c - 1. Past c the value is prev[i], constant
  over a run of equal prev values: the latest i of that run wins ties.
  """
  tail = prefix[j]
  a, b = lo, j  # First i in [lo, j) with prev[i] >= tail - prefix[i].
  while a < b:
    mid = (a + b) // 2
    if prev[mid] >= tail - prefix[mid]:
      b = mid
    else:
      a = mid + 1
  c = a
  left = tail - prefix[c - 1] if c > lo else float('inf')
  if c < j and prev[c] <= left:
    # Latest i < j with prev[i] == prev[c] (a run: prev is sorted).
    last = bisect.bisect_right(prev, prev[c], c, j) - 1
    return prev[c], last
  return left, c - 1
