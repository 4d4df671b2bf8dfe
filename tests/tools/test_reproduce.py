"""The evidence page's rules (lingshard.experiments): claims only beyond the seed spread,
commands shown as they paste back into a shell, the capacity probe's pass
rule and training subset, the GPipe AmoebaNet section. (Its README command, a
quick capacity experiment, runs in tests/test_readme_reproduce.py.)"""

import json
import os
import shlex
import sys
import types

import pytest
import sentencepiece as spm

from lingshard import model_registry
from lingshard.data import corpus_io
from lingshard.experiments import benches
from lingshard.experiments import page as page_lib
from lingshard.experiments import page_parts
from lingshard.experiments import probe
from lingshard.experiments import reproduce
from lingshard.experiments import runs as runs_lib


def test_claims_only_beyond_the_seed_spread():
  page = page_parts
  assert 'no difference beyond the seed spread' in page.Verdict(
      [3.0, 3.2, 3.1], [3.15, 3.35, 3.25], False, 'moe', 'dense', 'x')
  better = page.Verdict([3.0, 3.02, 3.01], [3.2, 3.22, 3.21], False, 'moe',
                        'dense', 'x')
  assert '**moe is better**' in better
  assert '**dense is better**' in page.Verdict(
      [30.0, 30.1], [31.0, 31.1], True, 'moe', 'dense', 'chrF')
  assert 'one seed each: no claim' in page.Verdict([1.0], [2.0], False, 'a',
                                                   'b', 'x')
  # The readings branch on the same rule.
  assert page.Claim([3.0, 3.02, 3.01], [3.2, 3.22, 3.21], False) == 1
  assert page.Claim([3.0, 3.02, 3.01], [3.2, 3.22, 3.21], True) == -1
  assert page.Claim([3.0, 3.2, 3.1], [3.15, 3.35, 3.25], False) == 0
  assert page.Claim([1.0], [2.0], False) == 0


def test_shown_commands_paste_back_into_a_shell():
  runs = runs_lib
  argv = [sys.executable, '-m', 'lingshard.trainer', '--model=m4.TinyMoE',
          "--params_override=input.file_pattern='d/train.tsv';a.b=1",
          '--x=has "double" quotes', 'plain']
  shown = runs.Shown(argv)
  assert shown.startswith('python -m lingshard.trainer --model=m4.TinyMoE '
                          '--params_override="input.file_pattern=')
  assert shlex.split(shown)[1:] == argv[1:]


def test_a_recorded_run_is_reused_only_when_its_spec_matches(tmp_path):
  runs = runs_lib
  run = runs.TrainerRun('cc_E8_s1', 'm4.TinyMoE', 1, [10], 'input.seed=1001')
  stored = dict(name=run.name, spec=run.Spec(), spec_hash=run.SpecHash(),
                curve=[],
                reused_from='conditional experiment at revision abc1234')
  # `python` that fails: any attempt to train raises.
  runner = runs.Runner(str(tmp_path), 'data', 'lm', workers=1,
                       python='/bin/false', stored={run.name: stored})
  assert runner.RunAll([run], printer=lambda *a, **k: None) == {
      run.name: stored}
  # Written into the work dir: reused from there next time.
  assert (tmp_path / run.name / 'result.json').exists()
  changed = runs.TrainerRun('cc_E8_s2', 'm4.TinyMoE', 2, [10],
                            'input.seed=1002')
  runner = runs.Runner(str(tmp_path / 'b'), 'data', 'lm', workers=1,
                       python='/bin/false',
                       stored={changed.name: dict(stored, name=changed.name)})
  # A different spec: the trainer really runs (and fails here).
  with pytest.raises(RuntimeError) as e:
    runner.RunAll([changed], printer=lambda *a, **k: None)
  assert str(e.value).startswith('run cc_E8_s2: exit 1 of python -m '
                                 'lingshard.trainer --model=m4.TinyMoE')


def test_extra_trainer_flags_reach_the_train_commands_and_the_spec():
  runs = runs_lib
  plain = runs.TrainerRun('a', 'm4.TinyMoE', 1, [10])
  assert 'flags' not in plain.Spec()  # Recorded runs' hashes stay valid.
  warm = runs.TrainerRun('b', 'm4.TinyMoEUpcycled', 1, [10],
                         flags=['--init_from_checkpoint=logs/d/train/ckpt-5'])
  assert warm.Spec()['flags'] == ['--init_from_checkpoint=logs/d/train/ckpt-5']
  assert warm.SpecHash() != runs.TrainerRun('b', 'm4.TinyMoEUpcycled', 1,
                                            [10]).SpecHash()
  runner = runs.Runner('w', 'data', 'lm')
  (kind, stop, argv), = runner.Commands(warm)
  assert (kind, stop) == ('train', 10)
  assert argv[-1] == '--init_from_checkpoint=logs/d/train/ckpt-5'


