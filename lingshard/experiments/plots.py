"""The evidence page's figures (matplotlib, Agg). Each function writes one
PNG and returns its path."""

import re

import numpy as np


def _Plt():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _Save(plt, fig, path):
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def Curves(path, arms, title, ylabel='dev log-perplexity'):
  """arms: {name: [curve]} with curve = [{'step', 'log_pplx'}] per seed;
  plots the mean over seeds with a ± sd band at the steps all share."""
  plt = _Plt()
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for name, curves in arms.items():
    curves = [c for c in curves if c]
    if not curves:
      continue
    steps = sorted(set.intersection(*[{p['step'] for p in c} for c in curves]))
    vals = np.array([[next(p['log_pplx'] for p in c if p['step'] == s)
                      for s in steps] for c in curves])
    mean = vals.mean(0)
    ax.plot(steps, mean, marker='o', ms=3, label=f'{name} (n={len(curves)})')
    if len(curves) > 1:
      sd = vals.std(0, ddof=1)
      ax.fill_between(steps, mean - sd, mean + sd, alpha=0.2)
  ax.set_xlabel('training steps')
  ax.set_ylabel(ylabel)
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return _Save(plt, fig, path)


def ResourceBars(path, deltas, thirds):
  """deltas: {(split, arm): [Δ chrF per third]}."""
  plt = _Plt()
  fig, ax = plt.subplots(figsize=(7, 4))
  keys = sorted(deltas)
  width = 0.8 / max(len(keys), 1)
  x = np.arange(len(thirds))
  for i, key in enumerate(keys):
    ax.bar(x + i * width, deltas[key], width, label=f'{key[1]} {key[0]}')
  ax.axhline(0, color='k', lw=0.8)
  ax.set_xticks(x + 0.4 - width / 2)
  ax.set_xticklabels([f'{t}-resource third' for t in thirds])
  ax.set_ylabel('Δ chrF vs TinyDense')
  ax.set_title('MoE minus dense by language resource (equal steps)',
               fontsize=10)
  ax.legend(fontsize=7, ncol=2)
  ax.grid(alpha=0.3, axis='y')
  return _Save(plt, fig, path)


def Bars(path, groups, series, title):
  """groups: bar-group labels; series: {label: [value per group]}."""
  plt = _Plt()
  fig, ax = plt.subplots(figsize=(7, 4))
  width = 0.8 / max(len(series), 1)
  x = np.arange(len(groups))
  for i, (label, vals) in enumerate(series.items()):
    ax.bar(x + i * width, vals, width, label=label)
  ax.set_xticks(x + 0.4 - width / 2)
  ax.set_xticklabels(groups, fontsize=8)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3, axis='y')
  return _Save(plt, fig, path)


def Capacity(path, points):
  """points: (name, cf, policy, dropped_first, dropped_second, log_pplx,
  step ratio)."""
  plt = _Plt()
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
  for policy, marker in (('all', 'o'), ('random', 's')):
    pts = [p for p in points if p[2] == policy]
    cf = [p[1] for p in pts]
    axes[0].plot(cf, [(p[3] or 0) for p in pts], marker=marker,
                 label=f'{policy}: dropped 1st')
    axes[0].plot(cf, [(p[4] or 0) for p in pts], marker=marker, ls='--',
                 label=f'{policy}: dropped 2nd')
    axes[1].plot([p[6] for p in pts], [p[5] for p in pts], marker=marker,
                 label=policy)
    for p in pts:
      axes[1].annotate(f'cf {p[1]:g}', (p[6], p[5]), fontsize=7)
  axes[0].set_xscale('log', base=2)
  axes[0].set_xlabel('capacity factor')
  axes[0].set_ylabel('dropped / wanted (train)')
  axes[0].legend(fontsize=7)
  axes[1].set_xlabel('step time / TinyDense (graph)')
  axes[1].set_ylabel('dev log-perplexity')
  axes[1].legend(fontsize=7)
  for ax in axes:
    ax.grid(alpha=0.3)
  return _Save(plt, fig, path)


# bench_moe.py table rows: E, C, mode, variant, ms, tokens/s, ratio, ...
_MOE_ROW = re.compile(r'^\s*(\d+)\s+\d+\s+(graph|jit)\s+(\S+)\s+[\d.]+\s+'
                      r'\d+\s+([\d.]+)\s')


def MoeRatios(path, output):
  """MoE/dense time ratio vs E per mode and dispatch, from bench_moe's
  printed table."""
  series = {}
  for line in output.splitlines():
    m = _MOE_ROW.match(line)
    if m:
      e, mode, impl, ratio = int(m.group(1)), m.group(2), m.group(3), float(
          m.group(4))
      if impl == 'dense':
        continue
      series.setdefault(f'{mode} {impl}', []).append((e, ratio))
  plt = _Plt()
  fig, ax = plt.subplots(figsize=(6, 4))
  for label, pts in sorted(series.items()):
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', label=label)
  ax.axhline(1.0, color='k', lw=0.8)
  ax.set_xscale('log', base=2)
  ax.set_xlabel('experts E')
  ax.set_ylabel('time / FLOP-matched dense FFN')
  ax.set_title('MoE layer fwd+bwd (bench_moe.py)', fontsize=10)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  return _Save(plt, fig, path)
