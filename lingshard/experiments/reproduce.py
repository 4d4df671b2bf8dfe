"""The evidence page: the papers' headline claims at laptop scale.

  .venv/bin/python -m lingshard.experiments            # full run, ~3 h
  .venv/bin/python -m lingshard.experiments --quick    # smoke run (minutes)
  .venv/bin/python -m lingshard.experiments --only capacity,balance
  .venv/bin/python -m lingshard.experiments --page_only  # re-render the page

Trains and measures with the repository's own binaries (the trainer, the
benchmark scripts) and writes docs/RESULTS.md with PNG plots under
docs/results/. Experiments (names for --only):

  conditional  GShard Fig. 1/6, Shazeer Fig. 2-3: m4.TinyDense vs TinyMoE
               with E in {4, 8, 16, 32} (same matmul FLOPs per token) at
               equal steps and equal wall-clock, several seeds
  depth        GShard Table 2 / §4.4: 2 + 2 vs 6 + 6 layers at E = 8
  balance      Shazeer Table 6, GShard §2.2: with / without the aux loss;
               noisy top-k LM with / without importance + load losses
  capacity     GShard §2.2: capacity factor x second-expert policy
  speed        GShard Fig. 7-9 and MoE layer speed: bench_spmd_scaling.py,
               bench_moe.py
  gpipe        GPipe §2.3: bench_gpipe.py (memory, bubble)
  gpipe_image  GPipe Tables 1 and 2 for AmoebaNet-D cells: bench_gpipe.py
               --body=amoebanet (largest D per memory budget; throughput
               vs K, M for fill-drain and circular)
  lm           Shazeer App. C: lm1b.TinyMoE vs the FLOP-matched TinyLSTM
  probe        issue 31's capacity probe: TinyMoE vs TinyDense on a fixed
               small training subset, training loss at equal steps
  regime       issue 31's experiment: MoE vs its FLOP-matched dense twin on
               the large corpora (MT and LM), equal steps and wall-clock
  experts      per-expert specialisation (languages, tokens) of regime's
               MoE runs (their checkpoints in --work_dir)

Each experiment writes docs/results/<name>.json (every run's commands,
config key, seed, overrides and measurements, the revision); the page is
rendered from all of them, so --only regenerates one section and keeps the
others. Training runs go to --work_dir (default logs/reproduce) and are
reused when their spec is unchanged; runs recorded in docs/results by a
revision with the same lingshard/ package (this experiments package aside:
it renders and schedules, it does not train) are reused too (the page says
which). The step benchmarks are this checkout's scripts/bench_*.py (found
from any working directory); data paths are the working directory's.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import argparse
import datetime
import functools
import json
import os
import re
import subprocess
import sys
import time

from lingshard.experiments import benches
from lingshard.experiments import experts
from lingshard.experiments import page as page_lib
from lingshard.experiments import page_parts
from lingshard.experiments import probe
from lingshard.experiments import regime
from lingshard.experiments import runs as runs_lib

# The repository this package is in (git: which revision, same package?).
# Data paths are relative to the working directory; the scripts
# (scripts/bench_*.py) are this checkout's (benches.REPO).
ROOT = benches.REPO
# Compared between revisions to reuse recorded runs: the package, without
# this experiments package (see the module docstring).
PACKAGE_PATHS = ('lingshard', ':(exclude)lingshard/experiments')
# Run order: the timing benchmarks first (each with the machine to itself),
# the headline experiment next.
EXPERIMENTS = ('speed', 'conditional', 'capacity', 'balance', 'depth', 'lm',
               'gpipe', 'gpipe_image', 'probe', 'regime', 'experts')
DENSE = 'm4.TinyDense'
MOE_ARMS = (('E4', 'm4.TinyMoE4E'), ('E8', 'm4.TinyMoE'),
            ('E16', 'm4.TinyMoE16E'), ('E32', 'm4.TinyMoE32E'))
DEEP = 'm4.TinyMoE12L'
CAPACITY_FACTORS = (0.5, 1.0, 2.0, 4.0)
POLICIES = ('all', 'random')
# The capacity probe (probe.py): pairs of its training subset, steps and
# its curve's eval interval. From the arms' curves (seed 1, ~400 target
# tokens per step): on 2,000 pairs (~20 epochs in 1,000 steps) TinyDense
# memorises nearly all of it (training log-pplx 0.25, TinyMoE 0.22); on
# 8,000 (~5 epochs) it reaches 1.53, TinyMoE 1.39. Six runs of 1,000 steps
# with 4 evaluations of 8,000 pairs take ~15 min on 2 idle cores.
PROBE_ROWS = 8000
PROBE_STEPS = 1000
PROBE_EVAL_EVERY = 250
# The regime experiment (regime.py): steps per run, eval interval, seeds,
# dev rows kept (every n-th) and the corpora. From one-seed pilots on the
# large corpora (7,000+ steps, logs in the issue 31 notes) and the machine
# time of 12 runs: 5,000 steps (~19 min a run, two at a time). The step
# benchmark: 5 reps of 24 batches (the LM's MoE/LSTM ratio varied from
# 0.79 to 1.08 over 3 reps of 12 batches, 0.90-0.91 over 5 of 24).
REGIME = dict(regime_steps=5000, regime_eval_every=1000, regime_seeds=(1, 2, 3),
              regime_dev_every=4, regime_mt_dir='data/ui_m4_large',
              regime_lm_dir='data/lm_en_large', regime_bench_mode='graph',
              regime_bench_reps=5, regime_bench_batches=24)

# steps: the MT runs' step budget (equal-steps comparisons); seeds: of
# conditional, lm and the reference arms of depth / balance; sweep_seeds:
# of capacity and the other depth / balance arms; sweep_steps: the
# capacity sweep's budget (8 arms); probe_*: the capacity probe's training
# subset (rows of train.tsv), step budget, eval interval and seeds.
CONFIGS = {
    'full': dict(steps=1000, eval_every=250, seeds=(1, 2, 3),
                 sweep_seeds=(1,), sweep_steps=500, lm_steps=1500,
                 bench_step_mode='jit',
                 arms=('E4', 'E8', 'E16', 'E32'),
                 capacity_factors=CAPACITY_FACTORS, dev_rows=0,
                 bench_step_reps=3, bench_step_batches=12,
                 spmd_devices='2,4,8,16,32,64', moe_experts='8 16 64',
                 moe_reps=3,
                 # Tables (a), (b) of the --quick subset; (c), the schedule
                 # table (issue 49), in full: K in {2, 4}, M in {4, 8}.
                 gpipe_args=('--quick', '--parts=memory,efficiency,schedule'),
                 # The README's run (the script's defaults: 3 + 1 cells,
                 # 16 x 16 x 8, N = 16; Table 2 fill-drain and circular-2
                 # at K in {2, 4}, M in {1, 4, 8}; K = 4 circular needs
                 # 8 cells: skipped): Table 1 26 min, Table 2 22 min on a
                 # loaded 2-core host.
                 gpipe_image_args=(),
                 mt_overrides='',
                 probe_rows=PROBE_ROWS, probe_steps=PROBE_STEPS,
                 probe_eval_every=PROBE_EVAL_EVERY, probe_seeds=(1, 2, 3),
                 **REGIME),
    # Every table and figure from a subset of each experiment's arms,
    # evaluated and decoded on every 50th dev row.
    # (10 steps: a trainer process's start-up and tracing dominate.)
    'quick': dict(steps=10, eval_every=10, seeds=(1,), sweep_seeds=(1,),
                  sweep_steps=10, lm_steps=10, bench_step_mode='graph',
                  arms=('E32',), capacity_factors=(0.5, 2.0), dev_rows=50,
                  bench_step_reps=1, bench_step_batches=2, spmd_devices='2,4',
                  moe_experts='8', moe_reps=1,
                  gpipe_args=('--mem_layers=4', '--mem_micro_batches=1,8',
                              '--stages=2', '--micro_batches=1,8',
                              '--eff_layers=4', '--run_reps=1',
                              '--parts=memory,efficiency,schedule',
                              '--sched_stages=2', '--sched_micro_batches=4',
                              '--sched_repeats=2',
                              '--mem_batch_size=32', '--batch_size=16'),
                  # 2 (Table 1) and 4 (Table 2: K = 2 x R = 2 chunks)
                  # normal cells on 8 x 8 x 8, N = 4, K = 2: 3.5 + 2.7 min.
                  gpipe_image_args=(
                      '--amoeba_image=8', '--amoeba_stem_filters=8',
                      '--amoeba_batch=4', '--amoeba_reductions=0',
                      '--amoeba_layers=2', '--amoeba_stages=2',
                      '--amoeba_micro_batches=2', '--amoeba_budget_mib=1',
                      '--amoeba_t2_layers=4', '--amoeba_t2_filters=8',
                      '--amoeba_t2_stages=2', '--amoeba_t2_micro_batches=1,2',
                      '--amoeba_t2_schedules=fill-drain,circular-2',
                      '--run_reps=1'),
                  # One bucket shape: one trace per step function.
                  mt_overrides='input.bucket_upper_bounds=[64];'
                  'input.bucket_batch_limits=[16]',
                  probe_rows=32, probe_steps=10, probe_eval_every=10,
                  probe_seeds=(1,),
                  # The default corpora (the Large configs with their
                  # paths overridden), every 50th dev row.
                  **dict(REGIME, regime_steps=10, regime_eval_every=10,
                         regime_seeds=(1,), regime_dev_every=50,
                         regime_mt_dir=None, regime_lm_dir=None,
                         regime_bench_reps=1, regime_bench_batches=2)),
}


def _Args(argv):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--quick', action='store_true')
  ap.add_argument('--only', default='',
                  help=f'Comma-separated subset of {",".join(EXPERIMENTS)}.')
  ap.add_argument('--data_dir', default='data/ui_m4')
  ap.add_argument('--lm_data_dir', default='data/lm_en')
  ap.add_argument('--work_dir', default='logs/reproduce')
  ap.add_argument('--out_dir', default='docs',
                  help='RESULTS.md here, PNGs and JSON in <out_dir>/results.')
  ap.add_argument('--workers', type=int, default=2)
  ap.add_argument('--params_override', default='',
                  help='Extra overrides for every translation run and step '
                  'benchmark (e.g. smaller buckets on a small corpus).')
  ap.add_argument('--page_only', action='store_true',
                  help='Only re-render the page from the stored JSON.')
  args = ap.parse_args(argv)
  names = [n for n in args.only.split(',') if n] or list(EXPERIMENTS)
  bad = [n for n in names if n not in EXPERIMENTS]
  if bad:
    ap.error(f'unknown experiment(s) {", ".join(bad)}; choose from '
             f'{", ".join(EXPERIMENTS)}')
  args.names = names
  args.command = runs_lib.Shown(
      [sys.executable, '-m', 'lingshard.experiments'] +
      list(sys.argv[1:] if argv is None else argv))
  return args


_SeedOverrides = runs_lib.SeedOverrides


def Conditional(ctx):
  cfg, steps = ctx.cfg, ctx.cfg['steps']
  moe_arms = tuple((a, m) for a, m in MOE_ARMS if a in cfg['arms'])
  models = [m for _, m in moe_arms] + [DEEP, DENSE]
  bench = benches.BenchStep(ctx, models, cfg['bench_step_mode'])
  ms = bench['ms_per_step']
  t_dense = ms[DENSE.split('.')[-1]]
  runs, arms = [], {}
  for arm, model in (('dense', DENSE),) + moe_arms:
    t_arm = ms[model.split('.')[-1]]
    # Equal wall-clock: the time the dense model takes for `steps` steps,
    # at each arm's measured (interleaved, XLA-compiled) step time.
    wall = runs_lib.WallSteps(steps, t_arm, t_dense)
    names = []
    if model == 'm4.TinyMoE':
      ctx.e8_wall = wall
    for seed in cfg['seeds']:
      if model == 'm4.TinyMoE':
        run = _BaseRun(ctx, seed)  # The same run as depth's and balance's.
      else:
        run = runs_lib.TrainerRun(
            f'cc_{arm}_s{seed}', model, seed, [steps, wall],
            _SeedOverrides(seed), decode=True, eval_every=cfg['eval_every'])
      runs.append(run)
      names.append(run.name)
    arms[arm] = dict(model=model, ms_per_step=t_arm, wall_steps=wall,
                     runs=names)
  results = ctx.runner.RunAll(runs)
  return dict(arms=arms, steps=steps, seeds=list(cfg['seeds']),
              wall_tolerance=runs_lib.WALL_TOLERANCE, bench=bench,
              runs=results)


def _BaseRun(ctx, seed, name='e8', extra='', curve=True):
  """m4.TinyMoE for the step budget, decoded: the reference arm of depth
  and balance, and conditional's E8 arm (one run serves all: with an equal
  wall-clock budget other than the step budget it also stops there)."""
  cfg = ctx.cfg
  if name == 'e8' and ctx.e8_wall not in (None, cfg['steps']):
    return runs_lib.TrainerRun(
        f'cc_E8_s{seed}', 'm4.TinyMoE', seed, [cfg['steps'], ctx.e8_wall],
        _SeedOverrides(seed), decode=True, eval_every=cfg['eval_every'])
  return runs_lib.TrainerRun(
      f'{name}_s{seed}', 'm4.TinyMoE', seed, [cfg['steps']],
      _SeedOverrides(seed, extra), decode=True,
      eval_every=cfg['eval_every'] if curve else cfg['steps'])


def Depth(ctx):
  cfg, steps = ctx.cfg, ctx.cfg['steps']
  runs = [_BaseRun(ctx, seed) for seed in cfg['seeds']]
  base = [r.name for r in runs]
  # 6 + 6 costs 2.2x the FLOPs per step: one seed per sweep seed; its
  # difference is read against the 2 + 2 arm's seed spread.
  for seed in cfg['sweep_seeds']:
    runs.append(runs_lib.TrainerRun(
        f'deep_s{seed}', DEEP, seed, [steps], _SeedOverrides(seed),
        decode=True, eval_every=cfg['eval_every']))
  return dict(steps=steps, seeds=list(cfg['seeds']),
              sweep_seeds=list(cfg['sweep_seeds']),
              arms={'2+2': 'm4.TinyMoE', '6+6': DEEP}, base=base,
              runs=ctx.runner.RunAll(runs))


NO_AUX = 'task.moe_tpl.aux_loss_weights.group_aux=0.0'
NO_LM_LOSSES = ('task.moe_tpl.aux_loss_weights.importance=0.0;'
                'task.moe_tpl.aux_loss_weights.load=0.0')


def _LmRun(ctx, seed, name, model, extra=''):
  cfg = ctx.cfg
  return runs_lib.TrainerRun(
      f'{name}_s{seed}', model, seed, [cfg['lm_steps']],
      _SeedOverrides(seed, extra), eval_every=cfg['eval_every'], data='lm')


def Balance(ctx):
  cfg, steps = ctx.cfg, ctx.cfg['steps']
  runs, base = [], []
  for seed in cfg['seeds']:
    runs.append(_BaseRun(ctx, seed))
    base.append(runs[-1].name)
  # Without the aux loss: the sweep seeds (its effect on balance is large;
  # quality differences are read against the aux arm's seed spread).
  for seed in cfg['sweep_seeds']:
    runs.append(_BaseRun(ctx, seed, 'noaux', NO_AUX, curve=False))
  for seed in cfg['sweep_seeds']:
    runs.append(_LmRun(ctx, seed, 'lm_moe', 'lm1b.TinyMoE'))
    runs.append(_LmRun(ctx, seed, 'lm_noloss', 'lm1b.TinyMoE', NO_LM_LOSSES))
  return dict(steps=steps, lm_steps=cfg['lm_steps'], seeds=list(cfg['seeds']),
              base=base,
              sweep_seeds=list(cfg['sweep_seeds']),
              runs=ctx.runner.RunAll(runs))


def _CapacityName(cf, policy):
  return f'cf{cf:g}_{policy}'


def Capacity(ctx):
  cfg, steps = ctx.cfg, ctx.cfg['sweep_steps']
  variants, runs = [], []
  for cf in cfg['capacity_factors']:
    for policy in POLICIES:
      name = _CapacityName(cf, policy)
      extra = (f'task.moe_tpl.capacity_factor={cf};'
               f"task.moe_tpl.second_expert_policy='{policy}'")
      variants.append(f'{name}=m4.TinyMoE:{extra}')
      for seed in cfg['sweep_seeds']:
        runs.append(runs_lib.TrainerRun(
            f'cap_{name}_s{seed}', 'm4.TinyMoE', seed, [steps],
            _SeedOverrides(seed, extra), eval_every=steps))
  # Step time per variant: TF graph mode (no XLA compile per variant);
  # the ratio to m4.TinyDense in the same interleaved benchmark.
  bench = benches.BenchStep(ctx, [DENSE], 'graph', variants)
  return dict(steps=steps, sweep_seeds=list(cfg['sweep_seeds']),
              capacity_factors=list(cfg['capacity_factors']),
              policies=list(POLICIES), bench=bench,
              runs=ctx.runner.RunAll(runs))


def Lm(ctx):
  cfg = ctx.cfg
  runs = []
  # Every seed: the paper's claim (MoE beats its FLOP-matched LSTM) is
  # this section's, so it is read against the seed spread.
  for seed in cfg['seeds']:
    runs.append(_LmRun(ctx, seed, 'lm_moe', 'lm1b.TinyMoE'))
    runs.append(_LmRun(ctx, seed, 'lm_lstm', 'lm1b.TinyLSTM'))
  return dict(steps=cfg['lm_steps'], seeds=list(cfg['seeds']),
              runs=ctx.runner.RunAll(runs))


RUNNERS = dict(conditional=Conditional, depth=Depth, balance=Balance,
               capacity=Capacity, speed=benches.Speed, gpipe=benches.Gpipe,
               gpipe_image=benches.GpipeImage,
               lm=Lm, probe=probe.Probe, regime=regime.Regime,
               experts=experts.Experts)


class Context:

  def __init__(self, args):
    self.mode = 'quick' if args.quick else 'full'
    self.cfg = CONFIGS[self.mode]
    self.data_dir, self.out_dir = args.data_dir, args.out_dir
    self.work_dir = args.work_dir
    self.params_override = ';'.join(
        o for o in (self.cfg['mt_overrides'], args.params_override) if o)
    # The E8 arm's equal wall-clock steps, from this run's conditional
    # experiment or the stored one (so depth and balance reuse its runs).
    self.e8_wall = None
    stored = os.path.join(args.out_dir, 'results', 'conditional.json')
    if os.path.exists(stored):
      with open(stored, encoding='utf-8') as f:
        cond = json.load(f)
      if (cond.get('mode') == ('quick' if args.quick else 'full') and
          cond.get('steps') == self.cfg['steps'] and 'E8' in cond['arms']):
        self.e8_wall = cond['arms']['E8']['wall_steps']
    dev_dir = args.data_dir
    if self.cfg['dev_rows']:
      dev_dir = runs_lib.DevSubset(args.data_dir, args.work_dir,
                                         self.cfg['dev_rows'])
    self.bench = functools.partial(benches.BenchStep, self)
    self.runner = runs_lib.Runner(args.work_dir, args.data_dir,
                                        args.lm_data_dir, args.workers,
                                        dev_dir=dev_dir,
                                        mt_overrides=self.params_override,
                                        stored=StoredRuns(args))


def StoredRuns(args):
  """{run name: result} of the runs recorded in <out_dir>/results/*.json
  in this mode, from revisions whose lingshard/ package equals this one's
  (so a fresh clone regenerates one section without re-training the runs
  it shares with another). Each is marked with where it came from."""
  out = {}
  res_dir = os.path.join(args.out_dir, 'results')
  mode = 'quick' if args.quick else 'full'
  for name in EXPERIMENTS:
    path = os.path.join(res_dir, f'{name}.json')
    if not os.path.exists(path):
      continue
    with open(path, encoding='utf-8') as f:
      res = json.load(f)
    rev = res.get('revision', '').split('+')[0]
    if res.get('mode') != mode or not _SamePackage(rev):
      continue
    for run_name, run in res.get('runs', {}).items():
      if 'spec_hash' in run:
        out.setdefault(run_name, dict(
            run, reused_from=run.get('reused_from') or
            f'{name} experiment at revision {rev[:7]}'))
  return out


@functools.cache
def _SamePackage(rev):
  """True when lingshard/ (but lingshard/experiments) at `rev` equals the
  checkout's (committed and uncommitted)."""
  if not re.fullmatch(r'[0-9a-f]{7,40}', rev or ''):
    return False
  proc = subprocess.run(['git', 'diff', '--quiet', rev, '--',
                         *PACKAGE_PATHS],
                        cwd=ROOT, capture_output=True, check=False)
  return proc.returncode == 0


def _Revision():
  def Git(*a):
    # The repository this script is in (ROOT may be a symlink farm).
    return subprocess.run(['git', *a], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.realpath(__file__)),
                          check=False).stdout.strip()
  rev = Git('rev-parse', 'HEAD') or 'unknown'
  dirty = bool(Git('status', '--porcelain', '--untracked-files=no'))
  return rev + ('+uncommitted changes' if dirty else '')


def _EnsureCorpora(args):
  """Prepares the default corpora if missing (as the demo does)."""
  needs_lm = {'balance', 'lm', 'regime'} & set(args.names)
  for path, module, needed in ((args.data_dir, 'lingshard.data.prepare', True),
                               (args.lm_data_dir, 'lingshard.data.lm_prepare',
                                needs_lm)):
    marker = 'train.tsv' if module.endswith('.prepare') else 'train.txt'
    if needed and not os.path.exists(os.path.join(path, marker)):
      subprocess.run([sys.executable, '-m', module, '--out', path],
                     check=True)


def main(argv=None):
  args = _Args(argv)
  res_dir = os.path.join(args.out_dir, 'results')
  os.makedirs(res_dir, exist_ok=True)
  if not args.page_only:
    _EnsureCorpora(args)
    _RunExperiments(args, res_dir)
  try:
    written = page_lib.Write(args.out_dir, args.data_dir)
  except page_parts.PageError as e:
    raise SystemExit(f'lingshard.experiments: error: {e}') from None
  missing = [p for p in written if not os.path.exists(p)]
  if missing:
    raise SystemExit(f'lingshard.experiments: not produced: {", ".join(missing)}')
  print(f'wrote {", ".join(written)}')


def _RunExperiments(args, res_dir):
  ctx = Context(args)
  revision = _Revision()
  for name in args.names:
    t0 = time.time()
    print(f'== {name}', flush=True)
    result = RUNNERS[name](ctx)
    result.update(experiment=name, revision=revision,
                  mode='quick' if args.quick else 'full',
                  date=datetime.date.today().isoformat(),
                  seconds=round(time.time() - t0, 1),
                  command=args.command,
                  data_dir=args.data_dir)
    with open(os.path.join(res_dir, f'{name}.json'), 'w',
              encoding='utf-8') as f:
      json.dump(result, f, indent=1, sort_keys=True)
    print(f'   {name}: {time.time() - t0:.0f} s', flush=True)


if __name__ == '__main__':
  main()
