"""Nothing outside the logdir, nothing lost on failure (issue 53): a state
file naming files elsewhere is refused before anything is deleted (for
absolute and `..` entries, a symlinked logdir and a symlinked train/); a
run that fails to restore keeps params.txt; one trainer per logdir; a
train/ that is a file is one line."""

import os
import re
import shutil
import socket

import pytest

from lingshard import trainer
from lingshard.train import checkpointer
from lingshard.train import logdir_lock
from tests.trainer import trainer_testlib

# Every step saved, one kept: a resumed run deletes what its state file
# lists beyond the newest.
_ARGS = ('--model=toy.FFRegression',
         '--params_override=task.train.save_interval_steps=1;'
         'task.train.max_checkpoints_to_keep=1')
_ADVICE = ('nothing was written: make {train}/checkpoint name a good '
           'checkpoint (one line: model_checkpoint_path: "ckpt-<step>") or use '
           'a new logdir')


def _Execute(logdir, *args):
  cfg = trainer_testlib.ParseFlags(*_ARGS, f'--logdir={logdir}', *args)
  return trainer.Execute(cfg, printer=lambda _: None)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A logdir with params.txt and train/ckpt-2 (the state file lists it)."""
  logdir = tmp_path_factory.mktemp('trained')
  _Execute(logdir, '--max_steps=2')
  return logdir


def _Victim(prefix):
  """Files that look like a checkpoint `prefix` of another run."""
  os.makedirs(os.path.dirname(prefix), exist_ok=True)
  names = [prefix + '.index', prefix + '.data-00000-of-00001']
  for name in names:
    with open(name, 'w') as f:
      f.write(f'another run\'s {os.path.basename(name)}\n')
  return names


def _Layout(trained, tmp_path, case):
  """(logdir to pass, state-file entry, victim files) of a case."""
  if case == 'absolute':
    logdir = tmp_path / 'run'
    shutil.copytree(trained, logdir)
    victim = str(tmp_path / 'other' / 'run' / 'model')
    return logdir, victim, _Victim(victim)
  if case == 'relative':
    logdir = tmp_path / 'run'
    shutil.copytree(trained, logdir)
    return logdir, '../../x/model', _Victim(str(tmp_path / 'x' / 'model'))
  if case == 'symlinked_logdir':
    # link -> real/run: link/train/../../x is tmp_path/x to TensorFlow
    # (which normalises paths as text) and real/x to the OS.
    shutil.copytree(trained, tmp_path / 'real' / 'run')
    logdir = tmp_path / 'link'
    os.symlink(tmp_path / 'real' / 'run', logdir)
    return logdir, '../../x/model', (
        _Victim(str(tmp_path / 'x' / 'model')) +
        _Victim(str(tmp_path / 'real' / 'x' / 'model')))
  assert case == 'symlinked_train'
  # run/train -> other/x: '../train/ckpt-9' reads as run/train/ckpt-9 but
  # is other/train/ckpt-9 (another run's checkpoint): refused, as a check
  # of the normalised text would not.
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir, ignore=shutil.ignore_patterns('train'))
  shutil.copytree(trained / 'train', tmp_path / 'other' / 'x')
  os.symlink(tmp_path / 'other' / 'x', logdir / 'train')
  return logdir, '../train/ckpt-9', _Victim(
      str(tmp_path / 'other' / 'train' / 'ckpt-9'))


@pytest.mark.parametrize('case', ['absolute', 'relative', 'symlinked_logdir',
                                  'symlinked_train'])
def test_state_file_naming_files_elsewhere_deletes_nothing(trained, tmp_path,
                                                           case):
  logdir, entry, victim = _Layout(trained, tmp_path, case)
  train = os.path.join(logdir, 'train')
  # As TF's CheckpointManager writes it (timestamps and all): the victim is
  # the oldest entry, the first one a save with max_to_keep=1 deletes.
  with open(os.path.join(train, 'checkpoint'), 'w') as f:
    f.write(f'model_checkpoint_path: "ckpt-2"\n'
            f'all_model_checkpoint_paths: "{entry}"\n'
            'all_model_checkpoint_paths: "ckpt-2"\n'
            'all_model_checkpoint_timestamps: 1795791804.4\n'
            'all_model_checkpoint_timestamps: 1795791805.4\n'
            'last_preserved_timestamp: 1795791803.2\n')
  before = trainer_testlib.Snapshot(os.path.realpath(logdir))
  message = None
  try:
    _Execute(logdir, '--max_steps=4')
  except checkpointer.CheckpointError as e:
    message = str(e)
  assert [n for n in victim if not os.path.exists(n)] == []
  assert message == (
      f'checkpoint state file {train}/checkpoint names {entry!r}, which is '
      f'not a ckpt-<step> checkpoint of {train}; ' +
      _ADVICE.format(train=train))
  assert trainer_testlib.Snapshot(os.path.realpath(logdir)) == before


def test_pruning_deletes_only_unlisted_checkpoints_of_the_train_dir(
    trained, tmp_path):
  """The state file may list only checkpoints of train/ (here one that is
  gone, and one that is kept); pruning deletes what the state file it
  writes does not list, found in train/ (leftovers of a killed save too)."""
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir)
  train = logdir / 'train'
  (train / 'checkpoint').write_text(
      'model_checkpoint_path: "ckpt-2"\nall_model_checkpoint_paths: '
      f'"{train}/ckpt-1"\nall_model_checkpoint_paths: "ckpt-2"\n')
  (train / 'ckpt-3_temp').mkdir()  # A save of step 3 killed before merging.
  (train / 'ckpt-3_temp' / 'part-00000-of-00001.index').write_text('x')
  (train / 'ckpt-7.index').write_text('a save of step 7 killed mid-merge')
  (train / 'notes.txt').write_text('not ours')
  _Execute(logdir, '--max_steps=4')
  assert sorted(n for n in os.listdir(train) if not n.startswith('events.')
                ) == ['checkpoint', 'ckpt-4.data-00000-of-00001',
                      'ckpt-4.index', 'notes.txt']
  assert (train / 'checkpoint').read_text() == (
      'model_checkpoint_path: "ckpt-4"\nall_model_checkpoint_paths: '
      '"ckpt-4"\n')


def _Truncate(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize('case', ['shape_mismatch', 'truncated_data'])
def test_failed_restore_keeps_params_txt(trained, tmp_path, case):
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir)
  train = logdir / 'train'
  if case == 'shape_mismatch':
    override = 'task.hidden_dims=[32,16]'
    expected = (f'checkpoint {train}/ckpt-2 does not match the model: '
                "variable 'model/fc_001/b' is [16] float32 in the model but "
                '[32] float32 in the checkpoint')
  else:
    # Params that would restore (and a params.txt that would differ).
    override = 'task.train.learning_rate=0.5'
    _Truncate(train / 'ckpt-2.data-00000-of-00001')
    expected = (f'checkpoint file {train}/ckpt-2.data-00000-of-00001 is '
                'unreadable (Read less bytes than requested); ' +
                _ADVICE.format(train=train))
  params_txt = (logdir / 'params.txt').read_bytes()
  before = trainer_testlib.Snapshot(logdir)
  with pytest.raises(checkpointer.CheckpointError) as e:
    _Execute(logdir, '--max_steps=4', f'--params_override={override}')
  assert (logdir / 'params.txt').read_bytes() == params_txt
  assert str(e.value) == expected
  assert trainer_testlib.Snapshot(logdir) == before


def test_second_trainer_is_refused_until_the_lock_is_released(tmp_path):
  """A held logdir is refused in one line naming the holder; after the
  holder ends, a run proceeds. (A SIGKILLed holder:
  tests/trainer/test_trainer_resume.py.)"""
  logdir = tmp_path / 'run'
  with logdir_lock.Hold(str(logdir)):
    before = trainer_testlib.Snapshot(logdir)
    with pytest.raises(trainer.ConfigError) as e:
      _Execute(logdir, '--max_steps=1')
    assert trainer_testlib.Snapshot(logdir) == before
  holder = re.escape(f'pid {os.getpid()} on {socket.gethostname()}, started ')
  assert re.fullmatch(
      re.escape(f'--logdir {logdir} is in use by another trainer (') + holder +
      r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC' + re.escape(
          '); wait for it to finish (or stop it) or choose another --logdir'),
      str(e.value)), str(e.value)
  assert not logdir.exists()  # The holder made it and removed it again.
  # A lock file left behind (its holder was killed) holds nothing.
  logdir.mkdir()
  (logdir / 'trainer.lock').write_text('{"pid": 1, "host": "gone"}\n')
  _Execute(logdir, '--max_steps=1')
  assert sorted(os.listdir(logdir)) == ['params.txt', 'train']


def test_eval_runs_beside_a_training_run(trained, tmp_path):
  """Only training takes the lock: eval reads a held logdir's checkpoint,
  as Lingvo's evaler job reads its trainer's."""
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir)
  with logdir_lock.Hold(str(logdir)):
    result = _Execute(logdir, '--mode=eval',
                      '--params_override=task.train.eval_num_batches=1')
  assert result['step'] == 2


def test_lock_file_that_is_a_link_is_refused(tmp_path):
  logdir = tmp_path / 'run'
  logdir.mkdir()
  target = tmp_path / 'elsewhere.txt'
  target.write_text('not the trainer\'s\n')
  os.symlink(target, logdir / 'trainer.lock')
  with pytest.raises(trainer.ConfigError) as e:
    _Execute(logdir, '--max_steps=1')
  assert str(e.value) == (
      f'--logdir {logdir}: cannot lock {logdir}/trainer.lock: it is a '
      'symbolic link; remove it or choose another --logdir')
  assert target.read_text() == 'not the trainer\'s\n'
  assert sorted(os.listdir(logdir)) == ['trainer.lock']


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_train_dir_that_is_a_file_is_one_line(tmp_path, mode):
  logdir = tmp_path / 'run'
  logdir.mkdir()
  (logdir / 'train').write_text('a file\n')
  with pytest.raises(trainer.ConfigError) as e:
    _Execute(logdir, '--max_steps=1', f'--mode={mode}')
  assert str(e.value) == (f'--logdir {logdir}: {logdir}/train is a file, not '
                          'a directory; choose another --logdir')
  assert sorted(os.listdir(logdir)) == ['train']
