"""Issue 31's experiment on the evidence page (lingshard/experiments/
regime.py, experts.py): equal wall-clock budgets, the LM dev subset, the
commands the runs and the specialisation counts are made with, and the
section's answer under the page's claim rule."""

import json
import math
import os
import shlex

import pytest

from lingshard.experiments import experts
from lingshard.experiments import regime
from lingshard.experiments import runs as runs_lib


def test_equal_wall_clock_steps_scale_by_the_step_time_ratio():
  # An arm 25% slower than dense gets 4/5 of the steps in dense's time.
  assert regime.WallSteps(5000, 125.0, 100.0) == 4000
  assert regime.WallSteps(5000, 80.0, 100.0) == 6250
  # Within 3% of the budget: the budget itself (one eval point).
  assert regime.WallSteps(5000, 102.0, 100.0) == 5000
  assert regime.WallSteps(5000, 97.5, 100.0) == 5000
  assert regime.WallSteps(10, 1e6, 1.0) == 1


def test_the_lm_dev_subset_keeps_every_nth_line_in_order(tmp_path):
  lm = tmp_path / 'lm'
  lm.mkdir()
  (lm / 'dev.txt').write_text(''.join(f'line {i}\n' for i in range(10)),
                              encoding='utf-8')
  path = regime.LmDevSubset(str(lm), str(tmp_path / 'work'), 4)
  with open(path, encoding='utf-8') as f:
    assert f.read() == 'line 0\nline 4\nline 8\n'


def test_an_lm_run_evaluates_on_its_eval_file_and_trains_on_the_corpus():
  runner = runs_lib.Runner('w', 'mt', 'lmdir', workers=1)
  run = runs_lib.TrainerRun(
      'regime_lm_moe_s1', 'lm1b.TinyMoELarge', 1, [20, 10],
      runs_lib.SeedOverrides(1), eval_every=10, data='lm',
      eval_file='w/regime/lm_dev_every_4.txt')
  cmds = runner.Commands(run)
  assert [(k, s) for k, s, _ in cmds] == [('train', 10), ('train', 20)]
  argv = cmds[0][2]
  assert ("--eval_params_override=input.file_pattern="
          "'w/regime/lm_dev_every_4.txt'") in argv
  assert ("--params_override=input.file_pattern='lmdir/train.txt';"
          "input.vocab='lmdir/vocab.txt';") in ' '.join(argv)
  # Without eval_file: the corpus's dev split, and an unchanged spec (so
  # recorded LM runs stay reusable).
  plain = runs_lib.TrainerRun('lm_moe_s1', 'lm1b.TinyMoE', 1, [10], data='lm')
  assert ("--eval_params_override=input.file_pattern='lmdir/dev.txt'"
          in runner.Commands(plain)[0][2])
  assert 'eval_file' not in plain.Spec()


def test_corpus_facts_come_from_the_manifests(tmp_path):
  mt, lm = tmp_path / 'mt', tmp_path / 'lm'
  mt.mkdir()
  lm.mkdir()
  (mt / 'manifest.json').write_text(json.dumps(dict(
      english_strings=7, unique_pairs=30, languages=3, splits=dict(
          train=dict(pairs=25, english_strings=6, languages=3,
                     noph_pairs=1)))), encoding='utf-8')
  (lm / 'manifest.json').write_text(json.dumps(dict(
      vocab_size=104, splits=dict(train=dict(words=900, sentences=9),
                                  dev=dict(words=50, sentences=2)))),
                                    encoding='utf-8')
  assert regime.CorpusFacts(str(mt), str(lm)) == dict(
      mt=dict(english_strings=7, unique_pairs=30, languages=3,
              splits=dict(train=dict(pairs=25, english_strings=6))),
      lm=dict(words=dict(train=900, dev=50), vocab_size=104))


def test_the_usage_command_reuses_the_runs_flags():
  argv = ['python', '-m', 'lingshard.trainer', '--model=m4.TinyMoELarge',
          '--logdir=w/regime_mt_moe_s2', '--mode=train_and_eval', '--nojit',
          '--seed=2', '--max_steps=50',
          "--params_override=input.file_pattern='d/train.tsv';input.seed=1002",
          "--eval_params_override=input.file_pattern='w/dev/dev.tsv'"]
  cmd = experts.UsageCommand(runs_lib.Shown(argv), 'w/regime_mt_moe_s2',
                             'w/u.json', python='py')
  assert cmd == [
      'py', '-m', 'lingshard.tools.expert_usage',
      '--logdir=w/regime_mt_moe_s2', '--json=w/u.json',
      '--model=m4.TinyMoELarge',
      "--params_override=input.file_pattern='d/train.tsv';input.seed=1002",
      "--eval_params_override=input.file_pattern='w/dev/dev.tsv'",
      '--seed=2']
  with pytest.raises(ValueError, match='^no --seed in the run command '):
    experts.UsageCommand(shlex.join(argv[:7]), 'l', 'j')


