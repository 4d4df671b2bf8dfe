"""The pinned PyPI wheels whose gettext catalogs make up the corpus.

Wheels are fetched with `pip download --no-deps` into a cache directory and
checked against pinned sha256 digests, so the same pins always give the
same bytes (and hence the same corpus). If the files are already cached,
nothing touches the network.

PINS make the default corpus; LARGE_PINS (prepare --corpus=large) add
more wheels whose catalogs are human translations under permissive
licences (BSD, MIT, Apache-2.0), several of them shipping only compiled
.mo catalogs (see po_extract).

`LINGSHARD_WHEEL_PINS=<file.json>` replaces the built-in pins of either
corpus (e.g. the tests' small handcrafted wheel): a JSON list of objects
with the keys name, version, filename, sha256 and licence.
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

JUPYTERLAB_PACK_VERSION = '4.5.post3'


def _JupyterLabPack(locale, sha256):
  """The pin of a JupyterLab language pack, e.g. locale 'fr_FR'."""
  return WheelPin(
      f'jupyterlab-language-pack-{locale.lower().replace("_", "-")}',
      JUPYTERLAB_PACK_VERSION,
      f'jupyterlab_language_pack_{locale.lower()}-{JUPYTERLAB_PACK_VERSION}'
      '-py2.py3-none-any.whl', sha256, 'BSD-3-Clause')


# The large corpus: PINS and these. Every pin's catalogs were checked to be
# community translations (Transifex, Zanata, Crowdin) with content; left
# out: django-countries (country names only), django-import-export (38
# strings), the empty hu_HU / hy_AM JupyterLab packs, and copyleft
# catalogs (Odoo, CKAN, Weblate, Calibre, Plone).
LARGE_PINS = PINS + (
    WheelPin('horizon', '27.0.0', 'horizon-27.0.0-py3-none-any.whl',
             '8a981dae4fb6626e71553aa185f6e429b0b1efb86b04b0a72c3b18ee04f1f990',
             'Apache-2.0'),
    WheelPin('indico', '3.2.9', 'indico-3.2.9-py3-none-any.whl',
             '194d2e31ccaabd2b9af7809e67d60d942faee35a6b4de36f0c2c280a32ed84c3',
             'MIT'),
    WheelPin('django-oscar', '4.2.1', 'django_oscar-4.2.1-py3-none-any.whl',
             'adbb95ea0130859c204cc6fb221052d6d437ecbaa90800e8418a809f72645e9c',
             'BSD-3-Clause'),
    WheelPin('trac', '1.6', 'Trac-1.6-py3-none-any.whl',
             '5ff2f3394ebee7cc5b8ee465871cfdecb78ee492a74215b47b6d9ddbcc93b5f7',
             'BSD-3-Clause'),
    WheelPin('django-cms', '5.1.3', 'django_cms-5.1.3-py3-none-any.whl',
             'acf31919aab389d2bea253efa97a901bf55e96046a252f23a7a742e495848a5e',
             'BSD-3-Clause'),
    WheelPin('django-filer', '3.6.0', 'django_filer-3.6.0-py3-none-any.whl',
             'b441e081f0f5688d234815bd0421a1bafa10217eac31bdfe7c3ef3b092430bb3',
             'BSD-3-Clause'),
    WheelPin('django-debug-toolbar', '8.0.0',
             'django_debug_toolbar-8.0.0-py3-none-any.whl',
             '329dfd6e1c26d9b4501a5cc69294c8bb734206ccb1bd36e96afc4d14128b630a',
             'BSD-3-Clause'),
    WheelPin('djangorestframework', '3.18.3',
             'djangorestframework-3.18.3-py3-none-any.whl',
             '8544bb674846731b1e3c9b309236ee1dc412905a0aa725be2ec193ca950a7d12',
             'BSD-3-Clause'),
    _JupyterLabPack(
        'ar_SA',
        '5e7af54431cad3f42d67476b0e6dd44ee968a6f723dad37f3847604fcb882bfa'),
    _JupyterLabPack(
        'ca_ES',
        '9b26c81a132714a2fde841be7216849b033e15a49ea5966782ad8485f827a176'),
    _JupyterLabPack(
        'cs_CZ',
        'c4fb76201e2642c85fa5e0e8d1a70d48033e602c90eafb66c26e2c32219a425b'),
    _JupyterLabPack(
        'da_DK',
        '7a68d51f1a6b4f99ccbc4e73494febed457cb1e38bb56e3533c7bec2f8a20740'),
    _JupyterLabPack(
        'de_DE',
        'b716b56f7e0c884f42152d5e36c253ea0f32ca41f99097d842d3934f4a4bc7fb'),
    _JupyterLabPack(
        'el_GR',
        'da37c852e69e2fef00d574ec1193e32dd068ee05e3ae030a7e5b96c7913d6f98'),
    _JupyterLabPack(
        'es_ES',
        '8b315de006bc48d5798988cff6141f00694e411265011ea21570b4f459070381'),
    _JupyterLabPack(
        'et_EE',
        '51cb6d602440c538de6e1f77ca3739c79363b4bb8f2d0ff5539cb0165b4c663a'),
    _JupyterLabPack(
        'fi_FI',
        'a88ea7e9bd5dc2b6e97c3e9ccc2349ddaaa2350b771f09f01b565fa37d744c49'),
    _JupyterLabPack(
        'fr_FR',
        '9f6ce9d4e64b367ff084a2313af29d6ad8a02d1d08000f3e6c53e2856fa9a11f'),
    _JupyterLabPack(
        'he_IL',
        '51543af6702fee41f6e6567091493c9e69f858bc9bdcf2ac65ddee0c44c25c6b'),
    _JupyterLabPack(
        'id_ID',
        'd30e0796c5ffe34fb2e78cf0901c235dc4eaf7da175f725f97d54243b13ba158'),
    _JupyterLabPack(
        'it_IT',
        '7c1454449f44d635e96245af3905626f205761d304bc9537e0c77aa46634ea6a'),
    _JupyterLabPack(
        'ja_JP',
        'f3fe9d9228f79fa5b289bb271564e106b75c21be79e7874a658ad2aa50901299'),
    _JupyterLabPack(
        'ko_KR',
        'a7ca15848e6fc47ecf35e83a791e2ae9dd26bbfdbc8503567593f908f86c51f4'),
    _JupyterLabPack(
        'lt_LT',
        '183c152375e616cfe409217191b823007d47504270eb5f4395151c432159b95c'),
    _JupyterLabPack(
        'nl_NL',
        'fe87d859574e85c5d5a4e3eff9a9a86bb90358a217f9886c75c9c76f9350643f'),
    _JupyterLabPack(
        'no_NO',
        '6eb49be1d955be78e492aca0c4e8dfee0313922433b605ba4ef20188461c407a'),
    _JupyterLabPack(
        'pl_PL',
        '907b0e8acb6bc62c4e320e4edf35b2227e7a2980d3d024943b60f64b7f7eef6d'),
    _JupyterLabPack(
        'pt_BR',
        '15bad442fd7180d05f99f89b452cf493a3f6ec51454f81d3a5531954e39439b6'),
    _JupyterLabPack(
        'ro_RO',
        '7027781c8f91667835ad5aa7e88b8dbc1256d668a22e291f53453425ddd3ff63'),
    _JupyterLabPack(
        'ru_RU',
        'd294daf163b0df9bdd14012b574ff311f1f4a166524b38469e90e26eb2c380f6'),
    _JupyterLabPack(
        'tr_TR',
        '28542891791e8f369c75a8adf944b1bdb24e5aee5c9a80f085e659d5998a9b84'),
    _JupyterLabPack(
        'uk_UA',
        '5f0754c9430cd813fba36d8218cea668efdd827ac06560dd11061c9275532347'),
    _JupyterLabPack(
        'vi_VN',
        'bda91ec033a3075c7dc2934b349301aae40f3c743542bfaa49e4ccb53f05e021'),
    _JupyterLabPack(
        'zh_CN',
        '47cdb0c41c6b066e795c867786c9c29fde527e2bf15aa6b3e9b2bab9929304b5'),
    _JupyterLabPack(
        'zh_TW',
        'cd791451ba7aba37a75af20189cb307adab139c338a32d0c54b38967e6849787'),
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


def Pins(builtin=PINS):
  """The pins of $LINGSHARD_WHEEL_PINS if set, else `builtin`."""
  path = os.environ.get(PINS_ENV)
  return ReadPinsFile(path) if path else builtin


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


def EnsureWheels(cache_dir, pins=None, allow_download=True, builtin=PINS):
  """Returns the local paths of the pinned wheels, downloading missing ones.

  Args:
    cache_dir: directory holding (or receiving) the wheel files.
    pins: the WheelPins to fetch; None = Pins(builtin) ($LINGSHARD_WHEEL_PINS
      or `builtin`), named on stderr by DescribePins.
    allow_download: if False, a missing wheel is an error (offline mode).
    builtin: the built-in pins of the corpus (PINS or LARGE_PINS).

  Returns:
    list of file paths, in `pins` order.

  Raises:
    WheelError: if a wheel is missing (offline), pip fails, a file's
      digest differs from its pin, or the pins file is malformed.
  """
  if pins is None:
    pins = Pins(builtin)
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
