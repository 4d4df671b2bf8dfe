"""The capacity probe (issue 31): on a fixed small training set, at equal
matmul FLOPs per token, the MoE with more weights must reach a lower
training loss than its dense twin after the same steps.

The page's other sections ask whether MoE generalises better on a corpus
the Tiny models cannot exhaust in the budget; this one removes that
question: `m4.TinyMoE` (2.1M weights) and `m4.TinyDense` (1.3M, the same
forward matmul FLOPs per token) train on a fixed subset of the prepared
corpus's train.tsv for several epochs, and "training loss" is the eval
log-perplexity (per target token, no label smoothing) of the final weights
on that same subset. Extra parameters are what lets a model memorise a
training set (Shazeer et al. §1: "the capacity of a neural network to
absorb information is limited by its number of parameters"; conditional
computation adds parameters, not FLOPs per token), so the MoE must end
lower, on every seed (the
pass rule: the largest MoE value below the smallest dense one). The
layer-level version of this probe is
tests/layers/moe/test_capacity_probe.py.
"""

import os

import sentencepiece as spm

from lingshard import model_registry
from lingshard.data import corpus_io
from lingshard.data import vocab
from lingshard.experiments import page_parts as pp
from lingshard.experiments import plots
from lingshard.experiments import runs as runs_lib
from lingshard.tools import count_params

ARMS = (('dense', 'm4.TinyDense'), ('moe', 'm4.TinyMoE'))
# Languages sampled in proportion to their pairs (temperature 1, not the
# configs' 5): every pair of the subset is equally likely, so the training
# objective is the mean over the pairs that the eval measures.
OVERRIDES = 'input.temperature=1.0'
ROUTING_LABELS = (('cv_load', 'CV(load)'),
                  ('max_over_mean_load', 'max/mean load'),
                  ('over_capacity_first', 'dropped 1st (over capacity)'),
                  ('over_capacity_second', 'dropped 2nd (over capacity)'),
                  ('random_accept_rate', '2nd choice kept by the random '
                   'policy'),
                  ('aux_loss', 'aux loss (weighted)'))
TRAIN_SPLIT = 'train'


def _MaxLength(model_key):
  """The largest bucket bound of a config's training input: longer pairs
  are dropped in training (and truncated in eval)."""
  return model_registry.GetParams(
      model_key, 'Train').input.bucket_upper_bounds[-1]


