"""`spmd_check --compile_only`: a config's real train step partitioned and
compiled for its own mesh from shapes alone (no corpus, nothing run)."""

import os
import subprocess
import sys

import pytest

from lingshard import base_input
from lingshard import config_check
from lingshard import model_registry
from lingshard.data import inputs

compile_only = pytest.importorskip('lingshard.spmd.compile_only')

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_cli_compiles_tiny_dense_train_step_for_its_mesh_without_data(
    tmp_path):
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env['PYTHONPATH'] = _ROOT
  # cwd has no data/: nothing is read.
  proc = subprocess.run(
      [sys.executable, '-m', 'lingshard.tools.spmd_check',
       '--model=m4.TinyDense', '--compile_only', '--bucket=0',
       '--expect=only:all-reduce'],
      cwd=str(tmp_path), env=env, capture_output=True, text=True,
      timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert lines[0].startswith('SPMD check: m4.TinyDense on mesh 8 (8 '
                             'partitions'), lines[0]
  assert lines[1] == '  parity vs single device: not compared (compile only)'
  assert 'memory argument' in proc.stdout and 'temp' in proc.stdout
  # Data parallel: the gradients are all-reduced, nothing else moves.
  assert proc.stdout.rstrip().endswith('result: PASS')


def test_batch_spec_is_the_bucket_the_trainer_pads_to():
  params = model_registry.GetParams('m4.MoE128E12L', 'Train')
  spec = params.input.Instantiate().BatchSpec()
  b, t = params.input.bucket_batch_limits[-1], 128
  assert b * t == 2**20  # GShard Table 3: 1M tokens per step.
  assert spec.src.ids.shape == spec.tgt.labels.shape == [b, t]
  assert sorted(k for k, _ in spec.FlattenItems()) == [
      'src.ids', 'src.paddings', 'tgt.ids', 'tgt.labels', 'tgt.paddings',
      'tgt.weights']
  with pytest.raises(base_input.InputError) as e:
    inputs.MtInput(params.input).BatchSpec(3)
  assert str(e.value) == ('bucket 3 out of range: 3 buckets '
                          '[32, 64, 128]')


def test_config_without_mesh_and_input_without_spec_are_one_line_errors():
  with pytest.raises(config_check.ConfigCheckError) as e:
    compile_only.CompileModel('toy.FFRegression')
  assert str(e.value) == ('toy.FFRegression: task.device_mesh is None; '
                          'compile_only compiles a config for its own mesh')
  with pytest.raises(base_input.InputError) as e:
    base_input.BaseInputGenerator(
        base_input.BaseInputGenerator.Params()).BatchSpec()
  assert str(e.value) == ('BaseInputGenerator defines no BatchSpec: it '
                          'cannot describe its batches without reading data')
