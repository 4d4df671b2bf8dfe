"""What the regime experiment's extra expert weights hold (issue 31): the
fit to the training data, and per-expert specialisation (Shazeer et al.
App. E, Table 9: experts "highly specialized by syntax and/or
semantics").

Training fit: every regime run's training-mode log-perplexity (the
trainer's `log_pplx` summaries, unsmoothed, on its own training batches)
averaged over the last quarter of the step budget, beside its dev
log-perplexity at the budget: extra parameters that fit the training data
better without a lower dev value are memorising, not generalising.

Specialisation: for every MoE run of `regime` (its final checkpoint in
--work_dir), `python -m lingshard.tools.expert_usage` restores the weights
with the run's own flags and counts, over the run's dev subset, which
expert each real token's first choice goes to, by language (MT) and by
token. The page gives per layer the mutual information I(expert;
language) and I(expert; token) in bits beside what independence gives by
chance, and seed 1's per-expert table (top languages and tokens by lift).
"""

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys

from lingshard.experiments import page_parts as pp
from lingshard.experiments import runs as runs_lib
from lingshard.tools import expert_usage

FLAGS = ('--model', '--params_override', '--eval_params_override', '--seed')


def UsageCommand(train_command, logdir, json_path, python=sys.executable):
  """The expert_usage argv for a run: its trainer command's model, params
  overrides and seed (the shell line the Runner recorded), its logdir."""
  given = {}
  for arg in shlex.split(train_command):
    flag, eq, value = arg.partition('=')
    if eq and flag in FLAGS:
      given[flag] = value
  missing = [f for f in ('--model', '--seed') if f not in given]
  if missing:
    raise ValueError(f'no {missing[0]} in the run command {train_command}')
  return [python, '-m', 'lingshard.tools.expert_usage',
          f'--logdir={logdir}', f'--json={json_path}'] + [
              f'{f}={given[f]}' for f in FLAGS if f in given]


def Summary(usage):
  """{layer: the page's figures} of an expert_usage JSON: tokens, dropped
  choices, per-expert shares of first choices and the mutual information
  (bits, chance) of the expert with the language and with the token."""
  out = {}
  for name, layer in usage['layers'].items():
    counts = layer['first'] or layer['all']
    total = max(sum(counts['expert']), 1)
    info = {}
    for key in ('lang', 'token'):
      if len(counts[key]) > 1:
        mi, chance, h = expert_usage.MutualInformation(counts[key])
        info[key] = dict(mi=mi, chance=chance, entropy=h)
    out[name] = dict(gate=layer['gate'], num_experts=layer['num_experts'],
                     k=layer['choices_per_token'],
                     real_tokens=layer['real_tokens'],
                     dropped_choices=layer['dropped_choices'],
                     shares=[c / total for c in counts['expert']], **info)
  return out


def TrainFit(train_dir, steps):
  """Mean training log-pplx over the summaries after 3/4 of `steps`."""
  vals = [v for s, v in runs_lib.Events(train_dir).get('log_pplx', [])
          if 0.75 * steps < s <= steps]
  return sum(vals) / len(vals) if vals else None


def Experts(ctx):
  """Runs expert_usage on each regime MoE run; returns the result."""
  regime_res = pp.Load(os.path.join(ctx.out_dir, 'results'), 'regime')
  mode = ctx.mode
  if regime_res is None or regime_res.get('mode') != mode:
    raise SystemExit('lingshard.experiments: experts reads the regime '
                     f'experiment\'s {mode} runs: run --only regime first')
  jobs = {}
  for name, run in sorted(regime_res['runs'].items()):
    if '_moe_' not in name:
      continue
    logdir = os.path.join(ctx.work_dir, name)
    if not os.path.exists(os.path.join(logdir, 'train', 'checkpoint')):
      raise SystemExit(f'lingshard.experiments: experts: no checkpoint in '
                       f'{logdir}: run --only regime with this --work_dir')
    json_path = os.path.join(ctx.work_dir, f'expert_usage_{name}.json')
    jobs[name] = (UsageCommand(run['commands'][0], logdir, json_path),
                  json_path)

  def Execute(name):
    argv, json_path = jobs[name]
    proc = subprocess.run(argv, capture_output=True, text=True,
                          env=runs_lib.RunEnv(), check=False)
    if proc.returncode:
      raise RuntimeError(f'exit {proc.returncode}: {" ".join(argv)}\n'
                         f'{proc.stderr[-2000:]}')
    with open(json_path, encoding='utf-8') as f:
      usage = json.load(f)
    table = expert_usage.FormatTable(usage)
    return dict(command=runs_lib.Shown(argv), step=usage['step'],
                examples=usage['examples'], layers=Summary(usage),
                table=table)

  fit = {name: TrainFit(os.path.join(ctx.work_dir, name, 'train'),
                        regime_res['steps'])
         for name in sorted(regime_res['runs'])}
  with concurrent.futures.ThreadPoolExecutor(ctx.runner.workers) as pool:
    results = dict(zip(jobs, pool.map(Execute, jobs)))
  return dict(regime_revision=regime_res['revision'],
              steps=regime_res['steps'], train_log_pplx=fit,
              dev_log_pplx={name: pp.CurveAt(run, regime_res['steps'])
                            for name, run in regime_res['runs'].items()},
              usage=results)



