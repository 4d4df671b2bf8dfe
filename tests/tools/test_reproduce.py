"""The evidence page's rules (lingshard.experiments): claims only beyond the seed spread,
commands shown as they paste back into a shell. (Its README command, a
quick capacity experiment, runs in tests/test_readme_reproduce.py.)"""

import shlex
import sys

import pytest

from lingshard.experiments import page_parts
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
  run = runs.Run('cc_E8_s1', 'm4.TinyMoE', 1, [10], 'input.seed=1001')
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
  changed = runs.Run('cc_E8_s2', 'm4.TinyMoE', 2, [10], 'input.seed=1002')
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
  plain = runs.Run('a', 'm4.TinyMoE', 1, [10])
  assert 'flags' not in plain.Spec()  # Recorded runs' hashes stay valid.
  warm = runs.Run('b', 'm4.TinyMoEUpcycled', 1, [10],
                  flags=['--init_from_checkpoint=logs/d/train/ckpt-5'])
  assert warm.Spec()['flags'] == ['--init_from_checkpoint=logs/d/train/ckpt-5']
  assert warm.SpecHash() != runs.Run('b', 'm4.TinyMoEUpcycled', 1,
                                     [10]).SpecHash()
  runner = runs.Runner('w', 'data', 'lm')
  (kind, stop, argv), = runner.Commands(warm)
  assert (kind, stop) == ('train', 10)
  assert argv[-1] == '--init_from_checkpoint=logs/d/train/ckpt-5'
