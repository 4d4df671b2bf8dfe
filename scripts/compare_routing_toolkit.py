"""Issue 30's comparisons on the prepared corpus, printed as tables.

  .venv/bin/python scripts/compare_routing_toolkit.py [--only balance,upcycle]

balance   auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2) vs GShard's aux
          loss: m4.TinyMoE with group_aux 0.01 (its default) against
          group_aux 0 + selection_bias_rate, and group_aux 0 alone (no
          balancing), `--steps` steps, every seed: dev log-perplexity and the
          MoE layers' max/mean load and CV(load) over the last quarter.
          `--arms aux,bias` skips the unbalanced arm; the README's
          one-bucket row: --params_override='input.bucket_upper_bounds=
          [64];input.bucket_batch_limits=[64]' (batches of one shape).
upcycle   sparse upcycling (Komatsuzaki et al. 2023): a dense twin with the
          experts' hidden (m4.TinyDense, task.hidden_dim=256) trained
          `--steps`/2 steps, then m4.TinyMoEUpcycled from its checkpoint for
          `--steps`/2 more, against the dense run continued and m4.TinyMoE
          from scratch (the balance experiment's aux arm): dev
          log-perplexity curves at equal training steps.

Runs are the trainer binary (lingshard/experiments/runs.py: two at a time,
one thread each; finished runs are reused from --work_dir).
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import argparse
import os

import numpy as np

from lingshard.experiments import runs as runs_lib

DENSE_H256 = 'task.hidden_dim=256'


def _Args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--only', default='balance,upcycle')
  ap.add_argument('--data_dir', default='data/ui_m4')
  ap.add_argument('--work_dir', default='logs/toolkit')
  ap.add_argument('--seeds', default='1,2,3')
  ap.add_argument('--steps', type=int, default=1000)
  ap.add_argument('--rate', type=float, default=0.001,
                  help='selection_bias_rate of the aux-loss-free arm.')
  ap.add_argument('--arms', default='aux,bias,none',
                  help='Arms of the balance experiment (aux: group_aux 0.01; '
                  'bias: group_aux 0 + --rate; none: group_aux 0).')
  ap.add_argument('--workers', type=int, default=2)
  ap.add_argument('--params_override', default='',
                  help='Appended to every run\'s overrides (e.g. one '
                  'bucket: input.bucket_upper_bounds=[64];'
                  'input.bucket_batch_limits=[16]).')
  args = ap.parse_args()
  for flag, known in (('only', ('balance', 'upcycle')),
                      ('arms', ('aux', 'bias', 'none'))):
    names = getattr(args, flag).split(',')
    bad = [n for n in names if n not in known]
    if bad:
      ap.error(f'--{flag}: unknown {", ".join(bad)}; choose from '
               f'{", ".join(known)}')
    setattr(args, flag, names)
  return args


def _Curve(result):
  return {c['step']: c['log_pplx'] for c in result['curve']}


def _Row(name, values, fmt='{:.3f}'):
  v = np.asarray(values, float)
  cells = ', '.join(fmt.format(x) for x in v)
  return (f'{name:<22} mean {fmt.format(v.mean())}  spread '
          f'{fmt.format(v.max() - v.min())}  ({cells})')


def SummedLoadBalance(logdir, steps):
  """max/mean over experts of each MoE layer's load summed over the
  summaries of the last quarter of training, averaged over layers: the
  long-run balance (the per-step max/mean of the table is a mean of
  per-batch ratios)."""
  events = runs_lib.Events(os.path.join(logdir, 'train'))
  layers = {}
  for tag, values in events.items():
    layer, sep, expert = tag.rpartition('_load/')
    if sep and expert.isdigit():
      layers.setdefault(layer, {})[int(expert)] = sum(
          v for s, v in values if s > 0.75 * steps)
  ratios = [max(e.values()) / np.mean(list(e.values()))
            for e in layers.values()]
  return float(np.mean(ratios))


def Balance(runner, seeds, steps, rate, eval_every, names):
  all_arms = {
      'aux': ('aux0.01', ''),
      'bias': (f'bias{rate:g}', ('task.moe_tpl.aux_loss_weights.group_aux=0.0;'
                                 f'task.moe_tpl.selection_bias_rate={rate}')),
      'none': ('none', 'task.moe_tpl.aux_loss_weights.group_aux=0.0'),
  }
  arms = dict(all_arms[n] for n in names)
  runs = [runs_lib.TrainerRun(f'{arm}-s{s}', 'm4.TinyMoE', s, [steps], ov,
                              eval_every=eval_every)
          for arm, ov in arms.items() for s in seeds]
  results = runner.RunAll(runs)
  print(f'\nbalance: m4.TinyMoE, {steps} steps, seeds {seeds}')
  for arm in arms:
    rs = [results[f'{arm}-s{s}'] for s in seeds]
    print(_Row(f'{arm} dev log_pplx', [_Curve(r)[steps] for r in rs]))
    for key in ('max_over_mean_load', 'cv_load', 'over_capacity_first'):
      print(_Row(f'  {key}', [r['routing'][key] for r in rs]))
    print(_Row('  summed-load max/mean', [SummedLoadBalance(
        os.path.join(runner.work_dir, f'{arm}-s{s}'), steps) for s in seeds]))
  return results


def Upcycle(runner, seeds, steps, eval_every, work_dir):
  half = steps // 2
  dense = [runs_lib.TrainerRun(f'dense256-s{s}', 'm4.TinyDense', s,
                               [half, steps], DENSE_H256,
                               eval_every=eval_every) for s in seeds]
  runner.RunAll(dense)
  up = [runs_lib.TrainerRun(
      f'upcycled-s{s}', 'm4.TinyMoEUpcycled', s, [half], '',
      eval_every=eval_every, flags=[
          '--init_from_checkpoint=' + os.path.join(
              work_dir, f'dense256-s{s}', 'train', f'ckpt-{half}')])
        for s in seeds]
  scratch = [runs_lib.TrainerRun(f'aux0.01-s{s}', 'm4.TinyMoE', s, [steps],
                                 '', eval_every=eval_every) for s in seeds]
  results = runner.RunAll(dense + up + scratch)
  print(f'\nupcycle: dev log_pplx at training step (dense {half} steps, '
        f'then {half} more as each arm)')
  for step in range(eval_every, steps + 1, eval_every):
    print(f'step {step}')
    print(_Row('  TinyDense H256', [_Curve(results[f'dense256-s{s}'])[step]
                                     for s in seeds]))
    if step > half:
      print(_Row('  upcycled from it', [
          _Curve(results[f'upcycled-s{s}'])[step - half] for s in seeds]))
    print(_Row('  TinyMoE scratch', [_Curve(results[f'aux0.01-s{s}'])[step]
                                      for s in seeds]))
  return results


def main():
  args = _Args()
  seeds = [int(s) for s in args.seeds.split(',')]
  runner = runs_lib.Runner(args.work_dir, args.data_dir, None,
                           workers=args.workers,
                           mt_overrides=args.params_override)
  eval_every = max(1, args.steps // 4)
  if 'balance' in args.only:
    Balance(runner, seeds, args.steps, args.rate, eval_every, args.arms)
  if 'upcycle' in args.only:
    Upcycle(runner, seeds, args.steps, eval_every, args.work_dir)


if __name__ == '__main__':
  main()
