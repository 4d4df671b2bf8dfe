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

from lingshard.experiments import runs as runs_lib

TASKS = (('mt', (('dense', 'm4.TinyDenseLarge'), ('moe', 'm4.TinyMoELarge'))),
         ('lm', (('dense', 'lm1b.TinyLSTMLarge'), ('moe',
                                                   'lm1b.TinyMoELarge'))))
LM_DEV = 'dev.txt'
# Arms whose equal wall-clock budget is within this share of the step
# budget are read at the step budget (as the conditional section).
WALL_TOLERANCE = 0.03


def LmDevSubset(lm_dir, work_dir, every):
  """Every `every`-th line of the LM corpus's dev split, in work_dir;
  returns its path."""
  out = os.path.join(work_dir, f'lm_dev_every_{every}.txt')
  os.makedirs(work_dir, exist_ok=True)
  with open(os.path.join(lm_dir, LM_DEV), encoding='utf-8') as f:
    rows = f.readlines()
  with open(out, 'w', encoding='utf-8') as f:
    f.writelines(rows[::every])
  return out


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


def WallSteps(steps, ms_arm, ms_dense):
  """The steps an arm takes in the dense arm's time for `steps` steps."""
  wall = max(1, round(steps * ms_dense / ms_arm))
  return steps if abs(wall - steps) <= WALL_TOLERANCE * steps else wall


def Regime(ctx):
  """Benchmarks each task's arms, then trains seeds x arms on the large
  corpora; returns the experiment's result."""
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
  tasks, runs = {}, []
  for task, arms in TASKS:
    bench = ctx.bench([m for _, m in reversed(arms)], cfg['regime_bench_mode'],
                      data_dir=mt_dir if task == 'mt' else lm_dir)
    ms = bench['ms_per_step']
    ms_dense = ms[arms[0][1].split('.')[-1]]
    info = {}
    for arm, model in arms:
      ms_arm = ms[model.split('.')[-1]]
      wall = WallSteps(steps, ms_arm, ms_dense)
      info[arm] = dict(model=model, ms_per_step=ms_arm, wall_steps=wall)
      for seed in cfg['regime_seeds']:
        runs.append(runs_lib.Run(
            f'regime_{task}_{arm}_s{seed}', model, seed, [steps, wall],
            runs_lib.SeedOverrides(seed), decode=task == 'mt',
            eval_every=cfg['regime_eval_every'], data=task,
            eval_file=lm_dev if task == 'lm' else None))
    tasks[task] = dict(arms=info, bench=bench)
  return dict(steps=steps, seeds=list(cfg['regime_seeds']),
              dev_every=every, mt_dir=mt_dir, lm_dir=lm_dir,
              corpora=CorpusFacts(mt_dir, lm_dir),
              wall_tolerance=WALL_TOLERANCE, tasks=tasks,
              runs=runner.RunAll(runs))
