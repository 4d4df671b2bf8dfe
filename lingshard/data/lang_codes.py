"""One language code per language, across catalogs that spell it apart.

Catalog directories name a language in several ways: `fr` and `fr_FR`,
`zh_CN`, `zh_Hans`, `zh-Hans` and `zh_Hans_CN`, `sr@latin` and `sr_Latn`,
`no` and `nb_NO`. The large corpus (prepare --corpus=large) maps every
code with CanonicalLang so that one language is one code (and one `<2xx>`
tag); the default corpus keeps the directory names as they are.

The rules, in order:

* `-` separates like `_`; the language is lower case, a script (4
  letters) title case, a region (2 letters or 3 digits) upper case.
* retired or macrolanguage codes become the one the catalogs mean
  (`no` -> `nb`, `iw` -> `he`, `in` -> `id`).
* `@latin` / `@cyrillic` become the script (`sr@latin` -> `sr_Latn`);
  other variants stay (`ca@valencia`).
* Chinese names its script, not a region: `zh_CN` / `zh_SG` -> `zh_Hans`,
  `zh_TW` -> `zh_Hant`, and a region implied by the script goes
  (`zh_Hans_CN` -> `zh_Hans`); `zh_HK` and a bare `zh` stay.
* a region that only restates the language's home goes: the region
  spelled like the language (`fr_FR`, `pt_PT`, `tr_TR`) or the one in
  HOME_REGION (`ja_JP`, `uk_UA`, `nb_NO`). Real variants stay: `pt_BR`,
  `es_AR`, `es_419`, `de_CH`, `ar_DZ`, `bn_IN`.

A code that does not parse this way is returned unchanged.
"""

import re

ALIASES = {'no': 'nb', 'iw': 'he', 'in': 'id', 'ji': 'yi'}
VARIANT_SCRIPTS = {'latin': 'Latn', 'cyrillic': 'Cyrl'}
ZH_REGION_SCRIPT = {'CN': 'Hans', 'SG': 'Hans', 'TW': 'Hant'}
# The language's home region where it is not the language code in upper
# case (those go by rule): the region a catalog names when it means the
# language as a whole (JupyterLab's ar_SA is its translators' `ar`).
HOME_REGION = {
    'ar': 'SA', 'bn': 'BD', 'ca': 'ES', 'cs': 'CZ', 'da': 'DK', 'el': 'GR',
    'et': 'EE', 'eu': 'ES', 'fa': 'IR', 'gl': 'ES', 'he': 'IL', 'hi': 'IN',
    'hy': 'AM', 'ja': 'JP', 'ka': 'GE', 'kk': 'KZ', 'ko': 'KR', 'ms': 'MY',
    'nb': 'NO', 'ne': 'NP', 'nn': 'NO', 'pa': 'IN', 'sl': 'SI', 'sq': 'AL',
    'sr': 'RS', 'sv': 'SE', 'uk': 'UA', 'ur': 'PK', 'vi': 'VN'}

_LANG_RE = re.compile(r'[A-Za-z]{2,3}')
_SCRIPT_RE = re.compile(r'[A-Za-z]{4}')
_REGION_RE = re.compile(r'[A-Za-z]{2}|[0-9]{3}')


def _Parse(code):
  """(lang, script, region, variant) of a locale code, or None."""
  base, _, variant = code.partition('@')
  parts = base.replace('-', '_').split('_')
  if not _LANG_RE.fullmatch(parts[0]):
    return None
  lang, script, region = parts[0].lower(), '', ''
  rest = parts[1:]
  if rest and _SCRIPT_RE.fullmatch(rest[0]):
    script = rest.pop(0).title()
  if rest and _REGION_RE.fullmatch(rest[0]):
    region = rest.pop(0).upper()
  if rest:
    return None
  return lang, script, region, variant


def CanonicalLang(code):
  """The one code of the language `code` names (see the module doc)."""
  parsed = _Parse(code)
  if parsed is None:
    return code
  lang, script, region, variant = parsed
  lang = ALIASES.get(lang, lang)
  if variant in VARIANT_SCRIPTS and not script:
    script, variant = VARIANT_SCRIPTS[variant], ''
  if lang == 'zh' and region in ZH_REGION_SCRIPT:
    if not script:
      script = ZH_REGION_SCRIPT[region]
    if ZH_REGION_SCRIPT[region] == script:
      region = ''
  if region and (region == lang.upper() or HOME_REGION.get(lang) == region):
    region = ''
  out = '_'.join(p for p in (lang, script, region) if p)
  return f'{out}@{variant}' if variant else out
