"""The checker's entry points: the toy model, the CLI, and bad input."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from lingshard import sharding
from lingshard.layers import linear
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from lingshard.spmd import manual_constants
from lingshard.spmd import xla_runtime
from tests.spmd import spmd_testlib

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_toy_model_on_8_devices_matches_with_gradient_all_reduce():
  r = check.CheckModel('toy.FFRegression', 8,
                       expect=['only:all-reduce', 'has:all-reduce'])
  assert r.ok, r.Report()
  assert r.mesh_shape == (8,) and r.num_partitions == 8
  assert [e.name for e in r.errors] == [
      'grads.fc[0].b', 'grads.fc[0].w', 'grads.fc[1].b', 'grads.fc[1].w',
      'grads.fc[2].b', 'grads.fc[2].w', 'loss', 'per_example.sq_err']
  # Per-example errors stay split over the batch like the inputs.
  assert r.output_shardings['per_example.sq_err'].startswith('{devices=[8]')
  # Data parallel: the batch is split, weights replicated, so each device
  # holds 64/8 examples and the weight gradients are summed.
  assert r.input_shardings['batch.x'] == '{devices=[8,1]<=[8]}' or (
      r.input_shardings['batch.x'].startswith('{devices=[8,1]'))
  assert r.input_shardings['theta.fc[0].w'] == '{replicated}'
  assert 'gradient_tape' in r.CollectivesOf('all-reduce')[0].op_name
  assert r.memory['argument'] > 0 and r.flops > 0
  text = r.Report()
  assert text.startswith('SPMD check: toy.FFRegression on mesh 8 (8 '
                         'partitions, XLA from jaxlib 0.10.2)')
  assert 'result: PASS' in text


def test_layer_params_entry_point_with_a_split_weight():
  """A LinearLayer with w split over its output dim on a 2x4 mesh."""
  p = linear.LinearLayer.Params().Set(input_dim=6, output_dim=8,
                                      activation='tanh')
  p.weight_split_dims_mapping.w = [-1, 1]
  p.activation_split_dims_mapping.out = [0, -1, 1]
  x = np.random.RandomState(0).normal(size=[4, 3, 6]).astype(np.float32)
  r = check.CheckLayerParams(p, (2, 4), [x],
                             input_split_dims_mapping=[[0, -1, -1]],
                             expect=['no-all-gather:layer/w'])
  assert r.ok, r.Report()
  assert r.input_shardings['theta.layer.w'] == (
      '{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}') or (
          'last_tile_dim_replicate' in r.input_shardings['theta.layer.w'])
  assert sorted(e.name for e in r.errors) == [
      'grads.layer.b', 'grads.layer.w', 'loss', 'per_example.out']


def test_a_program_that_differs_when_partitioned_is_reported():
  """Inside a manual region the group index is local: a bug the check sees."""
  mesh = np.arange(8)

  def Fn(inp):
    x_l = sharding.auto_to_manual(inp.x, mesh, [0, -1])
    # Wrong on purpose: the local row index is not the global group id.
    y_l = x_l * tf.cast(tf.range(tf.shape(x_l)[0]), tf.float32)[:, None]
    return NestedMap(y=sharding.manual_to_auto(y_l, mesh, [0, -1], [8, 2]),
                     same=sharding.split(inp.x * 2.0, 0, 8))

  r = check.CheckFunction(Fn, NestedMap(x=np.ones([8, 2], np.float32)), 8,
                          name='buggy')
  assert not r.ok and not r.matches
  bad = {e.name: e for e in r.errors}
  assert not bad['y'].ok and bad['same'].ok
  assert bad['y'].max_abs == 7.0 and bad['y'].max_rel == 1.0
  assert 'MISMATCH y float32[8, 2]: abs 7 rel 1' in r.Report()
  with pytest.raises(check.SpmdCheckError, match='result: FAIL'):
    r.AssertOk()


def test_annotation_with_another_device_count_fails_clearly():
  def Fn(inp):
    return NestedMap(y=sharding.split(inp.x, 0, 2) + 1.0)

  with pytest.raises(sharding.ShardingError) as e:
    check.CheckFunction(Fn, NestedMap(x=np.ones([4], np.float32)), 8)
  assert str(e.value) == ('the annotation uses 2 devices but the program is '
                          'partitioned for 8')


def test_mesh_larger_than_the_virtual_devices_fails_clearly():
  with pytest.raises(xla_runtime.DeviceCountError) as e:
    check.CheckModel('toy.FFRegression', (4, 4))
  assert str(e.value) == (
      'the mesh needs 16 devices but only 8 virtual CPU devices exist; set '
      'XLA_FLAGS=--xla_force_host_platform_device_count=16 (or more) before '
      'jax initialises, e.g. at the top of the test process')
  with pytest.raises(xla_runtime.DeviceCountError, match='cannot switch to '
                     '4 virtual CPU devices: the XLA backend already started '
                     'with 8'):
    xla_runtime.ConfigureCpuDevices(4)
  xla_runtime.ConfigureCpuDevices(8)  # Already so: fine.


@pytest.mark.parametrize('mesh', ['2,x', '', (0, 4), [2, True]])
def test_bad_mesh_shapes(mesh):
  with pytest.raises(check.MeshShapeError, match='mesh shape must be'):
    check.MeshShape(mesh)


def test_unknown_model_key_raises_the_registry_error():
  with pytest.raises(LookupError) as e:
    check.CheckModel('toy.FFRegresion', 8)
  assert str(e.value) == ("Model 'toy.FFRegresion' is not registered; did "
                          'you mean toy.FFRegression?')


@pytest.fixture
def no_jaxlib(monkeypatch):
  """Makes `import jaxlib` fail, as in an install without the spmd extra."""
  monkeypatch.setitem(sys.modules, 'jaxlib', None)
  monkeypatch.setitem(sys.modules, 'jaxlib.version', None)
  xla_runtime.ClearCache()
  yield
  xla_runtime.ClearCache()


_NO_JAXLIB = ('lingshard.spmd needs jaxlib==0.10.2 (the standalone XLA '
              'partitioner), but jaxlib is not installed; install the spmd '
              'extra: pip install -e .[spmd]')


def test_missing_jaxlib_names_the_extra(no_jaxlib):
  del no_jaxlib
  with pytest.raises(xla_runtime.JaxlibUnavailableError) as e:
    check.CheckModel('toy.FFRegression', 8)
  assert str(e.value) == _NO_JAXLIB


def test_private_xla_protos_sit_behind_the_jaxlib_check(no_jaxlib):
  """The checker reads TF's private HLO protos only through xla_runtime, so
  a missing or other jaxlib fails there with the same one line."""
  del no_jaxlib
  for fn in (check.ProgramSize,
             manual_constants.RouteConstantsIntoManualRegions):
    with pytest.raises(xla_runtime.JaxlibUnavailableError) as e:
      fn(b'')
    assert str(e.value) == _NO_JAXLIB


def test_other_jaxlib_version_names_the_pinned_one():
  with pytest.raises(xla_runtime.JaxlibUnavailableError) as e:
    xla_runtime.CheckJaxlibVersion('0.4.30')
  assert str(e.value) == ('lingshard.spmd needs jaxlib==0.10.2, found jaxlib '
                          '0.4.30; install the spmd extra: pip install -e '
                          '.[spmd]')
  xla_runtime.CheckJaxlibVersion('0.10.2')


def test_cli_bad_input_exits_with_one_line(no_jaxlib):
  del no_jaxlib
  assert spmd_testlib.RunCli('--model=toy.FFRegression') == f'spmd_check: error: {_NO_JAXLIB}'


def test_cli_unknown_model_and_bad_rule():
  assert spmd_testlib.RunCli('--model=toy.FFRegresion') == (
      "spmd_check: error: Model 'toy.FFRegresion' is not registered; did you "
      'mean toy.FFRegression?')
  assert spmd_testlib.RunCli('--model=toy.FFRegression', '--expect=only:gather') == (
      "spmd_check: error: --expect 'only:gather': unknown collective kind "
      "'gather'; one of all-to-all, all-gather, all-reduce, "
      'collective-permute, reduce-scatter')
  assert spmd_testlib.RunCli('--model=toy.FFRegression', '--mesh=2,0') == (
      "spmd_check: error: mesh shape must be positive ints, got '2,0'")


def test_cli_failed_expectation_exits_1_naming_the_op(capsys):
  assert spmd_testlib.RunCli('--model=toy.FFRegression', '--mesh=2,4',
              '--expect=no:all-reduce') == 1
  out = capsys.readouterr().out
  assert "FAILED --expect 'no:all-reduce': all-reduce %" in out
  assert 'gradient_tape/' in out
  assert out.rstrip().endswith('result: FAIL')


def test_cli_toy_model_in_a_fresh_process_prints_the_report():
  """The acceptance command: its own process sets up 8 devices itself."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env['PYTHONPATH'] = _ROOT
  proc = subprocess.run(
      [sys.executable, '-m', 'lingshard.tools.spmd_check',
       '--model=toy.FFRegression', '--mesh=8', '--expect=only:all-reduce'],
      cwd=_ROOT, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout.startswith('SPMD check: toy.FFRegression on mesh 8 (8 '
                                'partitions')
  assert 'parity vs single device: OK' in proc.stdout
  assert 'all-reduce' in proc.stdout and 'result: PASS' in proc.stdout


def test_compile_only_check_reports_analyses_without_parity():
  r = check.CheckModel('toy.FFRegression', (2, 4), compare=False)
  assert r.matches is None and r.ok and r.errors == []
  assert r.flops > 0 and r.compile_seconds > 0
  assert r.program_size > 0 and r.partitioned_size > 0
  assert 'parity vs single device: not compared (compile only)' in r.Report()


def test_comparison_is_dtype_aware_and_exact_for_integers():
  ref = np.array([1.0, -2.0, np.inf, np.nan], np.float32)
  near = ref + np.array([1e-5, 0, 0, 0], np.float32)
  assert check.Compare('a', ref, near).ok
  far = ref + np.array([1e-3, 0, 0, 0], np.float32)
  e = check.Compare('a', ref, far)
  assert not e.ok and e.max_rel == pytest.approx(5e-4, rel=1e-3)
  assert not check.Compare('a', ref, np.array(
      [1.0, -2.0, -np.inf, np.nan], np.float32)).ok
  # A non-finite entry that differs counts among the elements off.
  e = check.Compare('a', ref, np.array([1.0, -2.0, np.inf, 0.0], np.float32))
  assert not e.ok and (e.beyond, e.size) == (1, 4)
  bf16 = tf.bfloat16.as_numpy_dtype
  assert check.Compare('b', ref[:2].astype(bf16),
                        (ref[:2] * 1.01).astype(bf16)).ok
  assert not check.Compare('i', np.array([1, 2]), np.array([1, 3])).ok
  assert check.Compare('i', np.array([1, 2]), np.array([1, 2])).ok


def _KinkedGradient(seed=0):
  """A wi-like gradient [E, M, H] and the same with one token's
  contribution to one hidden unit of one expert changed: what rounding
  across a ReLU kink does (check.ISOLATED_FRACTION)."""
  rng = np.random.default_rng(seed)
  ref = rng.normal(size=[8, 16, 32]).astype(np.float32)
  got = ref.copy()
  got[5, :, 3] += 0.01 * rng.normal(size=16).astype(np.float32)
  return ref, got


def test_isolated_elements_beyond_tolerance_pass_and_are_counted():
  ref, got = _KinkedGradient()
  e = check.Compare('grads.moe.wi', ref, got)
  beyond = int(np.count_nonzero(np.abs(got - ref) > 1e-4 * np.abs(ref).max()
                                + 1e-6))
  assert 0 < beyond <= 16 and e.max_rel > 1e-4
  assert e.ok and (e.beyond, e.size) == (beyond, 4096)


def test_errors_over_a_shard_or_in_small_outputs_are_mismatches():
  ref, got = _KinkedGradient()
  shard = ref.copy()
  shard[:1] *= 1.01  # One of 8 expert shards: 512 of 4096 elements.
  e = check.Compare('grads.moe.wi', ref, shard)
  assert not e.ok and e.beyond > 0.01 * e.size
  # Under 100 elements: no allowance, one element off is a mismatch.
  small = ref[0, 0, :].copy()
  off = small.copy()
  off[3] += 0.01
  e = check.Compare('grads.b', small, off)
  assert not e.ok and (e.beyond, e.size) == (1, 32)
  # An allowance only for floats: integers stay exact.
  ints = np.arange(1000)
  assert not check.Compare('ids', ints, np.where(ints == 7, 8, ints)).ok


def test_report_names_isolated_and_mismatched_tensors():
  r = check.CheckFunction(
      lambda inp: NestedMap(y=sharding.split(inp.x * 2.0, 0, 8)),
      NestedMap(x=np.ones([8, 2], np.float32)), 8, name='doubled')
  assert r.ok and '    isolated' not in r.Report()
  ref, got = _KinkedGradient()
  isolated = check.Compare('grads.moe.wi', ref, got)
  r.errors = [isolated, check.Compare('y', np.ones(4), np.zeros(4))]
  r.matches = False
  report = r.Report()
  assert (f'    isolated grads.moe.wi float32[8, 16, 32]: abs '
          f'{isolated.max_abs:.3g} rel {isolated.max_rel:.3g} (tolerance rel '
          f'0.0001) in {isolated.beyond} of 4096 elements') in report
  assert ('    MISMATCH y float64[4]: abs 1 rel 1 (tolerance rel 1e-09) in '
          '4 of 4 elements') in report


_LIMIT = ('at most 4096 virtual CPU devices (each costs host memory; the '
          "largest registered mesh, m4.MoE2048E36L's, has 2048)")


@pytest.mark.parametrize('mesh', ['100000', '99999999999999999999999',
                                  '64,64,2'])
def test_cli_mesh_beyond_the_device_limit_is_one_line(mesh):
  """Refused before any device is created (a mesh of 100000 grew memory
  past 6 GB; 10**23 was a jaxlib overflow traceback)."""
  xla_runtime.NumCpuDevices()  # Backend up: no test may switch its count.
  num = int(np.prod([int(d) for d in mesh.split(',')], dtype=object))
  assert spmd_testlib.RunCli('--model=m4.TinyMoE', f'--mesh={mesh}') == (
      f"spmd_check: error: mesh shape '{mesh}' needs {num} devices; {_LIMIT}")
  with pytest.raises(xla_runtime.DeviceCountError) as e:
    xla_runtime.ConfigureCpuDevices(num)
  assert str(e.value) == f'cannot create {num} virtual CPU devices: {_LIMIT}'


def test_cli_config_is_checked_before_the_devices_are_created():
  """A mesh within the limit that the config cannot use fails the config
  check, not the device set-up (which would first create 4096 devices)."""
  xla_runtime.NumCpuDevices()
  assert spmd_testlib.RunCli('--model=m4.TinyMoE', '--mesh=4096') == (
      'spmd_check: error: input.bucket_batch_limits[0]=128 must be divisible '
      "by mesh axis 'x' of size 4096 (the batch is split over it)")
  assert xla_runtime.NumCpuDevices() == 8
