"""Pinned Python sources for lm_prepare's larger corpus (--sources).

  python -m lingshard.data.lm_prepare --sources=large --out data/lm_en_large
  python -m lingshard.data.lm_sources [NAME...]  # PINS lines, as installed

A source is this interpreter's standard library (`stdlib`) or one installed
distribution of the project's venv (site-packages), pinned in PINS by name,
exact version, licence and a sha256 fingerprint of exactly the .py files
the builder reads; or a pinned PyPI wheel, read from the wheel file
(lm_wheel_sources). `--sources` takes pin names (PEP 503 spelling, e.g.
`absl-py`) and set names (`large`: every pin, the wheels too), comma-
separated; the sources are always read in pin order (PINS, then the
wheels), so the same set gives the same bytes whatever order it is written
in.

Files read: the stdlib as the default corpus walks it (`Modules`); a
distribution's .py files listed in its dist-info RECORD (a wheel's zip
members), with the same skips (test packages, test_*.py) plus vendored
trees (`_vendor`, `vendor`, `extern`, ...), `*_test.py`, conftest.py,
protobuf `*_pb2.py`, generated schema migrations (`migrations/0001_*.py`,
Alembic's `migrations/versions/`) and locale data (`locale/<lang>/*.py`).
Generated API re-export `__init__.py` files (a "MACHINE GENERATED" / "DO
NOT EDIT" header) are read for the fingerprint but give no prose. Only
regular files are opened (a FIFO or device named `x.py` is never opened:
it could block forever), and files over MAX_SOURCE_BYTES are not read
(ReadFile raises OSError: lm_prepare skips and counts them).

Fingerprint: sha256 of the lines `<relative path>\\t<file sha256>\\n` of the
files read, sorted by path (paths relative to site-packages, or to the
stdlib directory). Licence: from the dist-info metadata (License-Expression,
else a one-line License field, else the License :: classifiers); it must
equal the pin's and be permissive (PERMISSIVE). A source that is missing,
at another version, or whose files or licence changed is a one-line
SourceError naming it.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import collections
import contextlib
import hashlib
import importlib.metadata
import os
import platform
import re
import stat
import sys
import sysconfig
import zipfile

SourcePin = collections.namedtuple('SourcePin',
                                   ['name', 'version', 'licence', 'sha256'])
SourcePin.__doc__ = ('A pinned source: name, exact version, licence, sha256 '
                     'fingerprint of the files read.')
Source = collections.namedtuple(
    'Source', ['pin', 'modules', 'licence_files', 'archive'], defaults=[None])
Source.__doc__ = ('A verified source: its pin, ((relative path, file), ...) '
                  'to read, ((name, file), ...) of its licence texts and the '
                  'zip file they are members of (None: files on disk); see '
                  'ReadFile.')

STDLIB = 'stdlib'
STDLIB_LICENCE = 'PSF-2.0'

# Dedup order (first occurrence wins): the stdlib, setup.py's
# install_requires, its extras (test, spmd), then (alphabetically) their
# installed, permissively licensed dependencies with >= 1,000 words of
# prose, and pip (the venv's own installer). Left out: regex (Apache-2.0
# AND CNRI-Python), namex (no licence metadata), ruff (no Python sources),
# tzdata, six, gast, ... (< 1,000 words each). All of them give 2,729,211
# train words (of 2,986,670), the venv's whole permissive prose; `large`
# adds the 12 wheels of lm_wheel_sources (after these): 3,238,733 (of
# 3,548,838).
PINS = (
    SourcePin('stdlib', '3.11.7', 'PSF-2.0',
        '81c1c48a12b3ddab9c02386f11ffd301601facbdf55affb02959aed148351d9a'),
    SourcePin('tensorflow', '2.21.0', 'Apache-2.0',
        'fb689787f94b51435d5b650000cf1b173c6e6d01d1fc288d2b099f6c83387752'),
    SourcePin('tensorflow-text', '2.21.1', 'Apache-2.0',
        'a0053e6f5b897c27f5c7b7552d50d161d18d8002f91aa680059d556696b5ff06'),
    SourcePin('sentencepiece', '0.2.3', 'Apache-2.0',
        '439e87528751a0d0d975a4a60664eabb41fc8df46375b1d0da42dfbc924104f4'),
    SourcePin('absl-py', '2.5.1', 'Apache-2.0',
        'e754746dcb81a8d866c95213c94a090da1d9b2cc610998a12c4d0d74b98aa0fe'),
    SourcePin('sacrebleu', '2.6.0', 'Apache-2.0',
        '2c8bcd8f56712d4e9cd802b0d1efdb11ace48e24fcab0adfd0a2cc22595ae71a'),
    SourcePin('numpy', '2.4.6',
        'BSD-3-Clause AND 0BSD AND MIT AND Zlib AND CC0-1.0',
        '9930d53c5078305a55f1ab72b8354589bd239090148b5127daa0a617e80e2757'),
    SourcePin('polib', '1.2.0', 'MIT',
        'b39efe2a5357899ee4943e4b0f2202f71a02cd6db3f66ab6385b0e8348dea7ce'),
    SourcePin('pytest', '9.2.0', 'MIT',
        '0d2a013a55593488ad5fcbee7b901336ca41c17e511aad94359f2d2cd066c0a8'),
    SourcePin('pytest-xdist', '3.8.0', 'MIT',
        'fe316704e77b8b8fffd3ff555512072f037cff1e039ddf7c00486e205c12951f'),
    SourcePin('hypothesis', '6.170.17', 'MPL-2.0',
        'e0cc9350f5e8776e3f8ed8afd9683b47600e3d07f29d5cef2ed47907f4f0020a'),
    SourcePin('jax', '0.10.2', 'Apache-2.0',
        '91778eaff3e048baa7edcd42910e7a20f528869aa2fae72605828e459fb9e231'),
    SourcePin('jaxlib', '0.10.2', 'Apache-2.0',
        'e1ff946c2ce865c6e098877bc19ec5e16e9f122f2b59e61687fa9b1c3a43a0f5'),
    SourcePin('matplotlib', '3.11.2', 'PSF',
        'cdf904ab203b703400d2f124ca02786d4c2b73653fa32b63332cd55e58207a14'),
    SourcePin('charset-normalizer', '3.5.3', 'MIT',
        '81d6e4e2cff2bfac90aa98c5bb4e8b301ae53e2a8ff8370918a09a7a985c05e7'),
    SourcePin('contourpy', '1.3.3', 'BSD',
        '1076eae327e86585f93aa24aa0ee27558ee7cc92fdceb59c6fc70dc04b41d304'),
    SourcePin('execnet', '2.1.2', 'MIT',
        'b0f8a1b72b550283ca30b12ee758b0468128acfd06204e043d8575e74eae5079'),
    SourcePin('flatbuffers', '25.12.19', 'Apache-2.0',
        'cae3ae53777a5e3042073400ad8b17375039ca660982d1ee801fe003bcaa513c'),
    SourcePin('fonttools', '4.68.0', 'MIT',
        '94a0bc739c6846ff080307fa5e2167d80e2a883839e29887f8edf65bad1ceb9d'),
    SourcePin('google-pasta', '0.2.0', 'Apache-2.0',
        '5d2a9cf7835fe5c90700d269708227583d79fd7fc9963e3f0ef7971c2aa23ff3'),
    SourcePin('grpcio', '1.85.3', 'Apache-2.0',
        'cde307a0e3ef58027d3b0ea224e146fb67158b8d3a81e0df71985e0edf114ba2'),
    SourcePin('h5py', '3.14.0', 'BSD-3-Clause',
        '20be459e31509026fddc4b4f54f1eb1ad42a3d263f12d57fa535b55a7c769207'),
    SourcePin('idna', '3.20', 'BSD-3-Clause',
        'd54cf1958c7b1ba6f2048cada69d9c82a6b2850075b9fcfac67a92fa0472cf6c'),
    SourcePin('keras', '3.15.1', 'Apache-2.0',
        'fb79bf1544858017822ea9b1eed0b8dca3c18a1ba541761d203b8ccd8fc51103'),
    SourcePin('libclang', '18.1.1', 'Apache-2.0',
        'd83ac57e9c3e1fa85f60621d118f33e507ebf107b2191d91195b1df850c9956d'),
    SourcePin('lxml', '6.1.3', 'BSD-3-Clause',
        '697f614a4ddf7417c02c83b7f87753a86890736ff6ea71fb41136438e1778df2'),
    SourcePin('markdown-it-py', '4.3.0', 'MIT',
        '5a3de28a503b6e72bc3cb5225ec3abdaa5661142953888f51676a9409bdcb259'),
    SourcePin('opt-einsum', '3.4.0', 'MIT',
        'fdff6f6fe57aaf781d7ca23d7933ce73f837115d7958625c7683c47ecbbef7d1'),
    SourcePin('optree', '0.20.0', 'Apache-2.0',
        '5ca2ddbe92e596de7abf141a9ba2967002695867abff4c0f67f180b09822491f'),
    SourcePin('packaging', '26.4', 'Apache-2.0 OR BSD-2-Clause',
        '88106adcae85aec35f1dcb96f8ca3a69bab8d8f2f829e6fed55dbbd09b3ecc5b'),
    SourcePin('pillow', '13.0.0', 'MIT-CMU',
        '8aed8de050e1ad74a195ef655a264caa6906796751b4ea82a0de757916d363e1'),
    SourcePin('pluggy', '1.7.0', 'MIT',
        '3d16fd0521b59c62827f48d9f1e56fcd3b7608952c4b7f341eb71922670c5176'),
    SourcePin('portalocker', '4.4.2', 'BSD-3-Clause',
        'd6379713ff51c0d57f588c875000a447b692b225682686c467e79f7b8afca4c5'),
    SourcePin('protobuf', '7.36.2', 'BSD-3-Clause',
        '93a24ab791c61ab23434613f50018aecf718c8b23237fa5c1892a7571f012c31'),
    SourcePin('pygments', '2.21.0', 'BSD-2-Clause',
        '05fb91e024ac41614984d64432692c8c6aaa2d7ef09cd6984b776ac4f60a6be2'),
    SourcePin('pyparsing', '3.3.3', 'MIT',
        '400946c68da95d8b5b7c20121639665b2341e55ec5b1ebef40f95a7856e3c0c1'),
    SourcePin('python-dateutil', '4.0.0', 'BSD-3-Clause',
        '8d364a3ac467c537fb71bbc1bb6f0984868327b6413b11b157a646032c1655a3'),
    SourcePin('requests', '2.34.2', 'Apache-2.0',
        '18355d0d2b9ded2b0159ad1aabd19132ab33e702ae3a5be6b9a5c24831e5862d'),
    SourcePin('rich', '15.0.0', 'MIT',
        '44225b3736ad0d12b1ead1ffe84f079b2a13a7b6a3162edb2ea787133abada3d'),
    SourcePin('scipy', '1.17.1', 'BSD',
        'ce7d8c6350d480853bfc4e17aadd9706af314e483dc56bdafc14af299ffffec0'),
    SourcePin('setuptools', '65.5.0', 'MIT',
        '1023b311e547f1f2bfd24535b9d219f0962c6075833f4b6ef8b4d5784c0bee48'),
    SourcePin('sortedcontainers', '2.4.0', 'Apache-2.0',
        '654e1e13d485fe62ea8d7b44205dbd71f01b69785b4891ac28e06bc15c6b5756'),
    SourcePin('tabulate', '0.10.0', 'MIT',
        '5d35778299f9ed20293c30fcce0ad16ea9e811412530769e6b5151f28169cfbc'),
    SourcePin('typing-extensions', '4.16.0', 'PSF-2.0',
        '5f8d95ca75f8e8b93312fc0f44f34841731772b35cb3a992120d0c65a1bf8cbf'),
    SourcePin('urllib3', '2.8.0', 'MIT',
        'cc65e51c62a40154c8036b116549111042d305e80bc07e8774b7268ed604cb6c'),
    SourcePin('wheel', '0.48.0', 'MIT',
        '66b1774fef5fc92792d458926391e8210b006ba41eed72db151f82c5a42cb79b'),
    SourcePin('wrapt', '2.5.2', 'BSD-2-Clause',
        'd388abffd5843137fa16a3b443b93a916d153337d906ea4ef102dcebee57f065'),
    SourcePin('pip', '26.3', 'MIT',
        '75cacce02cf6bc1387967ac66f6ad11ffd9ed19dbbd94d42e4cb2125d1d976af'),
)

SETS = ('large',)  # Every pin.
PERMISSIVE = frozenset((
    'Apache', 'Apache-2.0', 'BSD', 'BSD-2-Clause', 'BSD-3-Clause', '0BSD',
    'MIT', 'MIT-CMU', 'ISC', 'Zlib', 'CC0-1.0', 'PSF', 'PSF-2.0',
    'Python-2.0', 'MPL-2.0'))
_LICENCE_ALIASES = {
    'apache 2.0': 'Apache-2.0', 'apache license 2.0': 'Apache-2.0',
    'apache license, version 2.0': 'Apache-2.0', 'apache-2.0': 'Apache-2.0',
    'apache software license': 'Apache', 'bsd': 'BSD', 'bsd license': 'BSD',
    'bsd 3-clause': 'BSD-3-Clause', '3-clause bsd license': 'BSD-3-Clause',
    'bsd-3-clause': 'BSD-3-Clause', 'bsd-2-clause': 'BSD-2-Clause',
    'mit': 'MIT', 'mit license': 'MIT', 'isc license (iscl)': 'ISC',
    'python software foundation license': 'PSF',
    'mozilla public license 2.0 (mpl 2.0)': 'MPL-2.0',
}
# Directory names never read: the default corpus's (test packages, demos,
# fixtures, GUI apps) and, for distributions, vendored copies of others.
_SKIP_DIRS = {'test', 'tests', 'idlelib', 'turtledemo', 'lib2to3',
              'site-packages', 'dist-packages', '__pycache__', 'ensurepip',
              'tkinter', 'pydoc_data'}
_VENDOR_DIRS = {'_vendor', 'vendor', '_vendored', 'vendored', 'extern',
                '_extern', 'third_party'}
_GENERATED_RE = re.compile(rb'MACHINE GENERATED|DO NOT EDIT', re.IGNORECASE)
_LICENCE_FILE_RE = re.compile(
    r'^(LICEN[CS]E|COPYING|NOTICE|AUTHORS|THIRD_PARTY_NOTICES)', re.IGNORECASE)
_PIN_HINT = ('or re-pin (python -m lingshard.data.lm_sources) in '
             'lingshard/data/lm_sources.py')


# Far above every pinned source file (the largest, jaxlib's generated
# _llvm_ops_gen.py, is 0.9 MB); bounds what one file can cost the parser.
MAX_SOURCE_BYTES = 4 << 20


class SourceError(ValueError):
  """A pinned source that is missing or differs from its pin (one line)."""


def CanonicalName(name):
  """PEP 503 spelling: lower case, runs of -_. as one '-'."""
  return re.sub(r'[-_.]+', '-', name).lower()


def Select(spec, pins=None):
  """The pins (default PINS) named by a --sources value (pin and set names),
  in pins order."""
  pins = PINS if pins is None else pins
  known = {p.name: p for p in pins}
  wanted = set()
  for item in spec.split(','):
    name = CanonicalName(item.strip())
    if name in SETS:
      wanted.update(known)
    elif name in known:
      wanted.add(name)
    else:
      raise SourceError(f'--sources: unknown source {item.strip()!r}; choose '
                        f'from {", ".join(SETS + tuple(known))}')
  return tuple(p for p in pins if p.name in wanted)


def Modules(root, max_modules=0):
  """Sorted relative paths of the .py files under root (skips _SKIP_DIRS)."""
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and
                         not d.startswith(('test_', '.')))
    for name in sorted(filenames):
      if name.endswith('.py') and not name.startswith('test_'):
        out.append(os.path.relpath(os.path.join(dirpath, name), root))
  out.sort()
  return out[:max_modules] if max_modules else out


def IsPackageModule(path):
  """Whether a RECORD path (posix, relative to site-packages) is read."""
  *dirs, name = path.split('/')
  if any(d in _SKIP_DIRS or d in _VENDOR_DIRS or d == '..' or
         d.startswith(('test_', '.')) for d in dirs):
    return False
  # Generated schema migrations (Django's migrations/0001_*.py, Alembic's
  # migrations/versions/) and per-language locale data (django/conf/locale/
  # fr/formats.py), not the migration or locale code beside them.
  if 'locale' in dirs[:-1]:
    return False
  if 'migrations' in dirs:
    below = dirs[dirs.index('migrations') + 1:]
    if 'versions' in below or not below and name[:1].isdigit():
      return False
  return (name.endswith('.py') and not name.startswith('test_') and
          not name.endswith(('_test.py', '_pb2.py', '_pb2_grpc.py')) and
          name != 'conftest.py')


def OpenRegular(path):
  """`path` open for binary reading; OSError unless it is a regular file
  (checked by stat before opening and by fstat after, so a FIFO or device
  is never read and a file swapped for one in between is refused)."""
  if not stat.S_ISREG(os.stat(path).st_mode):
    raise OSError(f'{path}: not a regular file')
  fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
  try:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      raise OSError(f'{path}: not a regular file')
    return os.fdopen(fd, 'rb')
  except BaseException:
    os.close(fd)
    raise


def _Sha256(path):
  digest = hashlib.sha256()
  try:
    with OpenRegular(path) as f:
      for chunk in iter(lambda: f.read(1 << 20), b''):
        digest.update(chunk)
  except OSError:
    return 'missing'
  return digest.hexdigest()


def IsGenerated(path, head=None):
  """Whether a module is a generated `__init__.py` (its header, `head` or
  the file's first 1000 bytes, says so): re-exports, no prose."""
  if os.path.basename(path) != '__init__.py':
    return False
  try:
    if head is None:
      with OpenRegular(path) as f:
        head = f.read(1000)
  except OSError:
    return False
  return bool(_GENERATED_RE.search(head[:1000]))


def Fingerprint(files):
  """sha256 of `<path>\\t<file sha256>` lines of (path, file) pairs, sorted."""
  digest = hashlib.sha256()
  for rel, path in sorted(files):
    digest.update(f'{rel}\t{_Sha256(path)}\n'.encode())
  return digest.hexdigest()


def MetadataLicence(metadata):
  """A distribution's licence: License-Expression, else a one-line License
  field (SPDX-spelt where known), else its License :: classifiers."""
  expr = (metadata.get('License-Expression') or '').strip()
  if expr:
    return expr
  text = (metadata.get('License') or '').strip()
  if text and '\n' not in text and len(text) <= 60 and text != 'UNKNOWN':
    return _LICENCE_ALIASES.get(text.lower(), text)
  names = []
  for c in metadata.get_all('Classifier') or []:
    if c.startswith('License ::'):
      name = c.split('::')[-1].strip()
      names.append(_LICENCE_ALIASES.get(name.lower(), name))
  return ' AND '.join(sorted(set(names))) or 'unknown'


def IsPermissive(licence):
  """Whether every licence of an (SPDX-style) expression is PERMISSIVE."""
  ids = [t for t in re.split(r'\s+(?:AND|OR)\s+|[()]', licence) if t.strip()]
  return bool(ids) and all(t.strip() in PERMISSIVE for t in ids)


def _Name(pin):
  return f'pinned source {pin.name}=={pin.version}'


def _Check(pin, licence, files):
  """SourceError unless `licence` and the files' fingerprint match the pin."""
  if not IsPermissive(pin.licence):
    raise SourceError(f'{_Name(pin)}: licence {pin.licence!r} is not one of '
                      f'the permissive licences {", ".join(sorted(PERMISSIVE))}')
  if licence != pin.licence:
    raise SourceError(f'{_Name(pin)}: its licence changed (metadata '
                      f'{licence!r} != pinned {pin.licence!r}); check it, '
                      f'{_PIN_HINT}')
  got = Fingerprint(files)
  if got != pin.sha256:
    raise SourceError(f'{_Name(pin)}: its sources changed (fingerprint '
                      f'{got[:12]}… != pinned {pin.sha256[:12]}…); reinstall '
                      f'it, {_PIN_HINT}')


def _StdlibSource(pin, root):
  found = platform.python_version()
  if found != pin.version:
    raise SourceError(f'{_Name(pin)} is not installed (found {found} in '
                      f'{root}); run Python {pin.version}, {_PIN_HINT}')
  files = _StdlibFiles(root)
  _Check(pin, STDLIB_LICENCE, files)
  licences = [('LICENSE.txt', os.path.join(root, 'LICENSE.txt'))]
  return Source(pin, tuple(files), tuple(
      (n, p) for n, p in licences if os.path.isfile(p)))


def _Distribution(pin, roots):
  dists = list(importlib.metadata.Distribution.discover(name=pin.name,
                                                        path=roots))
  where = ', '.join(roots)
  if not dists:
    raise SourceError(f'{_Name(pin)} is not installed in {where}; install '
                      f'it or leave it out of --sources')
  for dist in dists:
    if dist.version == pin.version:
      return dist
  found = ', '.join(sorted({d.version for d in dists}))
  raise SourceError(f'{_Name(pin)} is not installed (found {found} in '
                    f'{where}); install {pin.name}=={pin.version}, '
                    f'{_PIN_HINT}')


def _LicenceFiles(records):
  """(name, relative path) of the dist-info's licence texts (else the
  package's top-level ones, e.g. tensorflow/THIRD_PARTY_NOTICES.txt)."""
  out = []
  for rel in records:
    parts = rel.split('/')
    if len(parts) >= 2 and parts[0].endswith('.dist-info') and (
        parts[1] == 'licenses' or _LICENCE_FILE_RE.match(parts[-1])):
      rest = parts[2:] if parts[1] == 'licenses' and len(parts) > 2 else (
          parts[1:])
      out.append(('_'.join(rest), rel))
  if not out:
    out = [(parts[-1], rel) for rel in records
           for parts in [rel.split('/')]
           if len(parts) == 2 and _LICENCE_FILE_RE.match(parts[1])]
  return sorted(out)


def _PackageFiles(dist):
  """Sorted RECORD paths and the (path, file) pairs of the .py files read."""
  records = sorted({str(f).replace(os.sep, '/') for f in dist.files or ()})
  return records, [(rel, str(dist.locate_file(rel))) for rel in records
                   if IsPackageModule(rel)]


def _StdlibFiles(root):
  return [(m, os.path.join(root, m)) for m in Modules(root)]


def _PackageSource(pin, roots):
  dist = _Distribution(pin, roots)
  if dist.files is None:
    raise SourceError(f'{_Name(pin)}: its files are not listed (no RECORD '
                      f'in its dist-info); reinstall it with pip')
  records, files = _PackageFiles(dist)
  _Check(pin, MetadataLicence(dist.metadata), files)
  licences = [(n, str(dist.locate_file(rel)))
              for n, rel in _LicenceFiles(records)]
  return Source(pin, tuple((rel, path) for rel, path in files
                           if not IsGenerated(path)), tuple(licences))


def DefaultSitePackages():
  """This interpreter's site-packages directories (purelib, platlib)."""
  paths = sysconfig.get_paths()
  return sorted({paths['purelib'], paths['platlib']})


def Resolve(pins, site_packages=None, stdlib_root=None):
  """Verified Sources of `pins` (SourceError: the first one that differs).

  Args:
    pins: SourcePins (e.g. Select(...)).
    site_packages: directories holding the distributions; default
      DefaultSitePackages().
    stdlib_root: the standard library directory; default this
      interpreter's.
  """
  roots = list(site_packages or DefaultSitePackages())
  stdlib_root = stdlib_root or sysconfig.get_paths()['stdlib']
  return tuple(_StdlibSource(p, stdlib_root) if p.name == STDLIB else
               _PackageSource(p, roots) for p in pins)


@contextlib.contextmanager
def Opened(source):
  """The source's archive, open for ReadFile (None: files on disk)."""
  with (zipfile.ZipFile(source.archive) if source.archive else
        contextlib.nullcontext()) as archive:
    yield archive


def ReadFile(archive, file):
  """A source file's bytes: a path, a member of the (Opened) archive, read
  in memory, never extracted, or the bytes themselves.

  Raises:
    OSError: the file is not a regular file (OpenRegular), is larger than
      MAX_SOURCE_BYTES or cannot be read.
  """
  if isinstance(file, bytes):
    return file
  if archive is not None:
    if archive.getinfo(file).file_size > MAX_SOURCE_BYTES:
      raise OSError(f'{file}: larger than {MAX_SOURCE_BYTES} bytes')
    return archive.read(file)
  with OpenRegular(file) as f:
    data = f.read(MAX_SOURCE_BYTES + 1)
  if len(data) > MAX_SOURCE_BYTES:
    raise OSError(f'{file}: larger than {MAX_SOURCE_BYTES} bytes')
  return data


def CurrentPins(names, site_packages=None, stdlib_root=None):
  """Pins of what is installed now under these names (for re-pinning)."""
  roots = list(site_packages or DefaultSitePackages())
  stdlib_root = stdlib_root or sysconfig.get_paths()['stdlib']
  out = []
  for name in names:
    if name == STDLIB:
      out.append(SourcePin(STDLIB, platform.python_version(), STDLIB_LICENCE,
                           Fingerprint(_StdlibFiles(stdlib_root))))
      continue
    dists = list(importlib.metadata.Distribution.discover(name=name,
                                                          path=roots))
    if not dists:
      raise SourceError(f'source {name} is not installed in '
                        f'{", ".join(roots)}')
    _, files = _PackageFiles(dists[0])
    out.append(SourcePin(CanonicalName(name), dists[0].version,
                         MetadataLicence(dists[0].metadata),
                         Fingerprint(files)))
  return tuple(out)


def main(argv):
  """Prints PINS lines for the named sources (default: the pinned ones)."""
  names = argv[1:] or [p.name for p in PINS]
  for pin in CurrentPins(names):
    note = '' if IsPermissive(pin.licence) else '  # NOT PERMISSIVE'
    print(f'    SourcePin({pin.name!r}, {pin.version!r}, {pin.licence!r},'
          f'{note}\n              {pin.sha256!r}),')


if __name__ == '__main__':
  main(sys.argv)
