"""Export never deletes what it is given: it refuses a non-empty directory
that is not a previous export (unless asked to overwrite), never replaces
the working, home or root directory or the logdir, and replaces its own
exports through fresh temporary siblings, leaving nothing else behind."""

import json
import os

import pytest

from lingshard import trainer
from lingshard.models import mt_export
from lingshard.train import export
from tests.trainer import fake_translation
from tests.trainer import trainer_testlib


@pytest.fixture(name='spm_path', scope='module')
def SpmFixture(tmp_path_factory):
  return fake_translation.WriteCorpus(str(tmp_path_factory.mktemp('c')))[1]


def _Export(spm_path, out_dir, **kwargs):
  task = fake_translation.NewTask()
  return mt_export.Export(task, task.vars, spm_path, spm_path, out_dir,
                       batch_size=2, max_source_length=5, **kwargs)


def test_refuses_foreign_non_empty_dir_keeps_it(spm_path, tmp_path):
  out = tmp_path / 'mine'
  out.mkdir()
  (out / 'thesis.tex').write_text('years of work')
  with pytest.raises(ValueError, match=(
      rf'^--export_dir {out} is not empty and is not a lingshard export; '
      r'pass --export_overwrite to replace it$')):
    _Export(spm_path, str(out))
  assert (out / 'thesis.tex').read_text() == 'years of work'
  assert sorted(os.listdir(tmp_path)) == ['mine']


def test_overwrite_replaces_foreign_dir(spm_path, tmp_path):
  out = tmp_path / 'mine'
  out.mkdir()
  (out / 'old.txt').write_text('x')
  _Export(spm_path, str(out), overwrite=True, metadata={'step': 3})
  assert export.IsExport(str(out))
  assert not (out / 'old.txt').exists()
  assert json.loads((out / export.MARKER).read_text()) == {'step': 3}
  assert sorted(os.listdir(tmp_path)) == ['mine']  # No temporary left.


def test_replaces_previous_export_and_empty_dir(spm_path, tmp_path):
  out = tmp_path / 'export' / '00000007'
  out.mkdir(parents=True)  # Empty: fine.
  _Export(spm_path, str(out), metadata={'step': 7})
  _Export(spm_path, str(out), metadata={'step': 8})  # Ours: replaced.
  assert json.loads((out / export.MARKER).read_text()) == {'step': 8}
  assert os.listdir(tmp_path / 'export') == ['00000007']


def test_failed_export_leaves_target_and_no_temporary(spm_path, tmp_path):
  out = tmp_path / 'export'
  _Export(spm_path, str(out), metadata={'step': 1})

  class Broken(fake_translation.FakeTranslator):

    def Decode(self, theta, src_ids, src_paddings):
      raise RuntimeError('decode broke')

  task = Broken.Params().Set(name='fake').Instantiate()
  with pytest.raises(RuntimeError, match='decode broke'):
    mt_export.Export(task, task.vars, spm_path, spm_path, str(out))
  assert json.loads((out / export.MARKER).read_text()) == {'step': 1}
  assert os.listdir(tmp_path) == ['export']


@pytest.mark.parametrize('flag, message', [
    ('.', 'would delete the working directory'),
    ('/', 'would delete the root directory'),
    ('~', 'would delete the home directory'),
    ('run/logs', 'would delete the logdir'),
])
def test_refuses_protected_dirs_even_with_overwrite(tmp_path, monkeypatch,
                                                     flag, message):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  (tmp_path / 'home').mkdir()
  (tmp_path / 'run' / 'logs').mkdir(parents=True)
  for overwrite in (False, True):
    with pytest.raises(export.ExportDirError, match=(
        rf'^--export_dir {flag} {message}; pass a new or empty directory$')):
      export.CheckExportDir(flag, overwrite, logdir='run/logs')


@pytest.mark.parametrize('flag, what, inside', [
    ('..', 'the working directory', 'work'),
    ('run', 'the logdir', 'run/logs'),
    ('users', 'the home directory', 'users/me'),
])
def test_refuses_ancestors_of_protected_dirs(tmp_path, monkeypatch, flag,
                                             what, inside):
  (tmp_path / 'work').mkdir()
  (tmp_path / 'run' / 'logs').mkdir(parents=True)
  (tmp_path / 'users' / 'me').mkdir(parents=True)
  monkeypatch.chdir(tmp_path / ('work' if flag == '..' else '.'))
  monkeypatch.setenv('HOME', str(tmp_path / 'users' / 'me'))
  with pytest.raises(export.ExportDirError, match=(
      rf'^--export_dir {flag} would delete {what} {tmp_path / inside} '
      r'inside it; pass a new or empty directory$')):
    export.CheckExportDir(flag, True, logdir=str(tmp_path / 'run' / 'logs'))


