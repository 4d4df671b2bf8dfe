"""Writers on a full disk: eval results, decode outputs and exports are
written next to their target and renamed into place, so a failed write is
one line and leaves what was there; nothing temporary is left behind.

A full disk is simulated in this process by RLIMIT_FSIZE (with SIGXFSZ
ignored): every write past the limit fails with EFBIG, "File too large",
through Python's files and TensorFlow's alike, as the checkpoint test does
in a subprocess (test_trainer_ckpt_damage.py)."""

import contextlib
import json
import os
import signal

import pytest

from lingshard import trainer
from lingshard.models import mt_decoder
from lingshard.models import mt_export
from lingshard.train import atomic
from lingshard.train import export
from tests.trainer import fake_translation
from tests.trainer import trainer_testlib

resource = pytest.importorskip('resource')


@contextlib.contextmanager
def FileSizeLimit(nbytes):
  """Files of this process cannot grow past `nbytes` inside the block."""
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, handler)


def _Tree(root):
  """{relative path: bytes, or None for a directory} under `root`."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, root)
      if os.path.isdir(path):
        out[rel] = None
      else:
        with open(path, 'rb') as f:
          out[rel] = f.read()
  return out


@pytest.fixture(name='corpus', scope='module')
def CorpusFixture(tmp_path_factory):
  return fake_translation.WriteCorpus(str(tmp_path_factory.mktemp('corpus')))


def test_write_text_and_replace_dir_leave_the_previous_state(tmp_path):
  path = tmp_path / 'a.json'
  path.write_text('old')
  with FileSizeLimit(16), pytest.raises(OSError) as e:
    atomic.WriteText(str(path), 'x' * 100)
  assert atomic.Reason(e.value) == 'File too large'
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'kept.txt').write_text('previous')

  def Build(directory):
    with open(os.path.join(directory, 'new.txt'), 'w') as f:
      f.write('y' * 100)

  with FileSizeLimit(16), pytest.raises(OSError):
    atomic.ReplaceDir(str(out), Build)
  assert _Tree(tmp_path) == {'a.json': b'old', 'out': None,
                             'out/kept.txt': b'previous'}
  atomic.ReplaceDir(str(out), Build)
  assert _Tree(out) == {'new.txt': b'y' * 100}
  with pytest.raises(NotADirectoryError):  # A file is never replaced.
    atomic.ReplaceDir(str(path), Build)
  assert path.read_text() == 'old'


def test_decode_output_on_a_full_disk_keeps_the_previous_one(corpus,
                                                              tmp_path):
  tsv, spm_path = corpus
  task = fake_translation.NewTask()
  gen = fake_translation.InputParams(tsv, spm_path).Instantiate()
  detok = mt_decoder.Detokenizer(spm_path)
  decoder = mt_decoder.MtDecoder(task, detok, detok)
  records = decoder.DecodeDataset(task.theta, gen.GetDataset())
  out = tmp_path / 'decode_dev'
  decoder.Finalize(records, str(out), 3)
  before = _Tree(tmp_path)
  assert json.loads(before['decode_dev/scores.json'])['step'] == 3
  with FileSizeLimit(256), pytest.raises(atomic.ERRORS) as e:
    decoder.Finalize(records, str(out), 4)
  assert atomic.Reason(e.value) == 'File too large'
  assert _Tree(tmp_path) == before  # Step 3's files, no temporary.


def test_export_on_a_full_disk_keeps_the_previous_one(corpus, tmp_path):
  _, spm_path = corpus
  task = fake_translation.NewTask()
  out = tmp_path / 'export'
  mt_export.Export(task, task.vars, spm_path, spm_path, str(out),
                   metadata={'step': 1})
  before = _Tree(tmp_path)
  with FileSizeLimit(4096), pytest.raises(export.ExportWriteError) as e:
    mt_export.Export(task, task.vars, spm_path, spm_path, str(out),
                     metadata={'step': 2})
  assert str(e.value) == (
      f'cannot write the export to {out}: File too large; nothing was '
      'changed there: free space or pass another --export_dir')
  assert _Tree(tmp_path) == before


@pytest.fixture(name='trained', scope='module')
def TrainedFixture(tmp_path_factory):
  logdir = tmp_path_factory.mktemp('trained')
  _Execute(logdir, '--mode=train', '--max_steps=1')
  return logdir


def _Execute(logdir, *args):
  return trainer.Execute(trainer_testlib.ParseFlags(
      '--model=toy.FFRegression', f'--logdir={logdir}',
      '--params_override=task.train.eval_num_batches=1', *args),
                         printer=lambda _: None)


def test_eval_on_a_full_disk_is_one_line(trained):
  eval_dir = trained / 'eval_dev'
  with FileSizeLimit(64), pytest.raises(trainer.ConfigError) as e:
    _Execute(trained, '--mode=eval')
  assert str(e.value) == (
      f'--logdir {trained}: cannot write {eval_dir}: File too large; free '
      'space or choose another --logdir')
  # The events file is an append-only log; no metrics JSON, no temporary.
  assert [n for n in os.listdir(eval_dir) if not n.startswith('events.')
          ] == []
  _Execute(trained, '--mode=eval')
  assert [n for n in os.listdir(eval_dir) if not n.startswith('events.')
          ] == ['metrics-00000001.json']


def test_eval_dir_that_is_a_file_is_one_line(tmp_path, trained):
  logdir = tmp_path / 'run'
  os.makedirs(logdir)
  os.symlink(trained / 'train', logdir / 'train')
  (logdir / 'eval_dev').write_text('mine')
  with pytest.raises(trainer.ConfigError) as e:
    _Execute(logdir, '--mode=eval')
  assert str(e.value) == (
      f'--logdir {logdir}: cannot write {logdir}/eval_dev: Not a directory; '
      'free space or choose another --logdir')
  assert (logdir / 'eval_dev').read_text() == 'mine'
