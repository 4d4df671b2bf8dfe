"""scripts/bench_gpipe_image.py (bench_gpipe.py --body=amoebanet): Table 1's
search and memory invariants on the smallest AmoebaNet-D cells."""

import functools
import importlib.util
import os
import types

import numpy as np
import pytest

from lingshard.spmd import check

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir,
                     'scripts', 'bench_gpipe_image.py')


@pytest.fixture(scope='module')
def bench():
  spec = importlib.util.spec_from_file_location('bench_gpipe_image', _PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  # Each (body, model, setting) compiled once across the tests.
  module.Probe = functools.lru_cache(maxsize=None)(module.Probe)
  return module


@pytest.fixture(scope='module')
def body(bench):
  """Two normal cells, no reduction, 8 x 8 x 16 images, N = 16: the
  cheapest body with two stages."""
  return bench.Body(image=8, channels=16, batch=16, reductions=0)


@pytest.mark.parametrize('start', [1, 2, 5, 40])
def test_largest_fit_returns_the_last_size_that_fits(bench, start):
  probed = []

  def Probe(d):
    probed.append(d)
    return 3 * d * d + 100 * d, d

  i, seen = bench.LargestFit(Probe, 50_000, 4, start, log=lambda _: None)
  want = max(j for j in range(1, 100) if Probe(4 * j)[0] <= 50_000)
  assert i == want
  assert seen[i][0] <= 50_000 < seen[i + 1][0]
  assert len(set(probed[:len(seen)])) == len(seen)  # Each size once.


def test_largest_fit_returns_zero_when_nothing_fits(bench):
  i, seen = bench.LargestFit(lambda d: (d, d), 3, 4, 8, log=lambda _: None)
  assert i == 0 and sorted(seen) == [1, 2, 4, 8]


def test_pipeline_2_needs_less_memory_per_device_than_naive(bench, body):
  naive = bench.Probe(body, 2, 8, 1, 1, False, True)
  piped = bench.Probe(body, 2, 8, 2, 2, True, False)
  assert piped[1] == naive[1] > 0  # The same model.
  assert piped[0] < naive[0], (piped, naive)


def test_table1_row_fits_and_the_next_size_does_not(bench, body):
  budget = 3 * bench.MIB
  rows = bench.Table1Rows(body, 2, bench.Table1Settings([], 1)[:1], budget,
                          8, log=lambda _: None)
  (row,) = rows
  assert row['row'] == 'naive-1' and row['filters'] >= 8
  assert row['device_mib'] <= 3 < row['next_device_mib']
  assert row['next_filters'] == row['filters'] + 8
  layer = bench.LayerParams(body, 2, row['filters'], 1, 1,
                            False).Instantiate()
  assert row['params'] == sum(layer.CellParamCounts())


CIRCULAR_M1 = ('# table 2 K=2 M=1 circular R=2: skipped (cells: the circular '
               'schedule needs at least num_stages 2 micro-batches (a '
               'micro-batch re-enters stage 0 after leaving the last), got 1)')


def test_schedule_names_and_bubbles(bench):
  assert bench.ParseSchedule('fill-drain') is None
  assert bench.ParseSchedule('circular-3') == 3
  for bad in ('circular-1', 'circular', 'circ-2', 'interleaved'):
    with pytest.raises(ValueError) as e:
      bench.ParseSchedule(bad)
    assert str(e.value) == (f'unknown schedule {bad!r}; use fill-drain or '
                            'circular-R (R >= 2)')
  assert bench.Bubble(4, 8, None) == 3 / 11  # GPipe: (K-1) / (M+K-1).
  assert bench.Bubble(4, 8, 2) == 3 / 19  # Circular: (K-1) / (R M+K-1).
  assert bench.ScheduleProblem(4, 2, 2, 2) is None
  assert bench.ScheduleProblem(4, 4, 4, 2) == (
      'cells: the circular schedule cuts num_layers 4 into num_stages x '
      'repeats = 4 x 2 = 8 chunks; use at least 8 layers or fewer repeats')


def test_table2_skips_what_the_schedule_refuses_without_compiling(bench):
  logged = []
  rows = bench.Table2Rows(bench.Body(8, 8, 4, 0), 4, 8, [2], [1], 1,
                          schedules=(2,), log=logged.append)
  assert rows == [] and logged == [CIRCULAR_M1]


def test_table2_circular_row_builds_the_circular_schedule(bench,
                                                        monkeypatch):
  """4 cells, K = 2, M = 2, R = 2: stage k holds chunks (cells) k and
  k + 2, 5 iterations, bubble 1 / 5; M = 1 is skipped. The layer and the
  step's inputs are real; partitioning and timing are faked (compiling
  this program takes ~40 s of CPU; tests/layers/test_pipeline_cells.py
  partitions and runs a circular cell pipeline)."""
  checked, layers, measure = [], [], bench.Measure

  def Spy(*args, **kwargs):
    out = measure(*args, **kwargs)
    layers.append(out[1])
    return out

  def FakeCheck(fn, inputs, mesh_shape, compare, name):
    checked.append((fn, inputs, mesh_shape, compare, name))
    return types.SimpleNamespace(memory=dict(argument=3 * bench.MIB,
                                             temp=bench.MIB))

  monkeypatch.setattr(bench, 'Measure', Spy)
  monkeypatch.setattr(check, 'CheckFunction', FakeCheck)
  monkeypatch.setattr(bench, 'TimedStep',
                      lambda result, inputs, n: lambda: (0.25, 0.5))
  logged = []
  rows = bench.Table2Rows(bench.Body(8, 8, 4, 0), 4, 8, [2], [1, 2], 3,
                          schedules=(2,), log=logged.append)
  assert logged == [CIRCULAR_M1,
                    '# table 2 K=2 M=2 circular R=2: compiled']
  assert rows == [dict(
      stages=2, micro_batches=2, schedule='circular R=2', iterations=5,
      bubble=1 / 5, seconds=0.25, examples_per_s=4 / 0.25,
      # The only program is the base: normalised 1, ideal K (1 - bubble)
      # over itself.
      normalized=1.0, ideal_normalized=1.0, device_mib=4.0)]
  ((_, inputs, mesh_shape, compare, name),) = checked
  assert (mesh_shape, compare) == (2, False)
  assert name == 'AmoebaNet-D(4, 8) K2 M2 remat=True circular R=2'
  (layer,) = layers
  assert repr(layer.params.schedule.Instantiate()) == 'Circular(R=2)'
  np.testing.assert_array_equal(layer.WeightLayout(), [[0, 2], [1, 3]])
  assert [line.split(':')[0] for line in layer.StageShapes()] == [
      'stage 0 pass 0', 'stage 1 pass 0', 'stage 0 pass 1', 'stage 1 pass 1']
  assert inputs.x.shape == (4, 8, 8, 8)


def test_table1_schedule_applies_to_the_pipeline_k_rows(bench):
  assert bench.Table1Settings([1, 2], 4, 2) == [
      ('naive-1', 1, 1, False, True, None),
      ('Pipeline-1', 1, 4, True, False, None),
      ('Pipeline-1', 1, 4, True, False, None),
      ('Pipeline-2', 2, 4, True, False, 2)]
