"""Extracts (xx -> en) translation pairs from gettext catalogs in a wheel.

A wheel is a zip file; catalogs live at `.../locale/<lang>/LC_MESSAGES/
<domain>.po` (or `.../translations/...`). They are parsed with `polib`
from the member's bytes (never from a local file, the frameworks are never
imported). The catalog's `msgid` is the English source string; its
`msgstr` is the human translation, which becomes our *source* side (we
translate into English).

With `read_mo`, a compiled catalog (`<domain>.mo`) that has no `.po`
beside it is read too (some wheels ship only those). msgfmt leaves fuzzy
and untranslated entries out of a `.mo`, so what remains is what the
translators finished; a `.po` beside it is always the one read.

A wheel that is missing or not a zip, a member that cannot be read,
decoded or parsed (.po or .mo), a catalog language or package name that
is not a safe file name (corpus_io.IsSafeName) raise corpus_io.CorpusError
naming the wheel file and member.
"""

import collections
import os
import re
import struct
import zipfile
import zlib

import polib

from lingshard.data import corpus_io
from lingshard.data import lang_codes
from lingshard.data import pair_filters
from lingshard.data import plural_forms

Pair = collections.namedtuple('Pair', ['lang', 'source', 'target'])
Pair.__doc__ = """One example: language code, translated string, English string."""

_CATALOG_RE = re.compile(
    r'(?:^|/)(?:locale|translations)/([^/]+)/LC_MESSAGES/([^/]+)\.(po|mo)$')
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


def OpenWheel(path):
  """Opens a wheel (zip) file for reading.

  Raises:
    corpus_io.CorpusError: the file is missing or not a zip file.
  """
  if not os.path.isfile(path):
    raise corpus_io.CorpusError(
        f'wheel file not found: {path}; pass existing .whl files to --wheels')
  try:
    return zipfile.ZipFile(path)
  except (zipfile.BadZipFile, OSError) as e:
    raise corpus_io.CorpusError(
        f'{path}: not a wheel (zip) file ({e}); pass .whl files to --wheels'
    ) from None


def ReadMember(zf, path, member):
  """The bytes of one zip member.

  Raises:
    corpus_io.CorpusError: the member is corrupt, encrypted or compressed
      with a method zipfile cannot read.
  """
  try:
    return zf.read(member)
  except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError,
          OSError, zlib.error) as e:
    raise corpus_io.CorpusError(
        f'{path}:{member}: cannot read the member ({e}); the wheel is '
        f'damaged, download it again') from None


def CatalogMembers(zf, read_mo=False):
  """Sorted [(member name, lang, domain)] of the catalogs in a zip: the .po
  files and, if `read_mo`, each .mo file that has no .po beside it."""
  names = set(zf.namelist())
  out = []
  for name in names:
    m = _CATALOG_RE.search(name)
    if m and (m.group(3) == 'po' or
              (read_mo and name[:-len('mo')] + 'po' not in names)):
      out.append((name, m.group(1), m.group(2)))
  return sorted(out)


def _Charset(data):
  """The charset a catalog's header names ('utf-8' if none)."""
  m = _CHARSET_RE.search(data)
  charset = m.group(1).decode('ascii') if m else 'utf-8'
  if charset.upper() == 'CHARSET':  # The unfilled template placeholder.
    charset = 'utf-8'
  return charset


def _Decode(data, member):
  charset = _Charset(data)
  try:
    return data.decode(charset)
  except (LookupError, UnicodeDecodeError) as e:
    raise corpus_io.CorpusError(
        f'{member}: cannot decode as {charset}: {e}') from None


class _CatalogText:
  """A catalog's text as polib.pofile input that can never name a file.

  polib.pofile opens its argument when os.path.isfile says it is a file and
  otherwise parses `argument.splitlines()`; isfile raises TypeError for a
  non-str, which polib reads as 'not a file'. So a member whose content is
  the path of a local file is parsed as text, never read from disk.
  """

  def __init__(self, text):
    self._text = text

  def splitlines(self):
    return self._text.splitlines()


def ParseCatalog(text, where='catalog'):
  """polib.POFile of a catalog's text (never read from a file).

  Raises:
    corpus_io.CorpusError: the text is not a valid .po catalog; the message
      names `where` (e.g. 'wheel:member').
  """
  try:
    # An explicit encoding: polib would otherwise sniff it from a file.
    return polib.pofile(_CatalogText(text), encoding='utf-8')
  except (OSError, ValueError) as e:
    raise corpus_io.CorpusError(
        f'{where}: not a valid .po catalog: {e}') from None


def ParseMoCatalog(data, where='catalog'):
  """polib.MOFile of a compiled catalog's bytes (never read from a file).

  Decoded with the charset its header names (UTF-8 without one).

  Raises:
    corpus_io.CorpusError: the bytes are not a valid .mo catalog or do not
      decode; the message names `where`.
  """
  # polib.mofile opens its argument when os.path.isfile says it names a file
  # (str, bytes or any buffer). A name never holds a NUL byte and the header
  # of every .mo does (its version field), so what is passed on is parsed.
  if b'\0' not in data[:8]:
    raise corpus_io.CorpusError(
        f'{where}: not a valid .mo catalog: no .mo header')
  try:
    return polib.mofile(bytes(data), encoding=_Charset(data))
  except (OSError, ValueError, LookupError, struct.error) as e:
    raise corpus_io.CorpusError(
        f'{where}: not a valid .mo catalog: {e}') from None


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


