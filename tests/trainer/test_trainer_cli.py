"""The trainer binary: --list_models, unknown models, params overrides and
files (exact error messages), print_params, NaN/Inf stop, exit codes; bad
input (a logdir under a file, a binary params file, steps out of range, a
full disk, missing data) is one line, exit 1, and writes nothing."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard import base_input
from lingshard import model_registry
from lingshard import trainer
from lingshard.train import overrides
from lingshard.train import train_loop
from tests import readme_testlib
from tests.trainer import trainer_testlib


def _Execute(*args):
  lines = []
  out = trainer.Execute(trainer_testlib.ParseFlags(*args),
                        printer=lines.append)
  return out, lines


def test_list_models():
  _, lines = _Execute('--list_models')
  keys = model_registry.ListModels()
  assert len(lines) == len(keys)
  width = max(len(k) for k in keys)
  assert (f'{"toy.FFRegression":<{width}}  A 2-hidden-layer MLP regressing a '
          'synthetic teacher (smoke test).') in lines


def test_unknown_model_suggests():
  with pytest.raises(trainer.ConfigError) as e:
    _Execute('--model=toy.FFRegresion', '--mode=print_params')
  assert str(e.value) == ("Model 'toy.FFRegresion' is not registered; did you "
                          'mean toy.FFRegression?')


def test_model_required():
  with pytest.raises(trainer.ConfigError,
                     match=r'^--model is required \(see --list_models\)$'):
    _Execute('--mode=train', '--logdir=/tmp/x')


def test_logdir_required():
  with pytest.raises(trainer.ConfigError,
                     match=r'^--logdir is required for --mode=train$'):
    _Execute('--model=toy.FFRegression')


def test_split_overrides():
  assert overrides.SplitOverrides(
      "a.b=1;c.d='x;y'; e=\"q;\\\"r\" ;;f=[1, 2]") == [
          'a.b=1', "c.d='x;y'", 'e="q;\\"r"', 'f=[1, 2]']
  with pytest.raises(overrides.OverrideError) as e:
    overrides.SplitOverrides("a='x;b=2")
  assert str(e.value) == ("--params_override has an unterminated ' quote: "
                          '"a=\'x;b=2"')


def test_print_params_with_overrides():
  params, lines = _Execute(
      '--model=toy.FFRegression', '--mode=print_params', '--seed=5',
      "--params_override=task.train.optimizer='adafactor';"
      'task.hidden_dims=[16, 8];task.activation=tanh;'
      'task.train.adafactor.beta1=0.5')
  text = lines[0]
  assert "task.train.optimizer : 'adafactor'" in text.splitlines()
  assert 'task.hidden_dims : [16, 8]' in text.splitlines()
  assert "task.activation : 'tanh'" in text.splitlines()
  assert 'task.train.adafactor.beta1 : 0.5' in text.splitlines()
  assert 'task.random_seed : 5' in text.splitlines()
  assert params.task.hidden_dims == [16, 8]
  # Every param after its description, as a comment line.
  assert text == params.ToText(docs=True).rstrip('\n')
  shown = text.splitlines()
  doc = shown[shown.index('task.hidden_dims : [16, 8]') - 1]
  assert doc == '# ' + ' '.join(params.task.Description('hidden_dims').split())
  assert [line for line in shown if not line.startswith('# ')] == (
      params.ToText().splitlines())


def test_printed_params_read_back_as_a_params_file(tmp_path):
  params, lines = _Execute('--model=toy.FFRegression', '--mode=print_params',
                           '--params_override=task.hidden_dims=[16, 8]')
  printed = tmp_path / 'printed.txt'
  printed.write_text(lines[0] + '\n')
  again, _ = _Execute('--model=toy.FFRegression', '--mode=print_params',
                      f'--params_file={printed}')
  assert again.ToText() == params.ToText()


@pytest.mark.parametrize('override,message', [
    ('task.train.learnin_rate=0.1',
     "--params_override 'task.train.learnin_rate=0.1': Unknown param "
     "'task.train.learnin_rate'; did you mean 'learning_rate'?"),
    ('task.train.max_steps=1.5',
     "--params_override 'task.train.max_steps=1.5': expected int, got '1.5'"),
    ('task.train.max_steps=abc',
     "--params_override 'task.train.max_steps=abc': not a literal: 'abc' "
     '(ValueError)'),
    ('task.hidden_dims=7',
     "--params_override 'task.hidden_dims=7': expected list, got '7'"),
    ('task.train.clip_gradient_norm_to_value=yes',
     "--params_override 'task.train.clip_gradient_norm_to_value=yes': not a "
     "literal: 'yes' (ValueError)"),
    ('input.batch_sise=3',
     "--params_override 'input.batch_sise=3': Unknown param "
     "'input.batch_sise'; did you mean 'batch_size'?"),
    ('task.train=3',
     "--params_override 'task.train=3': cannot assign a value to nested "
     'Params'),
    ('nonsense',
     "--params_override 'nonsense': expected key=value"),
])
def test_override_errors(override, message):
  with pytest.raises(overrides.OverrideError) as e:
    _Execute('--model=toy.FFRegression', '--mode=print_params',
             f'--params_override={override}')
  assert str(e.value) == message


def test_params_file(tmp_path):
  good = tmp_path / 'good.txt'
  good.write_text('# a comment\ntask.train.learning_rate : 0.5\n'
                  'input.batch_size : 8\n')
  params, _ = _Execute('--model=toy.FFRegression', '--mode=print_params',
                       f'--params_file={good}',
                       '--params_override=input.batch_size=4')
  assert params.task.train.learning_rate == 0.5
  assert params.input.batch_size == 4  # The override comes after the file.
  bad = tmp_path / 'bad.txt'
  bad.write_text('task.train.learning_rate : 0.5\ntask.nope : 1\n')
  with pytest.raises(overrides.OverrideError) as e:
    _Execute('--model=toy.FFRegression', '--mode=print_params',
             f'--params_file={bad}')
  assert str(e.value) == (
      f"--params_file {bad}: line 2: 'task.nope : 1': Unknown param "
      "'task.nope'; known keys: activation, activation_split_dims_mapping, "
      'batch_axes, device_mesh, dtype, fprop_dtype, hidden_dims, input_dim, '
      'is_inference, mesh_axis_names, name, params_init, random_seed, train, '
      'weight_split_dims_mapping')
  with pytest.raises(overrides.OverrideError,
                     match=r'^--params_file .*missing\.txt: '):
    _Execute('--model=toy.FFRegression', '--mode=print_params',
             f'--params_file={tmp_path / "missing.txt"}')


NAN_ARGS = ('--model=toy.FFRegression', '--max_steps=12',
            '--params_override=task.train.save_interval_steps=5')


def test_nan_stops_with_message_and_exit_code(tmp_path):
  run = trainer_testlib.RunTrainer(*NAN_ARGS, f'--logdir={tmp_path}',
                                   '--test_inject_nan_at_step=7')
  assert run.returncode == 3, run.stderr[-3000:]
  ckpt = tmp_path / 'train' / 'ckpt-5'
  assert re.search(
      r'^lingshard\.trainer: NaN/Inf in loss or gradients at step 7 '
      r'\(loss=nan, grad_norm=\d+\.\d+(e-?\d+)?\); the update was not applied '
      r'and training stopped; the last good checkpoint is '
      + re.escape(str(ckpt)) + '$', run.stderr, re.M), run.stderr[-3000:]
  # The last good checkpoint is the latest one and is usable.
  assert tf.train.latest_checkpoint(str(tmp_path / 'train')) == str(ckpt)
  reader = tf.train.load_checkpoint(str(ckpt))
  assert reader.get_tensor('step/.ATTRIBUTES/VARIABLE_VALUE') == 5
  for key in reader.get_variable_to_shape_map():
    if key.startswith(('theta/', 'opt/')):
      assert np.all(np.isfinite(reader.get_tensor(key))), key
  # Training resumes from it.
  out, lines = _Execute(*NAN_ARGS, f'--logdir={tmp_path}')
  assert lines[-1].startswith('step 12/12 loss ')
  assert np.isfinite(out['loss'][0])


def test_nan_in_process_keeps_state(tmp_path):
  with pytest.raises(train_loop.NonFiniteError) as e:
    _Execute(*NAN_ARGS, f'--logdir={tmp_path}', '--test_inject_nan_at_step=1')
  assert e.value.step == 1 and e.value.checkpoint is None
  assert str(e.value).endswith('training stopped; no checkpoint was saved '
                               'yet')
  assert tf.train.latest_checkpoint(str(tmp_path / 'train')) is None


def test_eval_params_override_only_for_eval():
  cfg = trainer_testlib.ParseFlags(
      '--model=toy.FFRegression', '--params_override=input.batch_size=8',
      '--eval_params_override=input.seed=9;input.batch_size=4')
  train, _ = trainer.BuildParams(cfg)
  dev, _ = trainer.BuildParams(cfg, 'Dev', for_eval=True)
  assert (train.input.batch_size, train.input.seed) == (8, 301)
  assert (dev.input.batch_size, dev.input.seed) == (4, 9)
  bad = trainer_testlib.ParseFlags('--model=toy.FFRegression',
                                   '--eval_params_override=input.nope=1')
  with pytest.raises(overrides.OverrideError) as e:
    trainer.BuildParams(bad, 'Dev', for_eval=True)
  assert str(e.value) == ("--eval_params_override 'input.nope=1': Unknown "
                          "param 'input.nope'; known keys: batch_size, "
                          'input_dim, noise_stddev, seed, teacher_hidden')


def test_time_budget_stops_with_a_checkpoint(tmp_path):
  _, lines = _Execute('--model=toy.FFRegression', f'--logdir={tmp_path}',
                      '--max_train_seconds=1e-9')
  assert lines[-2].startswith('step 1/200 loss ')
  # The budget binds before step 200: the ETA is what is left of it.
  assert lines[-2].endswith(' ETA 0:00:00'), lines[-2]
  assert lines[-1] == 'time budget of 1e-09s reached at step 1'
  assert tf.train.latest_checkpoint(str(tmp_path / 'train')).endswith(
      'ckpt-1')


# ------------------------------------------- bad input: one line, no files
def _Tree(root):
  """Every path under `root`, relative, sorted."""
  return sorted(os.path.relpath(os.path.join(d, n), root)
                for d, dirs, files in os.walk(root) for n in dirs + files)


def _BadRunCases(tmp_path):
  afile = tmp_path / 'afile'
  afile.write_text('not a directory\n')
  binary = tmp_path / 'params.bin'
  binary.write_bytes(b'task.train.max_steps : 5\n\x89PNG\r\n\x1a\n\xff\x00')
  logdir = tmp_path / 'run'
  return {
      'logdir_under_file': (
          [f'--logdir={afile}/run'],
          f'--logdir {afile}/run: {afile} is a file, not a directory; choose '
          'another --logdir'),
      'binary_params_file': (
          [f'--logdir={logdir}', f'--params_file={binary}'],
          f'--params_file {binary}: not a text file (binary data at byte 25); '
          'pass a params text file of "key : value" lines, e.g. a logdir\'s '
          'params.txt'),
      'negative_max_steps': (
          [f'--logdir={logdir}', '--max_steps=-3'],
          '--max_steps=-3: must be >= 1 (the step to train to)'),
  }


@pytest.mark.parametrize('case', ['logdir_under_file', 'binary_params_file',
                                  'negative_max_steps'])
def test_bad_input_is_one_line_exit_1_and_writes_nothing(tmp_path, case):
  args, message = _BadRunCases(tmp_path)[case]
  before = _Tree(tmp_path)
  run = trainer_testlib.RunTrainer('--model=toy.FFRegression', *args)
  assert run.returncode == 1, run.stderr[-3000:]
  assert readme_testlib.OwnStderrLines(run.stderr) == [
      f'lingshard.trainer: error: {message}'], run.stderr[-3000:]
  assert _Tree(tmp_path) == before


@pytest.mark.parametrize('content,offset', [
    (b'task.train.max_steps : 5\n\x00', 25),  # UTF-8, but a NUL byte.
    (b'task.seed : 1\n\xff\xfe', 14),  # Not UTF-8.
])
def test_params_file_binary(tmp_path, content, offset):
  path = tmp_path / 'p.txt'
  path.write_bytes(content)
  with pytest.raises(overrides.OverrideError) as e:
    _Execute('--model=toy.FFRegression', '--mode=print_params',
             f'--params_file={path}')
  assert str(e.value) == (
      f'--params_file {path}: not a text file (binary data at byte {offset}); '
      'pass a params text file of "key : value" lines, e.g. a logdir\'s '
      'params.txt')


def test_params_file_directory(tmp_path):
  with pytest.raises(overrides.OverrideError) as e:
    _Execute('--model=toy.FFRegression', '--mode=print_params',
             f'--params_file={tmp_path}')
  assert str(e.value) == f'--params_file {tmp_path}: Is a directory'


def test_max_steps_below_one_from_params_is_refused(tmp_path):
  logdir = tmp_path / 'run'
  with pytest.raises(trainer.ConfigError) as e:
    _Execute('--model=toy.FFRegression', f'--logdir={logdir}',
             '--params_override=task.train.max_steps=0')
  assert str(e.value) == ('task.train.max_steps is 0; it must be >= 1 (the '
                          'step to train to)')
  assert not logdir.exists()


@pytest.mark.parametrize('flag,message', [
    ('--max_steps=0', '--max_steps=0: must be >= 1 (the step to train to)'),
    ('--max_train_seconds=-1', '--max_train_seconds=-1: must be >= 0 (0 = no '
     'limit)'),
    ('--num_cpu_devices=0', '--num_cpu_devices=0: must be >= 1'),
    ('--num_cpu_devices=100000', '--num_cpu_devices=100000: must be <= 4096 '
     '(each logical CPU device costs host memory and threads; data-parallel '
     'CPU runs need a handful)'),
])
def test_numeric_flags_out_of_range(tmp_path, flag, message):
  with pytest.raises(trainer.ConfigError) as e:
    _Execute('--model=toy.FFRegression', f'--logdir={tmp_path / "run"}', flag)
  assert str(e.value) == message
  assert _Tree(tmp_path) == []


def test_failed_write_of_params_txt_keeps_the_logdir(tmp_path):
  """params.txt is written to a temporary sibling and renamed into place:
  a failed write (here the rename, onto a directory; a full disk fails the
  write the same way) is one line and leaves the logdir as it was."""
  logdir = tmp_path / 'run'
  (logdir / 'params.txt').mkdir(parents=True)
  (logdir / 'params.txt' / 'x').write_text('x\n')
  with pytest.raises(trainer.ConfigError) as e:
    _Execute('--model=toy.FFRegression', f'--logdir={logdir}',
             '--max_steps=2')
  assert str(e.value) == (
      f'--logdir {logdir}: cannot write {logdir}/params.txt: Is a directory; '
      'fix that (e.g. free space) or choose another --logdir')
  # No train/, temporary file or lock left.
  assert _Tree(tmp_path) == ['run', 'run/params.txt', 'run/params.txt/x']


def test_missing_vocabulary_is_found_before_writing(tmp_path):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'train.tsv').write_text('de\tHallo Welt\tHello world\n')
  vocab_file = corpus / 'vocab' / 'spm_shared.model'
  logdir = tmp_path / 'run'
  with pytest.raises(base_input.InputError) as e:
    _Execute('--model=m4.TinyMoE', f'--logdir={logdir}', '--max_steps=2',
             f"--params_override=input.file_pattern='{corpus}/train.tsv';"
             f"input.src_vocab='{vocab_file}';input.tgt_vocab='{vocab_file}'")
  assert str(e.value) == (
      f'src_vocab not found: {vocab_file}; prepare the corpus with: python -m '
      f'lingshard.data.prepare --out {corpus}')
  assert not logdir.exists()