def test_export_of_working_directory_deletes_nothing(spm_path, tmp_path,
                                                      monkeypatch):
  (tmp_path / 'notes.txt').write_text('keep')
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match=(
      r'^--export_dir \. would delete the working directory; pass a new or '
      r'empty directory$')):
    _Export(spm_path, '.')
  assert sorted(os.listdir(tmp_path)) == ['notes.txt']


def test_trainer_refuses_before_restoring(tmp_path):
  """The trainer's one-line error, before it looks for a checkpoint (there
  is none); --export_overwrite gets past the check to that error."""
  out = tmp_path / 'mine'
  out.mkdir()
  (out / 'a.txt').write_text('a')
  args = ['--model=m4.TinyMoE', f'--logdir={tmp_path / "log"}',
          '--mode=export', f'--export_dir={out}']
  with pytest.raises(trainer.ConfigError, match=(
      rf'^--export_dir {out} is not empty and is not a lingshard export; '
      r'pass --export_overwrite to replace it$')):
    trainer.Execute(trainer_testlib.ParseFlags(*args), printer=lambda _: None)
  with pytest.raises(trainer.ConfigError, match=r'^no checkpoint in '):
    trainer.Execute(trainer_testlib.ParseFlags(*args, '--export_overwrite'),
                    printer=lambda _: None)
  assert (out / 'a.txt').read_text() == 'a'


def _RunWithFiles(tmp_path):
  """A logdir whose train/ and eval_dev/ hold files, and a previous export."""
  logdir = tmp_path / 'run'
  for name in ('train/checkpoint', 'train/ckpt-30.index',
               'eval_dev/metrics-00000030.json'):
    (logdir / name).parent.mkdir(parents=True, exist_ok=True)
    (logdir / name).write_text(name)
  old = logdir / 'export' / '00000020'
  old.mkdir(parents=True)
  for name in (export.MARKER, export.SAVED_MODEL):
    (old / name).write_text('{}')
  (tmp_path / 'link').symlink_to(logdir / 'train')
  return logdir


@pytest.mark.parametrize('flag, inside', [
    ('run/train', 'run/train'),
    ('run/eval_dev', 'run/eval_dev'),
    ('run/export/../train', 'run/train'),
    ('link', 'run/train'),  # A symbolic link to run/train.
    ('run/export', 'run/export'),  # Holds an export; is not one.
])
def test_refuses_non_export_dirs_inside_logdir_even_with_overwrite(
    tmp_path, monkeypatch, flag, inside):
  logdir = _RunWithFiles(tmp_path)
  monkeypatch.chdir(tmp_path)
  for overwrite in (True, False):
    with pytest.raises(export.ExportDirError) as e:
      export.CheckExportDir(flag, overwrite, logdir='run')
    assert str(e.value) == (
        f'--export_dir {flag} would delete {tmp_path / inside}, a directory '
        'of the logdir that is not a lingshard export; pass a new or empty '
        'directory')
  # A previous export and new or empty directories inside it are fine.
  (logdir / 'empty').mkdir()
  for ok in ('run/export/00000020', 'run/empty', 'run/export/00000030'):
    assert export.CheckExportDir(ok, True, logdir='run') == ok
  assert (logdir / 'train' / 'ckpt-30.index').read_text() == (
      'train/ckpt-30.index')


def test_trainer_refuses_export_over_checkpoints(tmp_path):
  """The audit's case: --export_dir=LOGDIR/train --export_overwrite deleted
  every checkpoint; now one line before restoring, nothing touched."""
  logdir = _RunWithFiles(tmp_path)
  before = sorted(str(p) for p in tmp_path.rglob('*'))
  with pytest.raises(trainer.ConfigError) as e:
    trainer.Execute(trainer_testlib.ParseFlags(
        '--model=m4.TinyMoE', f'--logdir={logdir}', '--mode=export',
        f'--export_dir={logdir}/train', '--export_overwrite'),
                    printer=lambda _: None)
  assert str(e.value) == (
      f'--export_dir {logdir}/train would delete {logdir}/train, a directory '
      'of the logdir that is not a lingshard export; pass a new or empty '
      'directory')
  assert sorted(str(p) for p in tmp_path.rglob('*')) == before
