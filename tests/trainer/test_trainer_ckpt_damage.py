"""Damaged checkpoint directories stop the trainer with one CheckpointError
line naming the file and leave every file of `train/` as it was; a save that
fails on a full disk removes its partial files and keeps the previous
checkpoint as the latest."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard import trainer
from lingshard.train import checkpointer
from lingshard.train import state as state_lib
from lingshard.train import step as step_lib
from tests.trainer import trainer_testlib

# ckpt-2 and ckpt-4 in train/.
_ARGS = ('--model=toy.FFRegression',
         '--params_override=task.train.save_interval_steps=2')


def _Execute(logdir, max_steps):
  cfg = trainer_testlib.ParseFlags(*_ARGS, f'--logdir={logdir}',
                                   f'--max_steps={max_steps}')
  return trainer.Execute(cfg, printer=lambda _: None)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  logdir = tmp_path_factory.mktemp('trained')
  _Execute(logdir, 4)
  return logdir


def _Truncate(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


def _Damage(train, case):
  """Damages `train`; returns the message's file-specific start."""
  state = train / 'checkpoint'
  if case == 'garbage_state':
    state.write_text('model_checkpoint_path: "ckpt-4"\nthis is not a proto\n')
    return (rf'checkpoint state file {re.escape(str(state))} is unreadable '
            r'\(2:1 : .+\)')
  if case == 'binary_state':
    state.write_bytes(b'\xff\xfe\x00garbage')
    return (rf'checkpoint state file {re.escape(str(state))} is unreadable '
            r"\('utf-8' codec can't decode byte 0xff in position 0: invalid "
            r'start byte\)')
  if case == 'empty_state':
    state.write_text('')
    return rf'checkpoint state file {re.escape(str(state))} is empty'
  if case == 'state_names_missing':
    state.write_text('model_checkpoint_path: "ckpt-9"\n')
    return re.escape(f"checkpoint state file {state} names 'ckpt-9' but "
                     f'{train}/ckpt-9.index does not exist')
  if case == 'no_state':
    state.unlink()
    return re.escape(f'checkpoint state file {state} is missing but {train} '
                     'holds ckpt-4.index')
  if case == 'truncated_data':
    data = train / 'ckpt-4.data-00000-of-00001'
    _Truncate(data)
    return (rf'checkpoint file {re.escape(str(data))} is unreadable '
            r'\(Read less bytes than requested\)')
  assert case == 'truncated_index'
  _Truncate(train / 'ckpt-4.index')
  return (rf'checkpoint file {re.escape(str(train))}/ckpt-4\.index is '
          r'unreadable \(.+\)')


@pytest.mark.parametrize('case', [
    'garbage_state', 'binary_state', 'empty_state', 'state_names_missing',
    'no_state', 'truncated_data', 'truncated_index'])
def test_damaged_checkpoints_stop_without_writing(trained, tmp_path, case):
  logdir = tmp_path / 'logdir'
  shutil.copytree(trained, logdir)
  train = logdir / 'train'
  start = _Damage(train, case)
  before = trainer_testlib.Snapshot(train)
  with pytest.raises(checkpointer.CheckpointError) as e:
    _Execute(logdir, 6)
  advice = re.escape(
      f'; nothing was written: make {train}/checkpoint name a good '
      'checkpoint (one line: model_checkpoint_path: "ckpt-<step>") or use a '
      'new logdir')
  assert re.fullmatch(start + advice, str(e.value)), str(e.value)
  assert trainer_testlib.Snapshot(train) == before


# A subprocess whose files cannot grow past 8 KiB: writes fail with EFBIG
# ("File too large") like on a full disk. The checkpoint's .data file is
# ~24 KiB; params.txt, the state file, the index and the events file fit.
_FULL_DISK = (
    'import resource, runpy, signal, sys; '
    'signal.signal(signal.SIGXFSZ, signal.SIG_IGN); '
    'resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192)); '
    'runpy.run_module("lingshard.trainer", run_name="__main__")')


def test_full_disk_save_keeps_previous_checkpoint(trained, tmp_path):
  logdir = tmp_path / 'logdir'
  shutil.copytree(trained, logdir)
  train = logdir / 'train'
  run = subprocess.run(
      [sys.executable, '-c', _FULL_DISK, *_ARGS, f'--logdir={logdir}',
       '--max_steps=6'], env=trainer_testlib.TrainerEnv(),
      cwd=trainer_testlib.REPO, capture_output=True, text=True, timeout=300,
      check=False)
  assert run.returncode == 1, run.stderr[-3000:]
  assert run.stderr.splitlines()[-1] == (
      f'lingshard.trainer: error: could not save checkpoint ckpt-6 in {train}: '
      'File too large; its partial files were removed; the latest checkpoint '
      f'is {train}/ckpt-4: free space there (or fix the error) and restart '
      'to resume from it'), run.stderr[-3000:]
  names = sorted(n for n in os.listdir(train) if not n.startswith('events.'))
  assert names == ['checkpoint', 'ckpt-2.data-00000-of-00001', 'ckpt-2.index',
                   'ckpt-4.data-00000-of-00001', 'ckpt-4.index']
  assert tf.train.latest_checkpoint(str(train)) == str(train / 'ckpt-4')
  task = model_registry.GetParams('toy.FFRegression').task.Instantiate()
  state = state_lib.TrainState(task, step_lib.TrainStep(task))
  assert checkpointer.Checkpointer(str(train), state).Restore()[0] == 4