def test_the_probe_passes_only_when_every_moe_seed_is_below_every_dense():
  assert probe.Passes([1.00, 1.02, 1.04], [1.05, 1.10, 1.20]) is True
  # Means far apart, but one MoE seed above one dense seed: not beyond
  # the spread.
  assert probe.Passes([0.90, 0.91, 1.06], [1.05, 1.10, 1.20]) is False
  assert probe.Passes([1.0], [2.0]) is None  # One seed: no verdict.
  assert probe.Passes([1.0, None], [2.0, 2.1]) is None


def test_a_probe_run_trains_and_evaluates_on_its_subset():
  runs = runs_lib
  plain = runs.TrainerRun('a', 'm4.TinyMoE', 1, [10])
  # Recorded runs' hashes stay valid.
  assert not {'train_file', 'eval_file'} & set(plain.Spec())
  sub = 'w/probe_train_8/train.tsv'
  run = runs.TrainerRun('probe_moe_s1', 'm4.TinyMoE', 1, [10],
                        runs.SeedOverrides(1, probe.OVERRIDES), train_file=sub,
                        eval_file=sub)
  assert (run.Spec()['train_file'], run.Spec()['eval_file']) == (sub, sub)
  runner = runs.Runner('w', 'data', 'lm', mt_overrides='input.x=1')
  (kind, _, argv), = runner.Commands(run)
  assert kind == 'train'
  train = next(a for a in argv if a.startswith('--params_override='))
  assert train.startswith(f"--params_override=input.file_pattern='{sub}';"
                          "input.src_vocab='data/vocab/spm_shared.model';")
  assert train.endswith(';input.seed=1001;input.temperature=1.0')
  assert 'input.x=1' in train
  assert argv[-1] == f"--eval_params_override=input.file_pattern='{sub}'"


def test_the_probe_subset_spreads_over_the_pairs_training_keeps(
    prepared_dir, tmp_path):
  path, tokens = probe.TrainSubset(prepared_dir, str(tmp_path), 40)
  assert path == str(tmp_path / 'probe_train_40' / 'train.tsv')
  pairs = corpus_io.ReadTsv(os.path.join(prepared_dir, 'train.tsv'))
  sub = corpus_io.ReadTsv(path)
  assert len(sub) == 40 and set(sub) <= set(pairs)
  # Evenly spaced over the file (sorted by language): many languages.
  assert len({r[0] for r in sub}) > len({r[0] for r in pairs}) // 2
  sp = spm.SentencePieceProcessor(model_file=os.path.join(
      prepared_dir, 'vocab', 'spm_shared.model'))
  bound = model_registry.GetParams(
      'm4.TinyMoE', 'Train').input.bucket_upper_bounds[-1]
  assert all(len(sp.encode(r[1])) + 1 <= bound and
             len(sp.encode(r[2])) + 1 <= bound for r in sub)
  assert tokens == sum(len(sp.encode(r[2])) + 1 for r in sub)


def test_benchmark_scripts_run_from_any_working_directory(tmp_path,
                                                          monkeypatch):
  """The experiments find scripts/bench_*.py in their checkout, not in the
  working directory; the command is shown as run from the repository."""
  monkeypatch.chdir(tmp_path)
  ctx = types.SimpleNamespace(work_dir=str(tmp_path / 'work'))
  shown, out = benches.RunScript(ctx, ['scripts/bench_step.py', '--help'],
                                 'help.log')
  assert shown == 'python scripts/bench_step.py --help'
  assert out.startswith('usage: bench_step.py')
  with open(tmp_path / 'work' / 'help.log', encoding='utf-8') as f:
    assert f.read().startswith('usage: bench_step.py')


