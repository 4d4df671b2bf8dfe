"""Applying `--params_file` and `--params_override` to model params.

An override string is `key=value` assignments separated by `;` outside
quotes (`task.train.learning_rate=0.1;input.file='a;b'`). Each assignment is
applied with `Params.FromText`, so values follow its rules (the type of the
current value, literals only, no eval).
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
                        f'{text!r}')
  pieces.append(''.join(current))
  return [p.strip() for p in pieces if p.strip()]


def _Apply(params, line, what):
  try:
    params.FromText(line)
  except hyperparams.ParamsTextError as e:
    msg = str(e)
    prefix = f'line 1: {line!r}: '
    if msg.startswith(prefix):
      msg = msg[len(prefix):]
    raise OverrideError(f'{what} {line!r}: {msg}') from None


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
  for line in SplitOverrides(text, flag):
    if '=' not in line:
      raise OverrideError(f'{flag} {line!r}: expected key=value')
    _Apply(params, line, flag)
  return params
