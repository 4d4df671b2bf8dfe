"""Per-pair cleaning rules for UI-string translation pairs.

UI catalogs carry format placeholders (`%(name)s`, `%s`, `{name}`), HTML
and untranslated copies. Placeholders are kept verbatim (a model must learn
to copy them) but a pair is only usable if both sides carry the same
multiset of placeholders; otherwise the translation is wrong or refers to
different data. Pairs with placeholders or HTML are flagged so that every
score can also be reported on the placeholder-free ("noph") subset, where
copying the source earns little.
"""

import re
import unicodedata

# printf-style: %(name)s, %s, %d, %.2f, %-5s. The space flag is left out on
# purpose: "100% of" would otherwise read as the placeholder '% o'. `%%` is
# a literal percent sign and is matched first so it is never a placeholder.
_PRINTF_RE = re.compile(
    r'%%|%(?:\([^()\s]+\))?[-#0+]*(?:\d+|\*)?(?:\.\d+)?[sdifeEgGxXorcu]')
# str.format / JS-style: {name}, {0}, {}, {obj.attr}, {0:>3}. `{{` and `}}`
# are escaped braces, matched first so they are never placeholders.
_BRACE_RE = re.compile(r'\{\{|\}\}|\{[A-Za-z0-9_.\[\]]*(?:![rsa])?(?::[^{}]*)?\}')
_HTML_RE = re.compile(r'</?[A-Za-z][^<>]*>|&(?:[A-Za-z]+|#\d+|#x[0-9a-fA-F]+);')
_SPACE_RE = re.compile(r'\s+')


def Normalize(text):
  """NFC-normalizes and collapses all whitespace runs to one space.

  TSV cannot hold tabs or newlines, and line breaks inside UI strings carry
  no meaning for translation.
  """
  return _SPACE_RE.sub(' ', unicodedata.normalize('NFC', text)).strip()


def Placeholders(text):
  """Sorted list of the format placeholders in `text` (a multiset)."""
  found = [m.group(0) for m in _PRINTF_RE.finditer(text)]
  found += [m.group(0) for m in _BRACE_RE.finditer(text)]
  return sorted(p for p in found if p not in ('%%', '{{', '}}'))


def HasHtml(text):
  """True if `text` contains an HTML tag or character entity."""
  return _HTML_RE.search(text) is not None


def PlaceholdersMatch(source, target):
  """True if both sides hold the same multiset of placeholders."""
  return Placeholders(source) == Placeholders(target)


def IsIdentical(source, target):
  """True if the 'translation' is the English string itself.

  Compared case-insensitively: these are untranslated copies or names
  (e.g. 'URL', 'Django') and would only teach the model to copy.
  """
  return source.casefold() == target.casefold()


def IsPlain(source, target):
  """True if neither side has placeholders or HTML (the 'noph' subset)."""
  return not (Placeholders(source) or Placeholders(target) or
              HasHtml(source) or HasHtml(target))


# Reasons a pair is dropped, in the order the rules are checked. The order
# matters only for the statistics (each dropped pair counts once).
DROP_EMPTY = 'empty'
DROP_TOO_LONG = 'too_long'
DROP_IDENTICAL = 'identical'
DROP_PLACEHOLDER_MISMATCH = 'placeholder_mismatch'


def CheckPair(source, target, max_chars):
  """Returns None if the (normalized) pair is kept, else the drop reason.

  Args:
    source: the translated (non-English) string, already normalized.
    target: the English string, already normalized.
    max_chars: drop pairs where either side is longer than this.
  """
  if not source or not target:
    return DROP_EMPTY
  if len(source) > max_chars or len(target) > max_chars:
    return DROP_TOO_LONG
  if IsIdentical(source, target):
    return DROP_IDENTICAL
  if not PlaceholdersMatch(source, target):
    return DROP_PLACEHOLDER_MISMATCH
  return None