# bench_gpipe.py --body=amoebanet's CSVs and skip line from a run with the
# quick args (tables shortened to the rows the test reads).
_AMOEBA_CSVS = {
    'gpipe_amoebanet_table1.csv': (
        'row,stages,micro_batches,schedule,remat,layers,filters,params,'
        'device_mib,next_filters,next_device_mib,probes\n'
        'naive-1,1,1,fill-drain,no,2,8,1296,0.372,16,1.81,2\n'
        'Pipeline-2,2,2,fill-drain,yes,2,16,5088,0.700,24,1.05,3\n'),
    'gpipe_amoebanet_table2.csv': (
        'stages,micro_batches,schedule,iterations,bubble,seconds,'
        'examples_per_s,normalized,ideal_normalized,device_mib\n'
        '2,1,fill-drain,2,0.5,0.0435,91.98,1.0,1.0,0.724\n'
        '2,2,circular R=2,5,0.2,0.0531,75.31,0.8187,1.6,0.432\n')}
_AMOEBA_SKIP = ('table 2 K=2 M=1 circular R=2: skipped (cells: the circular '
                'schedule needs at least num_stages 2 micro-batches (a '
                'micro-batch re-enters stage 0 after leaving the last), got 1)')


def test_the_gpipe_image_experiment_renders_both_tables(tmp_path,
                                                        monkeypatch):
  """The gpipe_image experiment runs bench_gpipe.py --body=amoebanet with
  the mode's args (the script faked: it writes its two CSVs) and the page
  shows both tables, the schedules' bubbles and the skipped (K, M, R)."""
  ran = []

  def FakeRunScript(ctx, argv, log_name):
    ran.append((argv, log_name))
    out_dir = next(a.split('=', 1)[1] for a in argv
                   if a.startswith('--out_dir='))
    os.makedirs(out_dir)
    for name, text in _AMOEBA_CSVS.items():
      with open(os.path.join(out_dir, name), 'w', encoding='utf-8') as f:
        f.write(text)
    return 'python ' + ' '.join(argv), (
        f'# {_AMOEBA_SKIP}\n# other\n\nTable 2 analogue: normalised '
        'throughput of AmoebaNet-D(4, 8) cells\nstages ...\n')

  monkeypatch.setattr(benches, 'RunScript', FakeRunScript)
  cfg = reproduce.CONFIGS['quick']
  ctx = types.SimpleNamespace(work_dir=str(tmp_path / 'work'), cfg=cfg)
  result = benches.GpipeImage(ctx)
  ((argv, log_name),) = ran
  assert argv == ['scripts/bench_gpipe.py', '--body=amoebanet',
                  f'--out_dir={tmp_path / "work" / "gpipe_image"}',
                  *cfg['gpipe_image_args']]
  assert '--amoeba_t2_schedules=fill-drain,circular-2' in argv
  assert log_name == 'bench_gpipe_image.log'
  assert result['table2']['rows'][1][:5] == ['2', '2', 'circular R=2', '5',
                                             '0.2']
  assert result['skipped'] == [_AMOEBA_SKIP]
  # The full mode runs the script's defaults, the README's command.
  assert reproduce.CONFIGS['full']['gpipe_image_args'] == ()
  result.update(experiment='gpipe_image', revision='abc1234', mode='quick',
                date='2026-11-28', seconds=360.0,
                command='python -m lingshard.experiments --quick')
  res_dir = tmp_path / 'docs' / 'results'
  os.makedirs(res_dir)
  with open(res_dir / 'gpipe_image.json', 'w', encoding='utf-8') as f:
    json.dump(result, f)
  page_lib.Write(str(tmp_path / 'docs'), 'data')
  with open(tmp_path / 'docs' / 'RESULTS.md', encoding='utf-8') as f:
    page = f.read()
  assert '## 6a′. GPipe Tables 1 and 2 for AmoebaNet-D cells' in page
  assert '| Pipeline-2 | 2 | 2 | fill-drain | yes | 2 | 16 | 5,088 |' in page
  assert ('Table 2 analogue: normalised throughput of AmoebaNet-D(4, 8) '
          'cells.\n\n| stages |') in page  # The script's title.
  assert '| 2 | 2 | circular R=2 | 5 | 0.2 | 0.0531 |' in page
  assert 'Table 1 analogue.\n\n| row |' in page  # No title printed.
  assert '(K − 1)/(R·M + K − 1)' in page
  assert f'- {_AMOEBA_SKIP}' in page
  assert 'python scripts/bench_gpipe.py --body=amoebanet' in page
  assert 'gpipe_image 6.0' in page  # The section's minutes in the header.
