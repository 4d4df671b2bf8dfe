"""Issue 31's experiment: does conditional computation pay on corpora the
Tiny models cannot repeat in the budget?

The page's first sections train on the default corpora, which a Tiny model
sees many times over in a long run; here both tasks use the larger pinned
corpora (`prepare --corpus=large`: 19,868 distinct English strings, 5x the
default; `lm_prepare --sources=large`: 3.2M training words, 12x), through
the configs registered for them:

  mt  m4.TinyDenseLarge vs m4.TinyMoELarge (same matmul FLOPs per token)
  lm  lm1b.TinyLSTMLarge vs lm1b.TinyMoELarge (same matmul FLOPs per word)

Each arm trains `regime_steps` steps for every seed. Equal wall-clock: the
time the dense arm takes for those steps, at each arm's step time measured
by scripts/bench_step.py on the task's own corpus (interleaved, the machine
to itself, TF graph mode as the runs train), so an arm slower than the
dense one is also read at its fewer equal-time steps (a stop of its run).
Dev log-perplexity (and greedy chrF on the two dev splits for MT) at both
budgets, under the page's claim rule. Dev sets: every `regime_dev_every`-th
row of the large corpora's dev splits (cheap evaluation; the same rows for
every arm).
"""

import json
import os

from lingshard.experiments import page_parts as pp
from lingshard.experiments import plots
from lingshard.experiments import runs as runs_lib
from lingshard.tools import count_params

TASKS = (('mt', (('dense', 'm4.TinyDenseLarge'), ('moe', 'm4.TinyMoELarge'))),
         ('lm', (('dense', 'lm1b.TinyLSTMLarge'), ('moe',
                                                   'lm1b.TinyMoELarge'))))
LM_DEV = 'dev.txt'
WallSteps = runs_lib.WallSteps


def LmDevSubset(lm_dir, work_dir, every):
  """Every `every`-th line of the LM corpus's dev split, in work_dir;
  returns its path."""
  os.makedirs(work_dir, exist_ok=True)
  return runs_lib.EveryNth(os.path.join(lm_dir, LM_DEV), os.path.join(
      work_dir, f'lm_dev_every_{every}.txt'), every)


def CorpusFacts(mt_dir, lm_dir):
  """What the page says of the two corpora, from their manifests: MT
  distinct English strings, pairs and languages (in all and per split);
  LM words per split and the vocabulary size."""
  with open(os.path.join(mt_dir, 'manifest.json'), encoding='utf-8') as f:
    mt = json.load(f)
  with open(os.path.join(lm_dir, 'manifest.json'), encoding='utf-8') as f:
    lm = json.load(f)
  return dict(
      mt=dict(english_strings=mt['english_strings'],
              unique_pairs=mt['unique_pairs'], languages=mt['languages'],
              splits={k: dict(pairs=v['pairs'],
                              english_strings=v['english_strings'])
                      for k, v in mt['splits'].items()}),
      lm=dict(words={k: v['words'] for k, v in lm['splits'].items()},
              vocab_size=lm['vocab_size']))


def _StoredBenches(ctx, steps, mt_dir, lm_dir):
  """{task: {mode: bench}} of the recorded regime result when it measured
  this configuration (mode, step budget, corpora), else {}: a rerun keeps
  the step budgets its runs were trained to, so they are reused, not
  retrained (delete docs/results/regime.json to measure afresh)."""
  res = pp.Load(os.path.join(ctx.out_dir, 'results'), 'regime')
  if not res or (res.get('mode'), res.get('steps'), res.get('mt_dir'),
                 res.get('lm_dir')) != (ctx.mode, steps, mt_dir, lm_dir):
    return {}
  return {task: {mode: t[key] for mode, key in (('graph', 'bench'),
                                                ('jit', 'bench_jit'))
                 if key in t}
          for task, t in res['tasks'].items()}


