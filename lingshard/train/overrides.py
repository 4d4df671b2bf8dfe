"""Applying `--params_file` and `--params_override` to model params.

An override string is `key=value` assignments separated by `;` outside
quotes (`task.train.learning_rate=0.1;input.file='a;b'`). Each assignment is
applied with `Params.FromText`, so values follow its rules (the type of the
current value, literals only, no eval, no imports). An assignment may not
start with `#` (FromText would skip it as a comment), hold a line break, or
set a key an earlier assignment of the same flag set.
"""

from lingshard import hyperparams


class OverrideError(ValueError):
  """A bad `--params_override` assignment or `--params_file`."""


def SplitOverrides(text, flag='--params_override'):
  """Splits on `;` outside single or double quotes; drops empty pieces."""
  pieces, current, quote, escaped = [], [], None, False
  for ch in text or '':
    if escaped:
      escaped = False
    elif ch == '\\' and quote:
      escaped = True
    elif quote:
      if ch == quote:
        quote = None
    elif ch in ('"', "'"):
      quote = ch
    elif ch == ';':
      pieces.append(''.join(current))
      current = []
      continue
    current.append(ch)
  if quote:
    raise OverrideError(f'{flag} has an unterminated {quote} quote: '
                        f'{hyperparams.Quote(text)}')
  pieces.append(''.join(current))
  return [p.strip() for p in pieces if p.strip()]


def _Apply(params, line, what):
  try:
    params.FromText(line)
  except hyperparams.ParamsTextError as e:
    raise OverrideError(f'{what} {hyperparams.Quote(line)}: '
                        f'{e.detail}') from None


def ApplyParamsFile(params, path, read_fn=None):
  """Applies a `key : value` text file (e.g. a run's params.txt)."""
  if read_fn is None:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  else:
    text = read_fn(path)
  try:
    params.FromText(text)
  except hyperparams.ParamsTextError as e:
    raise OverrideError(f'--params_file {path}: {e}') from None
  return params


def ApplyOverrides(params, text, flag='--params_override'):
  """Applies each `key=value` of an override string, in order."""
  seen = {}  # key -> the assignment that set it.
  for line in SplitOverrides(text, flag):
    quoted = hyperparams.Quote(line)
    if line.startswith('#'):
      raise OverrideError(f"{flag} {quoted}: starts with '#', which would "
                          "make it a comment; remove the '#' or the "
                          'assignment')
    if len(line.splitlines()) > 1:
      raise OverrideError(f'{flag} {quoted}: holds a line break; separate '
                          "assignments with ';'")
    if '=' not in line:
      raise OverrideError(f'{flag} {quoted}: expected key=value')
    try:
      key, _ = hyperparams.SplitLine(line)
    except hyperparams.ParamsTextError as e:
      raise OverrideError(f'{flag} {quoted}: {e.detail}') from None
    if key in seen:
      raise OverrideError(f'{flag} {quoted}: {hyperparams.Quote(key)} is '
                          f'already set by {hyperparams.Quote(seen[key])}; '
                          'keep one of the two')
    seen[key] = line
    _Apply(params, line, flag)
  return params
