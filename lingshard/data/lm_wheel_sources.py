"""Pinned PyPI wheels as sources of lm_prepare's larger corpus (--sources).

  python -m lingshard.data.lm_prepare --sources=large --out data/lm_en_large
      [--wheel_cache DIR] [--offline]

The wheels are the MT corpus's (lingshard/data/wheels.py LARGE_PINS:
django, wagtail, sphinx, horizon, indico, ...; sha256-pinned, BSD / MIT /
Apache-2.0), in the same cache as `prepare --corpus=large`: a missing one
is downloaded by pip unless --offline (wheels.EnsureWheels), and a missing
or changed file is a one-line WheelError naming it. $LINGSHARD_WHEEL_PINS
replaces them, as for prepare. Left out: the JupyterLab language packs (one
10-word `__init__.py` each; lm_sources keeps sources of >= 1,000 words).

A wheel source is named by its pin (PEP 503 spelling) and comes after
lm_sources.PINS, in LARGE_PINS order; a name that is also an lm_sources pin
is an error (a package is read once). Its pin is the WheelPin: the wheel's
sha256 is its fingerprint; the licence of its METADATA (as
lm_sources.MetadataLicence reads a distribution's) must agree with the pin
(equal, or its bare family: `BSD` for `BSD-3-Clause`) and be permissive;
its dist-info licence files (po_extract.WheelMetadata, as prepare reads
them) go to licenses/. Read: the .py members lm_sources.IsPackageModule
keeps (an installed distribution's skips), in memory, straight from the
zip; never extracted, imported or run.
"""

import email
import os

from lingshard.data import lm_sources
from lingshard.data import po_extract
from lingshard.data import wheels

BUILTIN = tuple(p for p in wheels.LARGE_PINS
                if not p.name.startswith('jupyterlab-language-pack-'))
_FAMILIES = ('BSD', 'Apache')  # Metadata that names no version of these.
_PIN_HINT = ('check it, or fix the pin (lingshard/data/wheels.py or '
             f'${wheels.PINS_ENV})')


def Pins():
  """The wheel sources' WheelPins: $LINGSHARD_WHEEL_PINS's, else BUILTIN."""
  return tuple(p._replace(name=lm_sources.CanonicalName(p.name))
               for p in wheels.Pins(BUILTIN))


def AllPins():
  """lm_sources.PINS, then the wheel sources (SourceError: a name twice)."""
  seen = {p.name: 'lingshard/data/lm_sources.py PINS'
          for p in lm_sources.PINS}
  pins = Pins()
  for pin in pins:
    if pin.name in seen:
      raise lm_sources.SourceError(
          f'two pinned sources are named {pin.name} ({seen[pin.name]} and '
          f'the wheel {pin.filename}); read a package once: leave one of '
          'them out')
    seen[pin.name] = f'the wheel {pin.filename}'
  return tuple(lm_sources.PINS) + pins


def Select(spec):
  """The pins named by a --sources value, in AllPins order."""
  return lm_sources.Select(spec, AllPins())


def _Agrees(found, pinned):
  return found == pinned or (found in _FAMILIES and
                             pinned.startswith(found + '-'))


def WheelSource(pin, path):
  """The lm_sources.Source of a verified wheel file (its sha256 checked).

  Raises:
    lm_sources.SourceError: its licence is not permissive or differs.
    corpus_io.CorpusError: the file is not a readable wheel.
  """
  where = f'pinned wheel {pin.filename}'
  if not lm_sources.IsPermissive(pin.licence):
    raise lm_sources.SourceError(
        f'{where}: licence {pin.licence!r} is not one of the permissive '
        f'licences {", ".join(sorted(lm_sources.PERMISSIVE))}')
  _, _, _, licence_files = po_extract.WheelMetadata(path)
  modules = []
  with po_extract.OpenWheel(path) as zf:
    names = sorted(zf.namelist())
    meta = [n for n in names if n.count('/') == 1 and
            n.endswith('.dist-info/METADATA')]
    metadata = email.message_from_bytes(
        po_extract.ReadMember(zf, path, meta[0]) if meta else b'')
    for name in filter(lm_sources.IsPackageModule, names):
      init = os.path.basename(name) == '__init__.py'
      head = po_extract.ReadMember(zf, path, name)[:1000] if init else b''
      if not lm_sources.IsGenerated(name, head):
        modules.append((name, name))  # (path, zip member)
  found = lm_sources.MetadataLicence(metadata)
  if not _Agrees(found, pin.licence):
    raise lm_sources.SourceError(
        f'{where}: its METADATA licence {found!r} does not match the pinned '
        f'{pin.licence!r}; {_PIN_HINT}')
  return lm_sources.Source(pin, tuple(modules), tuple(licence_files), path)


def Resolve(pins, cache_dir=None, allow_download=True, site_packages=None,
            stdlib_root=None):
  """Verified lm_sources.Sources of pins (SourcePins, WheelPins), in order.

  The installed ones are checked first (lm_sources.Resolve), then the
  wheels are fetched into cache_dir (default wheels.DefaultCacheDir();
  pip downloads missing ones unless not allow_download) and checked.

  Raises:
    lm_sources.SourceError, wheels.WheelError, corpus_io.CorpusError: the
      first source that is missing or differs from its pin (one line).
  """
  wheel_pins = [p for p in pins if isinstance(p, wheels.WheelPin)]
  installed = [p for p in pins if not isinstance(p, wheels.WheelPin)]
  out = dict(zip(installed, lm_sources.Resolve(installed, site_packages,
                                               stdlib_root)))
  if wheel_pins:
    paths = wheels.EnsureWheels(cache_dir or wheels.DefaultCacheDir(),
                                wheel_pins, allow_download)
    out.update((p, WheelSource(p, path)) for p, path in zip(wheel_pins, paths))
  return tuple(out[p] for p in pins)