def Regime(ctx):
  """Benchmarks each task's arms, then trains seeds x arms on the large
  corpora; returns the experiment's result.

  The step benchmark's mode (`regime_bench_mode`, graph: as the runs
  train) sets the equal wall-clock budgets; the XLA-compiled step (jit, as
  the demo and section 1) is measured too, and the page also reads the
  runs at its equal wall-clock budget (the last evaluation within it)."""
  cfg = ctx.cfg
  steps, every = cfg['regime_steps'], cfg['regime_dev_every']
  mt_dir = cfg['regime_mt_dir'] or ctx.data_dir
  lm_dir = cfg['regime_lm_dir'] or ctx.runner.lm_data_dir
  for path in (os.path.join(mt_dir, 'train.tsv'),
               os.path.join(lm_dir, 'train.txt')):
    if not os.path.exists(path):
      raise SystemExit(
          f'lingshard.experiments: regime: {path} is missing; build the '
          'large corpora first: python -m lingshard.data.prepare '
          '--corpus=large --out data/ui_m4_large; python -m '
          'lingshard.data.lm_prepare --sources=large --out data/lm_en_large')
  work_dir = os.path.join(ctx.work_dir, 'regime')
  dev_dir = runs_lib.DevSubset(mt_dir, work_dir, every)
  lm_dev = LmDevSubset(lm_dir, work_dir, every)
  runner = runs_lib.Runner(ctx.work_dir, mt_dir, lm_dir, ctx.runner.workers,
                           dev_dir=dev_dir, mt_overrides=ctx.params_override,
                           stored=ctx.runner.stored)
  stored = _StoredBenches(ctx, steps, mt_dir, lm_dir)
  tasks, runs = {}, []
  for task, arms in TASKS:
    benches = {}
    for mode in (cfg['regime_bench_mode'], 'jit'):
      benches[mode] = stored.get(task, {}).get(mode) or ctx.bench(
          [m for _, m in reversed(arms)], mode,
          data_dir=mt_dir if task == 'mt' else lm_dir,
          reps=cfg['regime_bench_reps'], batches=cfg['regime_bench_batches'])
    bench, jit = benches[cfg['regime_bench_mode']], benches['jit']
    info = {}
    for arm, model in arms:
      key, dense = model.split('.')[-1], arms[0][1].split('.')[-1]
      ms_arm = bench['ms_per_step'][key]
      wall = WallSteps(steps, ms_arm, bench['ms_per_step'][dense])
      info[arm] = dict(model=model, ms_per_step=ms_arm, wall_steps=wall,
                       jit_ms_per_step=jit['ms_per_step'][key],
                       jit_wall_steps=WallSteps(
                           steps, jit['ms_per_step'][key],
                           jit['ms_per_step'][dense]))
      for seed in cfg['regime_seeds']:
        runs.append(runs_lib.TrainerRun(
            f'regime_{task}_{arm}_s{seed}', model, seed, [steps, wall],
            runs_lib.SeedOverrides(seed), decode=task == 'mt',
            eval_every=cfg['regime_eval_every'], data=task,
            eval_file=lm_dev if task == 'lm' else None))
    tasks[task] = dict(arms=info, bench=bench, bench_jit=jit)
  return dict(steps=steps, seeds=list(cfg['regime_seeds']),
              dev_every=every, mt_dir=mt_dir, lm_dir=lm_dir,
              corpora=CorpusFacts(mt_dir, lm_dir),
              wall_tolerance=runs_lib.WALL_TOLERANCE, tasks=tasks,
              runs=runner.RunAll(runs))


# ------------------------------------------------------------------ page
TASK_TITLES = dict(mt='Translation (M4 analogue)', lm='Language model '
                   '(Shazeer App. C analogue)')


def _Arms(res, task):
  """{arm: [run result]} of a task, dense first."""
  return {arm: pp.Runs(res, f'regime_{task}_{arm}')
          for arm in res['tasks'][task]['arms']}


def _Slope(runs, steps):
  """Mean change of dev log-pplx per 1,000 steps between the last two
  evaluations up to `steps`: how fast an arm still improves at the
  budget's end."""
  d = []
  for r in runs:
    pts = [(p['step'], p['log_pplx']) for p in r['curve']
           if p['step'] <= steps]
    if len(pts) > 1 and pts[-1][0] == steps:
      (s0, v0), (s1, v1) = pts[-2:]
      d.append((v1 - v0) * 1000 / (s1 - s0))
  return pp.MeanSd(d)[0] if d else None


def _Gaps(runs, steps):
  """[(step, mean MoE - dense dev log-pplx)] at the eval steps both have."""
  out = []
  for point in runs['dense'][0]['curve'] if runs['dense'] else []:
    s = point['step']
    if s > steps:
      continue
    moe = pp.MeanSd([pp.CurveAt(r, s) for r in runs['moe']])[0]
    dense = pp.MeanSd([pp.CurveAt(r, s) for r in runs['dense']])[0]
    if moe is not None and dense is not None:
      out.append((s, moe - dense))
  return out


def _Brackets(runs, budget):
  """(last eval step all `runs` share at or before `budget`, first one
  after it or None)."""
  shared = set.intersection(*[{p['step'] for p in r['curve']} for r in runs])
  lo = max([s for s in shared if s <= budget], default=None)
  hi = min([s for s in shared if s > budget], default=None)
  return lo, (None if lo == budget else hi)