def test_the_summary_measures_specialisation_in_bits():
  # Two languages, two experts: each language only ever picks its own
  # expert, so I(expert; language) = H(language) = 1 bit.
  counts = dict(expert=[6, 6], lang=dict(de=[6, 0], fr=[0, 6]),
                token={'1': [3, 3], '2': [3, 3]})
  usage = dict(layers={'enc/layer_001/moe': dict(
      gate='MoELayer', num_experts=2, choices_per_token=2, real_tokens=12,
      dropped_choices=0, first=counts, all=counts)})
  s = experts.Summary(usage)['enc/layer_001/moe']
  assert s['lang']['mi'] == pytest.approx(1.0)
  assert s['lang']['entropy'] == pytest.approx(1.0)
  # Tokens independent of the expert: no information.
  assert s['token']['mi'] == pytest.approx(0.0)
  assert s['token']['chance'] == pytest.approx(1 / (2 * 12 * math.log(2)))
  assert s['shares'] == [0.5, 0.5]


def _Run(curve, chrf=None):
  scores = {}
  if chrf:
    scores = {sp: {str(s): dict(average=dict(chrf=v, bleu=0.0), languages={})
                   for s, v in chrf.items()}
              for sp in ('dev_unseen_en', 'dev_seen_en')}
  return dict(curve=[dict(step=s, log_pplx=v) for s, v in curve],
              scores=scores, routing={}, tgt_tokens_per_step=100.0,
              command_seconds=[60.0, 30.0],
              commands=['python -m lingshard.trainer --model=x'])


def _Result():
  runs = {}
  for seed, jitter in ((1, 0.0), (2, 0.01), (3, -0.01)):
    # MT: MoE 0.2 nats ahead at every step (also at its equal wall-clock
    # stop 80); LM: level.
    runs[f'regime_mt_dense_s{seed}'] = _Run(
        [(50, 4.0 + jitter), (100, 3.5 + jitter)], {100: 30.0})
    runs[f'regime_mt_moe_s{seed}'] = _Run(
        [(50, 3.8 + jitter), (80, 3.4 + jitter), (100, 3.3 + jitter)],
        {80: 33.0, 100: 34.0})
    runs[f'regime_lm_dense_s{seed}'] = _Run(
        [(50, 6.0 + jitter), (100, 5.5 + jitter)])
    runs[f'regime_lm_moe_s{seed}'] = _Run(
        [(50, 6.0 - jitter), (100, 5.5 - jitter)])
  arms = lambda task: dict(  # noqa: E731
      dense=dict(model=dict(mt='m4.TinyDenseLarge',
                            lm='lm1b.TinyLSTMLarge')[task],
                 ms_per_step=100.0, wall_steps=100),
      moe=dict(model=dict(mt='m4.TinyMoELarge', lm='lm1b.TinyMoELarge')[task],
               ms_per_step=125.0 if task == 'mt' else 100.0,
               wall_steps=80 if task == 'mt' else 100,
               jit_ms_per_step=190.0, jit_wall_steps=53))
  arms_jit = lambda task: dict(  # noqa: E731
      arms(task), dense=dict(arms(task)['dense'], jit_ms_per_step=100.0,
                             jit_wall_steps=100))
  return dict(
      steps=100, seeds=[1, 2, 3], dev_every=4, mt_dir='data/ui_m4_large',
      lm_dir='data/lm_en_large', wall_tolerance=0.03,
      corpora=dict(mt=dict(english_strings=19868, unique_pairs=408206,
                           languages=118, splits=dict(train=dict(
                               pairs=378866, english_strings=19043))),
                   lm=dict(words=dict(train=3238733), vocab_size=10004)),
      tasks={t: dict(arms=arms_jit(t), bench=dict(command=f'bench {t}'),
                     bench_jit=dict(command=f'bench jit {t}'))
             for t in ('mt', 'lm')},
      runs=runs, command='python -m lingshard.experiments --only regime',
      mode='full', revision='abc1234', date='2026-11-26', seconds=60.0)