# ------------------------------------------------------------------ page
TASK_NAMES = dict(mt='translation', lm='language model')


def _Bits(values):
  return pp.Fmt(values, 3)


def _FitLines(res):
  """The training-fit table and its verdicts."""
  steps, fit, dev = res['steps'], res['train_log_pplx'], res['dev_log_pplx']
  lines = ['**Training fit.** Training-mode log-perplexity on the runs\' '
           f'own batches, mean over steps {0.75 * steps:,.0f}–{steps:,} '
           '(dropout and routing noise on), against dev log-perplexity at '
           f'{steps:,} steps (mean ± sd over seeds):', '']
  rows, verdicts = [], []
  for task in ('mt', 'lm'):
    vals = {}
    for arm in ('dense', 'moe'):
      names = sorted(n for n in fit if n.startswith(f'regime_{task}_{arm}_s'))
      if not names:
        continue
      vals[arm] = [fit[n] for n in names]
      gap = [dev[n] - fit[n] for n in names if None not in (dev[n], fit[n])]
      rows.append([TASK_NAMES[task], arm, pp.Fmt(vals[arm], 3),
                   pp.Fmt([dev[n] for n in names], 3), pp.Fmt(gap, 3)])
    if len(vals) == 2:
      verdicts.append(f'- {TASK_NAMES[task]}: ' + pp.Verdict(
          vals['moe'], vals['dense'], False, 'MoE', 'dense',
          'training log-pplx'))
  return lines + pp.Table(['task', 'arm', 'training log-pplx',
                           f'dev log-pplx @ {steps:,}', 'dev − training'],
                          rows) + verdicts + ['']


def Section(res, res_dir):  # pylint: disable=unused-argument
  """The page's section: (markdown lines, PNG paths)."""
  usage = res['usage']
  lines = ['## 9. What the expert weights hold: training fit and per-expert '
           'specialisation (issue 31; Shazeer App. E)', ''] + pp.Header(res)
  lines += _FitLines(res)
  lines += [
      '**Specialisation.** Each MoE run of section 8 (revision '
      f'`{res["regime_revision"][:7]}`), its final checkpoint restored by '
      '`python -m lingshard.tools.expert_usage` with the run\'s flags, over '
      'its dev subset: every real token\'s first choice counted by the '
      'example\'s language (MT: the source language; the decoder\'s tokens '
      'under their pair\'s) and by token id (inference routing: no noise, '
      'nothing dropped). I(expert; x) is the plug-in mutual information in '
      'bits; *chance* is its value under independence, (R−1)(C−1) / (2N '
      'ln 2); H(x) bounds it. Mean ± sd over seeds.', '']
  rows = []
  for task in ('mt', 'lm'):
    names = sorted(n for n in usage if n.startswith(f'regime_{task}_'))
    if not names:
      continue
    for layer in sorted(usage[names[0]]['layers'],
                        key=lambda n: (n.startswith('dec'), n)):
      per = [usage[n]['layers'][layer] for n in names]
      cells = []
      for key in ('lang', 'token'):
        if key not in per[0]:
          cells.append('—')
          continue
        cells.append(f'{_Bits([p[key]["mi"] for p in per])} (chance '
                     f'{_Bits([p[key]["chance"] for p in per])}; H '
                     f'{pp.MeanSd([p[key]["entropy"] for p in per])[0]:.2f})')
      top = pp.MeanSd([max(p['shares']) for p in per])[0]
      first = per[0]
      rows.append([TASK_NAMES[task], f'`{layer}`',
                   f'{first["num_experts"]}' + (f', top-{first["k"]}'
                                                if first['k'] else ''),
                   f'{pp.MeanSd([p["real_tokens"] for p in per])[0]:,.0f}',
                   *cells, f'{top:.1%}', len(per)])
  lines += pp.Table(['task', 'MoE layer', 'experts', 'real tokens',
                     'I(expert; language) bits', 'I(expert; token) bits',
                     'largest expert share', 'seeds'], rows)
  for task in ('mt', 'lm'):
    names = sorted(n for n in usage if n.startswith(f'regime_{task}_'))
    if names:
      lines += [f'<details><summary>Per-expert table of `{names[0]}` '
                '(shares of first and of all choices; top languages / tokens '
                'by lift P(x | expert) / P(x), with counts)</summary>', '',
                '```', usage[names[0]]['table'], '```', '', '</details>', '']
  lines += ['<details><summary>Commands</summary>', '', '```sh']
  lines += [usage[n]['command'] for n in sorted(usage)]
  return lines + ['```', '', '</details>', ''], []