def _JitLines(info, runs, steps):
  """The reading at the XLA-compiled step's equal wall-clock budget (when
  measured): the MoE arm at its evaluations on either side of that budget
  against dense at `steps`; returns (lines, MoE wins: True / False, None
  when the two sides disagree or nothing was measured)."""
  moe = info['moe']
  if 'jit_wall_steps' not in moe or not runs['moe'] or not runs['dense']:
    return [], None
  ratio = moe['jit_ms_per_step'] / info['dense']['jit_ms_per_step']
  lo, hi = _Brackets(runs['moe'], moe['jit_wall_steps'])
  if lo is None:
    return [], None
  dense = [pp.CurveAt(r, steps) for r in runs['dense']]
  claims, verdicts = [], []
  for at in [s for s in (lo, hi) if s is not None]:
    vals = [pp.CurveAt(r, at) for r in runs['moe']]
    claims.append(pp.Claim(vals, dense, False))
    verdicts.append(pp.Verdict(vals, dense, False, 'MoE', 'dense',
                               f'MoE at step {at:,}'))
  head = (f'- With the XLA-compiled step (`--jit`, as the demo trains) the '
          f'MoE step takes ×{ratio:.3f} the dense one, so MoE makes '
          f'{moe["jit_wall_steps"]:,} steps in the dense arm\'s time for '
          f'{steps:,}. Dev log-pplx ')
  if len(claims) == 1:
    return [head + 'at that budget: ' + verdicts[0]], claims[0] > 0
  same = (claims[0] > 0) == (claims[1] > 0)  # On whether MoE is better.
  return [head + 'at the MoE evaluations on either side of that budget ('
          + ('they agree on whether MoE is better' if same else
             'they disagree on whether MoE is better: undetermined') + '): '
          + ' '.join(verdicts)], (claims[0] > 0 if same else None)


def _TaskLines(res, task):
  """The task's table, verdicts and the numbers its reading uses; returns
  (lines, {step-time mode: MoE wins at its equal wall-clock? None: not
  measured})."""
  steps, info = res['steps'], res['tasks'][task]['arms']
  runs = _Arms(res, task)
  dense_ms = info['dense']['ms_per_step']
  head = ['arm', 'config key', 'weights', 'matmul FLOPs / token',
          'ms/step (graph)', 'vs dense', 'steps at equal wall-clock',
          f'dev log-pplx @ {steps}', 'dev log-pplx @ equal wall-clock']
  if task == 'mt':
    head += [f'chrF unseen @ {steps}', f'chrF seen @ {steps}',
             'chrF unseen @ equal wall-clock']
  rows = []
  for arm, a in info.items():
    counts = count_params.CountModel(a['model'])
    wall = a['wall_steps']
    row = [arm, f'`{a["model"]}`', f'{counts.total / 1e6:.2f}M',
           f'{counts.flops_per_token:,}', f'{a["ms_per_step"]:.1f}',
           f'{a["ms_per_step"] / dense_ms:.3f}', f'{wall:,}',
           pp.Fmt([pp.CurveAt(r, steps) for r in runs[arm]], 3),
           pp.Fmt([pp.CurveAt(r, wall) for r in runs[arm]], 3)]
    if task == 'mt':
      row += [pp.Fmt([pp.Score(r, sp, st) for r in runs[arm]])
              for sp, st in ((pp.SPLITS[0], steps), (pp.SPLITS[1], steps),
                             (pp.SPLITS[0], wall))]
    rows.append(row)
  lines = [f'### {TASK_TITLES[task]}', ''] + pp.Table(head, rows)
  at = {label: {arm: [pp.CurveAt(r, st(arm)) for r in runs[arm]]
                for arm in info}
        for label, st in (('equal steps', lambda a: steps),
                          ('equal wall-clock',
                           lambda a: info[a]['wall_steps']))}
  for label, vals in at.items():
    lines.append('- ' + pp.Verdict(vals['moe'], vals['dense'], False, 'MoE',
                                   'dense', f'dev log-pplx at {label}'))
  if task == 'mt':
    for sp in pp.SPLITS:
      lines.append('- ' + pp.Verdict(
          [pp.Score(r, sp, info['moe']['wall_steps']) for r in runs['moe']],
          [pp.Score(r, sp, steps) for r in runs['dense']], True, 'MoE',
          'dense', f'chrF {sp} at equal wall-clock'))
  jit_lines, jit_win = _JitLines(info, runs, steps)
  lines += jit_lines
  wins = dict(graph=pp.Claim(at['equal wall-clock']['moe'],
                             at['equal wall-clock']['dense'], False) > 0,
              jit=jit_win)
  tokens = pp.MeanSd([r['tgt_tokens_per_step'] for rs in runs.values()
                      for r in rs])[0]
  gaps = _Gaps(runs, steps)
  slopes = {arm: _Slope(runs[arm], steps)
            for arm in info}
  seen = (f'~{steps * tokens / 1e6:.1f}M target tokens seen per run'
          if tokens else 'target tokens per step not recorded')
  if task == 'lm' and tokens:
    seen += (f', {steps * tokens / res["corpora"]["lm"]["words"]["train"]:.2f}'
             ' epochs of the training words')
  slope = ', '.join(f'{arm} {v:+.3f}' for arm, v in slopes.items()
                    if v is not None)
  lines += [f'- Budget: {steps:,} steps, {seen}. MoE − dense dev log-pplx '
            'by step (mean over seeds): ' + ', '.join(
                f'{s:,} {g:+.3f}' for s, g in gaps) + '.' + (
                    ' Change of dev log-pplx over the last evaluation '
                    f'interval, per 1,000 steps: {slope}.' if slope else ''),
            '']
  return lines, wins