def test_the_section_answers_by_the_claim_rule_at_equal_wall_clock(tmp_path):
  lines, pngs = regime.Section(_Result(), str(tmp_path))
  page = '\n'.join(lines)
  assert ('**Answer: MoE beats its FLOP-matched dense twin on dev '
          'log-perplexity at equal wall-clock beyond the seed spread with TF '
          'graph step times, as the runs train: in Translation (M4 analogue); '
          'with XLA-compiled step times, as the demo trains: in neither task '
          '(undetermined between evaluations: Translation (M4 analogue)).**'
          ) in page
  # LM under --jit: dense better at step 50, level at 100: MoE does not win
  # on either side.
  assert ('(they agree on whether MoE is better): MoE at step 50: **dense is '
          'better**') in page
  # MT at equal wall-clock: MoE at its step 80 against dense at 100.
  assert ('- dev log-pplx at equal wall-clock: **MoE is better** (MoE 3.400 '
          'vs dense 3.500; |Δ| 0.100 > seed spread 0.020).') in page
  assert ('- chrF dev_unseen_en at equal wall-clock: **MoE is better** (MoE '
          '33.000 vs dense 30.000') in page
  # LM level: no claim; the reading's numbers are the section's own.
  assert ('- dev log-pplx at equal steps: no difference beyond the seed '
          'spread (MoE 5.500 vs dense 5.500') in page
  assert ('- Budget: 100 steps, ~0.0M target tokens seen per run, 0.00 '
          'epochs of the training words. MoE − dense dev log-pplx by step '
          '(mean over seeds): 50 +0.000, 100 +0.000. Change of dev log-pplx '
          'over the last evaluation interval, per 1,000 steps: dense '
          '-10.000, moe -10.000.') in page
  assert page.index('### Translation') < page.index('### Language model')
  assert [os.path.basename(p) for p in pngs] == [
      'regime_mt_curves.png', 'regime_lm_curves.png']
  assert all(os.path.getsize(p) > 0 for p in pngs)
  assert ('bench mt\nbench jit mt\nbench lm\nbench jit lm\n'
          '# regime_lm_dense_s1') in page
  # Under --jit MoE is read at step 50, its last evaluation within 53.
  assert ('- With the XLA-compiled step (`--jit`, as the demo trains) the '
          'MoE step takes ×1.900 the dense one, so MoE makes 53 steps in the '
          'dense arm\'s time for 100. Dev log-pplx at the MoE evaluations on '
          'either side of that budget (they disagree on whether MoE is better: '
          'undetermined): MoE at '
          'step 50: **dense is better** (MoE 3.800 vs dense 3.500; |Δ| 0.300 '
          '> seed spread 0.020). MoE at step 80: **MoE is better** (MoE 3.400 '
          'vs dense 3.500; |Δ| 0.100 > seed spread 0.020).') in page
  assert ('The runs took 18 minutes of training, evaluation and decoding in '
          'all') in page

  res = _Result()
  for seed in (1, 2, 3):  # MT MoE now level with dense at its stop 80.
    res['runs'][f'regime_mt_moe_s{seed}']['curve'][1]['log_pplx'] = 3.5
  page = '\n'.join(regime.Section(res, str(tmp_path))[0])
  assert ('**Answer: in neither task does MoE beat its FLOP-matched dense twin '
          'on dev log-perplexity at equal wall-clock beyond the seed spread, '
          'with TF graph step times, as the runs train or XLA-compiled step '
          'times, as the demo trains (') in page


