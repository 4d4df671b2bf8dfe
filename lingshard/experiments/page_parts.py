"""The evidence page's building blocks: loading results, the claim rule
(a difference is claimed only when it exceeds the seed spread: |mean_a -
mean_b| > sd_a + sd_b; with one seed on a side, that side borrows the other
side's sd; with one seed on both sides no claim is made), curve and score
look-ups, and markdown tables (lingshard/experiments/sections.py uses
them)."""

import json
import os

import numpy as np

SPLITS = ('dev_unseen_en', 'dev_seen_en')
THIRDS = ('high', 'mid', 'low')


def Load(res_dir, name):
  path = os.path.join(res_dir, f'{name}.json')
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def MeanSd(values):
  v = [x for x in values if x is not None]
  if not v:
    return None, None, 0
  return (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else None,
          len(v))


def Fmt(values, digits=2):
  m, sd, n = MeanSd(values)
  if m is None:
    return 'n/a'
  return f'{m:.{digits}f}' + (f' ± {sd:.{digits}f}' if sd is not None else '')


def Spread(a, b):
  """(mean_a, mean_b, seed spread) under the page's rule; spread None when
  a side is unmeasured or both have one seed."""
  (ma, sa, _), (mb, sb, _) = MeanSd(a), MeanSd(b)
  if ma is None or mb is None or (sa is None and sb is None):
    return ma, mb, None
  return ma, mb, (sa if sa is not None else sb) + (sb if sb is not None else sa)


def Claim(a, b, higher_better):
  """+1 when value list a is better than b beyond the seed spread, -1 when
  b is, 0 when the page makes no claim."""
  ma, mb, spread = Spread(a, b)
  if spread is None or abs(ma - mb) <= spread:
    return 0
  return 1 if (ma > mb) == higher_better else -1


def Verdict(a, b, higher_better, a_name, b_name, what):
  """One sentence comparing value lists a and b under the spread rule."""
  ma, mb, spread = Spread(a, b)
  if ma is None or mb is None:
    return f'{what}: not measured.'
  if spread is None:
    return (f'{what}: {a_name} {ma:.3f} vs {b_name} {mb:.3f} (one seed each: '
            f'no claim).')
  diff = ma - mb
  better = a_name if Claim(a, b, higher_better) > 0 else b_name
  if abs(diff) > spread:
    return (f'{what}: **{better} is better** ({a_name} {ma:.3f} vs {b_name} '
            f'{mb:.3f}; |Δ| {abs(diff):.3f} > seed spread {spread:.3f}).')
  return (f'{what}: no difference beyond the seed spread ({a_name} {ma:.3f} '
          f'vs {b_name} {mb:.3f}; |Δ| {abs(diff):.3f} ≤ {spread:.3f}).')


def CurveAt(run, step):
  for point in run['curve']:
    if point['step'] == step:
      return point.get('log_pplx')
  return None


def Score(run, split, step, key='chrf'):
  s = run['scores'].get(split, {}).get(str(step))
  return s['average'][key] if s else None


class PageError(ValueError):
  """The page cannot be rendered as recorded (one line)."""


def Thirds(data_dir):
  """{language: 'high' | 'mid' | 'low'} by training examples (stats.tsv).

  The corpus is read, not recorded: a missing one is an error, not a table
  of n/a (the page would no longer be what its runs measured)."""
  path = os.path.join(data_dir, 'stats.tsv')
  if not os.path.exists(path):
    raise PageError(f'{path} not found: the conditional section ranks '
                    'languages by the prepared corpus; prepare it with: '
                    f'python -m lingshard.data.prepare --out {data_dir} '
                    '(or pass --data_dir)')
  with open(path, encoding='utf-8') as f:
    rows = [line.rstrip('\n').split('\t') for line in f][1:]
  rows = sorted(((r[0], int(r[1])) for r in rows if len(r) > 1),
                key=lambda r: -r[1])
  n = len(rows)
  return {lang: THIRDS[min(2, 3 * i // max(n, 1))]
          for i, (lang, _) in enumerate(rows)}


def ThirdScore(run, split, step, thirds, third):
  s = run['scores'].get(split, {}).get(str(step))
  if not s:
    return None
  v = [x['chrf'] for lang, x in s['languages'].items()
       if thirds.get(lang) == third and x['n'] > 0]
  return float(np.mean(v)) if v else None


def Runs(result, prefix):
  return [r for name, r in sorted(result['runs'].items())
          if name.startswith(prefix + '_s')]


def BaseRuns(result):
  """The m4.TinyMoE reference runs of depth / balance."""
  return [result['runs'][n] for n in result['base']]


def Commands(result):
  lines = ['<details><summary>Commands (every run: config key, seed, '
           'overrides)</summary>', '', '```sh']
  for key in ('bench', 'spmd', 'moe'):
    if key in result and 'command' in result[key]:
      lines.append(result[key]['command'])
  if 'command' in result and 'runs' not in result:
    lines.append(result['command'])
  for name, run in sorted(result.get('runs', {}).items()):
    origin = run.get('reused_from')
    lines.append(f'# {name}' + (f' (reused from the {origin})'
                                if origin else ''))
    lines += run['commands']
  lines += ['```', '', '</details>', '']
  return lines


def Header(result):
  return [f'*Produced by `{result["command"]}` ({result["mode"]} mode) at '
          f'revision `{result["revision"]}` on {result["date"]} in '
          f'{result["seconds"] / 60:.1f} min.*', '']


def Cell(text):
  """A CSV cell for the page: integers with separators, other numbers to
  4 significant digits, text as is."""
  try:
    x = float(text)
  except ValueError:
    return text
  if x == int(x) and abs(x) < 1e15:
    return f'{int(x):,}'
  return f'{x:.4g}'


def CsvTable(csv):
  return Table(csv['header'], [[Cell(c) for c in r] for r in csv['rows']])


def Table(head, rows):
  out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  out += ['| ' + ' | '.join(str(c) for c in r) + ' |' for r in rows]
  return out + ['']