def TrainSubset(data_dir, work_dir, rows):
  """A fixed training set: `rows` pairs of train.tsv, evenly spaced over
  the pairs the arms train on (source and target, with EOS / BOS, within
  the largest bucket: what MtInput keeps), so that the eval on it scores
  only what was trained; train.tsv is sorted by language, so every
  language keeps its share. Written to <work_dir>/probe_train_<rows>/
  train.tsv; returns (its path, its target tokens with EOS)."""
  sp = spm.SentencePieceProcessor(model_file=os.path.join(
      data_dir, vocab.VOCAB_DIR, vocab.SHARED_MODEL))
  pairs = corpus_io.ReadTsv(os.path.join(data_dir, f'{TRAIN_SPLIT}.tsv'))
  bound = min(_MaxLength(model) for _, model in ARMS)
  kept = [(r, len(t) + 1) for r, s, t in zip(
      pairs, sp.encode([r[1] for r in pairs]),
      sp.encode([r[2] for r in pairs])) if max(len(s), len(t)) + 1 <= bound]
  subset = kept[::max(1, len(kept) // rows)][:rows]
  out = os.path.join(work_dir, f'probe_train_{rows}')
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, f'{TRAIN_SPLIT}.tsv')
  corpus_io.WriteTsv(path, [r for r, _ in subset])
  return path, sum(n for _, n in subset)


def Probe(ctx):
  """Trains every arm on the subset for the step budget, seeds x arms,
  evaluating on the subset itself; returns the experiment's result."""
  cfg = ctx.cfg
  steps, seeds = cfg['probe_steps'], cfg['probe_seeds']
  subset, tokens = TrainSubset(ctx.data_dir, ctx.work_dir,
                               cfg['probe_rows'])
  runs = []
  for arm, model in ARMS:
    for seed in seeds:
      runs.append(runs_lib.TrainerRun(
          f'probe_{arm}_s{seed}', model, seed, [steps],
          runs_lib.SeedOverrides(seed, OVERRIDES),
          eval_every=cfg['probe_eval_every'], train_file=subset,
          eval_file=subset))
  return dict(steps=steps, seeds=list(seeds), rows=cfg['probe_rows'],
              subset=subset, subset_tgt_tokens=tokens, arms=dict(ARMS),
              overrides=OVERRIDES, runs=ctx.runner.RunAll(runs))


def Passes(moe, dense):
  """The probe's pass rule: every MoE value below every dense value (the
  highest MoE training loss below the lowest dense one). None (no
  verdict) with a value missing or fewer than 2 seeds on a side."""
  if None in moe + dense or min(len(moe), len(dense)) < 2:
    return None
  return max(moe) < min(dense)


def _Model(model_key):
  counts = count_params.CountModel(model_key)
  return counts.total, counts.flops_per_token


def Section(res, res_dir):
  """The page's section: (markdown lines, PNG paths)."""
  steps, arms = res['steps'], res['arms']
  runs = {a: pp.Runs(res, f'probe_{a}') for a in arms}
  final = {a: [pp.CurveAt(r, steps) for r in runs[a]] for a in arms}
  lines = ['## 7. Capacity probe: more weights fit a fixed training set '
           '(issue 31)', ''] + pp.Header(res)
  tokens = pp.MeanSd([r['tgt_tokens_per_step'] for a in arms
                      for r in runs[a]])[0]
  epochs = (f' (~{steps * tokens / res["subset_tgt_tokens"]:.1f} epochs of '
            f'its {res["subset_tgt_tokens"]:,} target tokens)' if tokens
            else '')
  lines += [f'{res["rows"]:,} pairs of `train.tsv` (evenly spaced over the '
            'pairs the configs train on, every language), the only training '
            f'data; each arm trains on it for {steps} steps{epochs} with the '
            'config\'s own settings but languages sampled in proportion to '
            f'their pairs (`{res["overrides"]}`: every pair equally likely), '
            f'seeds {res["seeds"]} (initialisation, routing randomness, data '
            'order). Training loss = the eval log-perplexity per target '
            'token (no label smoothing; MoE layers route as at inference) '
            'of the final weights on the same pairs. Pass rule: every MoE '
            'seed below every dense seed.', '']
  rows = []
  for a in arms:
    weights, flops = _Model(arms[a])
    per_seed = ', '.join('n/a' if v is None else f'{v:.3f}'
                         for v in final[a])
    rows.append([a, f'`{arms[a]}`', f'{weights / 1e6:.2f}M', f'{flops:,}',
                 per_seed, pp.Fmt(final[a], 3)])
  lines += pp.Table(['arm', 'config key', 'weights', 'matmul FLOPs / token',
                     f'training log-pplx @ {steps} per seed',
                     'mean ± sd'], rows)
  passes = Passes(final['moe'], final['dense'])
  if passes is None:
    verdict = 'The probe gives no verdict (a value missing or one seed).'
  else:
    verdict = (f'The probe **{"passes" if passes else "fails"}**: MoE max '
               f'{max(final["moe"]):.3f} {"<" if passes else ">="} dense min '
               f'{min(final["dense"]):.3f}.')
  lines += [f'- {verdict}',
            '- ' + pp.Verdict(final['moe'], final['dense'], False,
                              'TinyMoE', 'TinyDense',
                              'training log-pplx (the page\'s claim rule)'),
            '']
  moe_rows = [[label, pp.Fmt([r['routing'].get(k) for r in runs['moe']], 3)]
              for k, label in ROUTING_LABELS]
  lines += ['TinyMoE\'s routing on its training batches (mean over the last '
            'quarter of training and the MoE layers):', '']
  lines += pp.Table(['metric', 'mean ± sd'], moe_rows)
  png = plots.Curves(
      os.path.join(res_dir, 'probe_curves.png'),
      {arms[a]: [r['curve'] for r in runs[a]] for a in arms},
      'training-subset log-pplx vs steps, mean ± sd over seeds',
      ylabel='training-set log-perplexity')
  lines += [f'![probe curves](results/{os.path.basename(png)})', '']
  return lines + pp.Commands(res), [png]