def Section(res, res_dir):
  """The page's section: (markdown lines, PNG paths)."""
  mt, lm = res['corpora']['mt'], res['corpora']['lm']
  lines = ['## 8. A larger-data regime: MoE vs its FLOP-matched twin on the '
           'large corpora (issue 31)', ''] + pp.Header(res)
  lines += [
      f'Corpora: `{res["mt_dir"]}` ({mt["english_strings"]:,} distinct '
      f'English strings, {mt["splits"]["train"]["pairs"]:,} training pairs, '
      f'{mt["languages"]} languages) and `{res["lm_dir"]}` '
      f'({lm["words"]["train"]:,} training words, a {lm["vocab_size"]:,}-'
      f'word vocabulary). Every arm trains {res["steps"]:,} steps, seeds '
      f'{res["seeds"]} (initialisation, routing randomness, data order), '
      'with its registered settings. *Equal wall-clock*: the time the dense '
      'arm takes for those steps at each arm\'s step time, measured '
      'interleaved by `scripts/bench_step.py` on the task\'s corpus in TF '
      'graph mode (as the runs train; budgets within '
      f'{res["wall_tolerance"]:.0%} count as the step budget). Dev sets: '
      f'every {res["dev_every"]}th row of the corpora\'s dev splits (MT: '
      '`dev_unseen_en` for log-perplexity, both dev splits decoded greedily '
      'for chrF); the same rows for every arm.', '']
  pngs, wins = [], {}
  for task in [t for t, _ in TASKS if t in res['tasks']]:
    task_lines, won = _TaskLines(res, task)
    lines += task_lines
    for mode, w in won.items():
      wins.setdefault(mode, dict(won=[], open=[]))
      if w is None and mode == 'jit':
        wins[mode]['open'].append(TASK_TITLES[task])
      elif w:
        wins[mode]['won'].append(TASK_TITLES[task])
    runs = _Arms(res, task)
    png = plots.Curves(
        os.path.join(res_dir, f'regime_{task}_curves.png'),
        {res['tasks'][task]['arms'][a]['model']: [r['curve'] for r in rs]
         for a, rs in runs.items()},
        f'{TASK_TITLES[task]}: dev log-pplx vs steps, mean ± sd over seeds')
    lines += [f'![regime {task}](results/{os.path.basename(png)})', '']
    pngs.append(png)
  named = {'graph': 'TF graph step times, as the runs train',
           'jit': 'XLA-compiled step times, as the demo trains'}
  def Said(w):
    return (', '.join(w['won']) or 'neither task') + (
        f' (undetermined between evaluations: {", ".join(w["open"])})'
        if w['open'] else '')
  if any(w['won'] or w['open'] for w in wins.values()):
    answer = ('MoE beats its FLOP-matched dense twin on dev log-perplexity '
              'at equal wall-clock beyond the seed spread ' + '; '.join(
                  f'with {named[m]}: in {Said(w)}'
                  for m, w in wins.items()) + '.')
  else:
    answer = ('in neither task does MoE beat its FLOP-matched dense twin on '
              'dev log-perplexity at equal wall-clock beyond the seed '
              'spread, with ' + ' or '.join(named[m] for m in wins) +
              ' (the numbers above say by how much and which way).')
  minutes = sum(sum(r['command_seconds']) for r in res['runs'].values()
                if 'command_seconds' in r) / 60
  lines += [f'**Answer: {answer}**', '',
            f'The runs took {minutes:,.0f} minutes of training, evaluation '
            'and decoding in all (two at a time, one thread each), whatever '
            'invocation of this section trained them.', '']
  cmds = pp.Commands(res)
  cmds[3:3] = [res['tasks'][t][key]['command'] for t, _ in TASKS
               for key in ('bench', 'bench_jit')
               if t in res['tasks'] and key in res['tasks'][t]]
  return lines + cmds, pngs
