"""scripts/bench_gpipe_image.py (bench_gpipe.py --body=amoebanet): Table 1's
search and memory invariants on the smallest AmoebaNet-D cells."""

import functools
import importlib.util
import os

import pytest

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