def test_the_plan_trains_every_seed_of_both_arms_to_both_budgets(
    tmp_path, monkeypatch):
  mt, lm = tmp_path / 'mt', tmp_path / 'lm'
  for d in (mt, lm):
    d.mkdir()
  (mt / 'train.tsv').write_text('', encoding='utf-8')
  for split in runs_lib.DEV_SPLITS:
    (mt / f'{split}.tsv').write_text('a\tb\tc\n' * 8, encoding='utf-8')
  (mt / 'manifest.json').write_text(json.dumps(dict(
      english_strings=1, unique_pairs=1, languages=1, splits={})),
                                    encoding='utf-8')
  (lm / 'train.txt').write_text('', encoding='utf-8')
  (lm / 'dev.txt').write_text('w\n' * 8, encoding='utf-8')
  (lm / 'manifest.json').write_text(json.dumps(dict(vocab_size=5, splits={})),
                                    encoding='utf-8')
  benches = []

  def Bench(models, mode, data_dir, reps, batches):
    benches.append((models, mode, data_dir, reps, batches))
    moe = {(str(mt), 'graph'): 125.0, (str(lm), 'graph'): 90.0,
           (str(mt), 'jit'): 150.0, (str(lm), 'jit'): 120.0}[data_dir, mode]
    return dict(command=f'bench {mode}', ms_per_step={
        m.split('.')[-1]: moe if 'MoE' in m else 100.0 for m in models})

  monkeypatch.setattr(runs_lib.Runner, 'RunAll',
                      lambda self, runs: {r.name: (r, self) for r in runs})
  cfg = dict(regime_steps=100, regime_eval_every=50, regime_seeds=(1, 2),
             regime_dev_every=4, regime_mt_dir=str(mt),
             regime_lm_dir=str(lm), regime_bench_mode='graph',
             regime_bench_reps=5, regime_bench_batches=24)
  ctx = type('Ctx', (), dict(
      cfg=cfg, work_dir=str(tmp_path / 'w'), params_override='',
      out_dir=str(tmp_path / 'docs'), mode='full',
      bench=staticmethod(Bench), runner=runs_lib.Runner('x', 'y', 'z', 2)))
  res = regime.Regime(ctx)
  mt_models = ['m4.TinyMoELarge', 'm4.TinyDenseLarge']
  lm_models = ['lm1b.TinyMoELarge', 'lm1b.TinyLSTMLarge']
  assert benches == [(mt_models, 'graph', str(mt), 5, 24),
                     (mt_models, 'jit', str(mt), 5, 24),
                     (lm_models, 'graph', str(lm), 5, 24),
                     (lm_models, 'jit', str(lm), 5, 24)]
  moe = res['tasks']['mt']['arms']['moe']
  assert (moe['wall_steps'], moe['jit_wall_steps']) == (80, 67)
  moe = res['tasks']['lm']['arms']['moe']
  assert (moe['wall_steps'], moe['jit_wall_steps']) == (111, 83)
  # Recorded for this configuration: a rerun measures nothing again, so
  # its step budgets (and runs) stay those trained.
  os.makedirs(tmp_path / 'docs' / 'results')
  stored = dict(res, mode='full', runs={})
  with open(tmp_path / 'docs' / 'results' / 'regime.json', 'w',
            encoding='utf-8') as f:
    json.dump(stored, f)
  benches.clear()
  again = regime.Regime(ctx)
  assert benches == [] and again['tasks'] == res['tasks']
  ctx.mode = 'quick'  # Another configuration: measured afresh.
  regime.Regime(ctx)
  assert len(benches) == 4
  ctx.mode = 'full'
  assert sorted(res['runs']) == sorted(
      f'regime_{t}_{a}_s{s}' for t in ('mt', 'lm') for a in ('dense', 'moe')
      for s in (1, 2))
  run, runner = res['runs']['regime_mt_moe_s2']
  assert (run.model, run.seed, run.stops, run.decode, run.data) == (
      'm4.TinyMoELarge', 2, [80, 100], True, 'mt')
  assert runner.data_dir == str(mt) and runner.lm_data_dir == str(lm)
  assert runner.dev_dir == str(tmp_path / 'w' / 'regime' / 'dev_every_4')
  run, _ = res['runs']['regime_lm_moe_s1']
  assert (run.model, run.stops, run.decode, run.eval_file) == (
      'lm1b.TinyMoELarge', [100, 111], False,
      str(tmp_path / 'w' / 'regime' / 'lm_dev_every_4.txt'))
  assert res['runs']['regime_lm_dense_s1'][0].stops == [100]

  os.remove(lm / 'train.txt')
  with pytest.raises(SystemExit, match=r'regime: .*lm/train.txt is missing; '
                     'build the large corpora first: '):
    regime.Regime(ctx)


def test_the_experts_section_reads_training_fit_against_dev():
  names = [f'regime_{t}_{a}_s{s}' for t in ('mt', 'lm')
           for a in ('dense', 'moe') for s in (1, 2, 3)]
  # MT: MoE fits its training batches 0.1 lower, but is 0.05 worse on dev.
  fit = {n: (2.0 if '_moe_' in n else 2.1) + 0.01 * int(n[-1])
         for n in names}
  dev = {n: (3.25 if '_moe_' in n else 3.2) + 0.01 * int(n[-1])
         for n in names}
  layer = dict(gate='MoELayer', num_experts=2, k=2, real_tokens=4,
               dropped_choices=0, shares=[0.75, 0.25], lang=dict(
                   mi=0.811, chance=0.18, entropy=0.811))
  usage = {n: dict(command=f'python -m lingshard.tools.expert_usage # {n}',
                   table=f'table of {n}', layers={'enc/layer_001/moe': layer})
           for n in names if '_moe_' in n}
  res = dict(regime_revision='abc1234def', steps=5000, train_log_pplx=fit,
             dev_log_pplx=dev, usage=usage, command='c', mode='full',
             revision='r', date='d', seconds=60.0)
  page = '\n'.join(experts.Section(res, '.')[0])
  assert ('| translation | moe | 2.020 ± 0.010 | 3.270 ± 0.010 | 1.250 ± '
          '0.000 |') in page
  assert ('- translation: training log-pplx: **MoE is better** (MoE 2.020 vs '
          'dense 2.120; |Δ| 0.100 > seed spread 0.020).') in page
  assert ('| translation | `enc/layer_001/moe` | 2, top-2 | 4 | 0.811 ± 0.000 '
          '(chance 0.180 ± 0.000; H 0.81) | — | 75.0% | 3 |') in page
  assert '```\ntable of regime_mt_moe_s1\n```' in page
  assert 'python -m lingshard.tools.expert_usage # regime_lm_moe_s3' in page