def ExtractCatalog(text, lang, max_chars, counts, where='catalog'):
  """Extracts cleaned pairs from one catalog's text.

  Args:
    text: the .po file content.
    lang: the catalog's language code (kept as the directory names it).
    max_chars: the length cap of pair_filters.CheckPair.
    counts: a collections.Counter updated with the number of pairs kept
      ('kept') and dropped per reason.
    where: names the catalog in errors (e.g. 'wheel:member').

  Returns:
    list of Pair, in catalog order (duplicates not removed).

  Raises:
    corpus_io.CorpusError: the text is not a valid .po catalog.
  """
  return ExtractEntries(ParseCatalog(text, where), lang, max_chars, counts)


def ExtractEntries(catalog, lang, max_chars, counts):
  """ExtractCatalog's pairs of a parsed catalog (polib POFile or MOFile)."""
  try:
    roles = plural_forms.FormRoles(catalog.metadata.get('Plural-Forms'))
  except plural_forms.PluralFormsError:
    # A bad (or too deeply nested) header: only plural entries need it;
    # they are counted as DROP_PLURAL_UNPARSED, singular ones still count.
    roles = None
  pairs = []
  for entry in catalog:
    if entry.obsolete:
      counts[DROP_OBSOLETE] += 1
      continue
    if getattr(entry, 'fuzzy', False):  # A .mo entry has no flags.
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


def ExtractWheel(path, max_chars, counts, read_mo=False,
                 canonical_langs=False):
  """Extracts pairs from every non-English catalog in a wheel (zip) file.

  Args:
    path: path of the wheel or any zip laid out like one.
    max_chars: the length cap of pair_filters.CheckPair.
    counts: collections.Counter of kept / dropped pairs, updated in place;
      also counts 'catalogs' read (and of those 'mo_catalogs').
    read_mo: also read the .mo catalogs that have no .po (module doc).
    canonical_langs: name each pair's language by
      lang_codes.CanonicalLang of its catalog directory (else as named).

  Returns:
    list of Pair in (member name, catalog) order.

  Raises:
    corpus_io.CorpusError: see the module doc.
  """
  pairs = []
  with OpenWheel(path) as zf:
    for member, lang, _ in CatalogMembers(zf, read_mo):
      where = f'{path}:{member}'
      if not corpus_io.IsSafeName(lang):
        raise corpus_io.CorpusError(
            f'{where}: bad language code {lang!r} in the catalog path: use '
            f'{corpus_io.SAFE_NAME_RULE}')
      if IsEnglishLocale(lang):
        counts[DROP_ENGLISH_LOCALE] += 1
        continue
      counts['catalogs'] += 1
      if canonical_langs:
        lang = lang_codes.CanonicalLang(lang)
      data = ReadMember(zf, path, member)
      if member.endswith('.mo'):
        counts['mo_catalogs'] += 1
        catalog = ParseMoCatalog(data, where)
      else:
        catalog = ParseCatalog(_Decode(data, where), where)
      pairs.extend(ExtractEntries(catalog, lang, max_chars, counts))
  return pairs


def WheelMetadata(path):
  """Returns (name, version, licence, [(licence file name, bytes)]).

  Read from the wheel's .dist-info so the output can carry attribution.
  The name (a prefix of output file names) is '' without METADATA.

  Raises:
    corpus_io.CorpusError: see the module doc; also a METADATA that is not
      UTF-8.
  """
  with OpenWheel(path) as zf:
    names = sorted(zf.namelist())
    meta_names = [n for n in names if n.endswith('.dist-info/METADATA')]
    fields = {}
    if meta_names:
      where = f'{path}:{meta_names[0]}'
      try:
        text = ReadMember(zf, path, meta_names[0]).decode('utf-8')
      except UnicodeDecodeError as e:
        raise corpus_io.CorpusError(f'{where}: not UTF-8: {e}') from None
      for line in text.split('\n\n', 1)[0].splitlines():
        key, sep, value = line.partition(': ')
        if sep and key not in fields:
          fields[key] = value.strip()
      if 'Name' in fields and not corpus_io.IsSafeName(fields['Name']):
        raise corpus_io.CorpusError(
            f'{where}: bad package Name {fields["Name"]!r}: use '
            f'{corpus_io.SAFE_NAME_RULE}')
    licence = fields.get('License-Expression') or fields.get('License', '')
    files = [(n.rsplit('/', 1)[-1], ReadMember(zf, path, n)) for n in names
             if '.dist-info/' in n and
             re.search(r'/(licenses/)?(LICEN[CS]E|COPYING|AUTHORS)[^/]*$', n)]
  return fields.get('Name', ''), fields.get('Version', ''), licence, files
