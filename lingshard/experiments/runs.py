"""Training runs of the evidence page (lingshard/experiments): the trainer
binary as subprocesses, two at a time, and what they measured.

A `TrainerRun` is one model key + seed + params overrides trained with
`python -m lingshard.trainer --mode=train_and_eval` to one or more step
counts (`stops`; later stops resume the same logdir exactly), optionally
decoding the dev splits greedily at every stop. Every command is recorded
with the run's results; a finished run whose spec is unchanged is not
re-run (`result.json` in its directory), so `--only NAME` and an
interrupted reproduction reuse what is done.

Runs share the machine's two cores: each trainer gets one intra-op and
one inter-op thread and two run at once (1.3x the throughput of one
two-thread run on the Tiny models, measured). Wall-clock comparisons on
the page therefore never use these runs' own timings: step times come from
scripts/bench_step.py, interleaved, with the machine to itself.
"""

import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np

DEV_SPLITS = ('dev_unseen_en', 'dev_seen_en')
# Suffixes of the MoE layers' routing metrics (lingshard/layers/
# routing_metrics.py) read back from the training summaries.
ROUTING_KEYS = ('cv_importance', 'cv_load', 'max_over_mean_load',
                'over_capacity_first', 'over_capacity_second',
                'frac_dispatched_0', 'aux_loss', 'random_accept_rate')


def Shown(argv):
  """A command line to paste into a shell: `python ...`, values with
  quotes shown as --flag="value"."""
  out = ['python']
  for a in argv[1:]:
    if re.fullmatch(r'[\w@%+=:,./-]+', a):
      out.append(a)
    elif not re.search(r'["$`\\]', a):
      flag, eq, value = a.partition('=')
      out.append(f'{flag}="{value}"' if eq and flag.startswith('--') else
                 f'"{a}"')
    else:
      out.append(shlex.quote(a))
  return ' '.join(out)


def SeedOverrides(seed, extra=''):
  """A run's params overrides for `seed` (then `extra`): the seed varies
  initialisation and routing randomness (--seed) and the data order
  (input.seed)."""
  return ';'.join(o for o in (f'input.seed={1000 + seed}', extra) if o)


# Equal wall-clock step budgets within this share of the step budget count
# as it (one stop, one evaluation).
WALL_TOLERANCE = 0.03


def WallSteps(steps, ms_arm, ms_dense):
  """The steps an arm takes in the dense arm's time for `steps` steps, at
  the measured step times (the step budget itself within WALL_TOLERANCE)."""
  wall = max(1, round(steps * ms_dense / ms_arm))
  return steps if abs(wall - steps) <= WALL_TOLERANCE * steps else wall


# One TF intra-op and one inter-op thread: for processes that share the
# cores with as many others (here two runs at once on two cores; the test
# suite's xdist workers, tests/conftest.py).
ONE_THREAD_ENV = {'TF_NUM_INTRAOP_THREADS': '1', 'TF_NUM_INTEROP_THREADS': '1'}


def RunEnv():
  """The environment of a trainer subprocess: ONE_THREAD_ENV (two run at
  once on the two cores), quiet TF logging."""
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', **ONE_THREAD_ENV)


def EveryNth(src, dst, every):
  """Writes every `every`-th line of file `src` to `dst`; returns dst."""
  with open(src, encoding='utf-8') as f:
    rows = f.readlines()
  with open(dst, 'w', encoding='utf-8') as f:
    f.writelines(rows[::every])
  return dst


def DevSubset(data_dir, work_dir, every):
  """A directory with every `every`-th row of the dev splits (quick mode:
  cheap evaluation and decoding); returns its path."""
  out = os.path.join(work_dir, f'dev_every_{every}')
  os.makedirs(out, exist_ok=True)
  for split in DEV_SPLITS:
    EveryNth(os.path.join(data_dir, f'{split}.tsv'),
             os.path.join(out, f'{split}.tsv'), every)
  return out


class TrainerRun:
  """One training run (see module docstring)."""

  def __init__(self, name, model, seed, stops, overrides='', decode=False,
               eval_every=0, data='mt', flags=(), train_file=None,
               eval_file=None):
    self.name, self.model, self.seed = name, model, int(seed)
    self.flags = tuple(flags)  # Further trainer flags of the train commands.
    # Files read instead of the corpus's training and dev split (e.g. the
    # capacity probe's fixed training subset, evaluated on itself; an LM
    # run's dev subset). train_file: translation runs only.
    self.train_file, self.eval_file = train_file, eval_file
    self.stops = sorted({int(s) for s in stops})
    self.overrides, self.decode = overrides, decode
    self.eval_every = int(eval_every) or self.stops[-1]
    self.data = data  # 'mt' (data_dir) or 'lm' (lm_data_dir)

  def Spec(self):
    spec = dict(model=self.model, seed=self.seed, stops=self.stops,
                overrides=self.overrides, decode=self.decode,
                eval_every=self.eval_every, data=self.data)
    # Only when set: earlier runs' recorded hashes stay valid.
    for key in ('flags', 'train_file', 'eval_file'):
      value = getattr(self, key)
      if value:
        spec[key] = list(value) if key == 'flags' else value
    return spec

  def SpecHash(self):
    """The key a finished run's result.json is reused under."""
    return hashlib.sha256(json.dumps(self.Spec(), sort_keys=True).encode()
                          ).hexdigest()


class Runner:
  """Executes Runs under `work_dir` with `workers` at a time."""

  def __init__(self, work_dir, data_dir, lm_data_dir, workers=2,
               python=sys.executable, dev_dir=None, mt_overrides='',
               stored=None):
    self.work_dir, self.data_dir = work_dir, data_dir
    # {run name: result} recorded by earlier experiments (docs/results):
    # reused when the spec matches and work_dir no longer has the run.
    self.stored = stored or {}
    self.dev_dir = dev_dir or data_dir  # The dev split files read.
    self.mt_overrides = mt_overrides  # Appended to every translation run's.
    self.lm_data_dir, self.workers, self.python = lm_data_dir, workers, python

  def _DataOverrides(self, run):
    """(train overrides, eval overrides) pointing at the corpus."""
    if run.data == 'lm':
      d = self.lm_data_dir
      return (f"input.file_pattern='{d}/train.txt';"
              f"input.vocab='{d}/vocab.txt'",
              f"input.file_pattern='{run.eval_file or f'{d}/dev.txt'}'")
    d, v = self.data_dir, os.path.join(self.data_dir, 'vocab',
                                       'spm_shared.model')
    train_file = run.train_file or f'{d}/train.tsv'
    eval_file = run.eval_file or f'{self.dev_dir}/{DEV_SPLITS[0]}.tsv'
    train = ';'.join(o for o in (
        f"input.file_pattern='{train_file}';input.src_vocab='{v}';"
        f"input.tgt_vocab='{v}'", self.mt_overrides) if o)
    return train, f"input.file_pattern='{eval_file}'"

  def Commands(self, run):
    """[(kind, step, argv)]: the run's trainer invocations in order."""
    logdir = os.path.join(self.work_dir, run.name)
    data_ov, eval_ov = self._DataOverrides(run)
    train_ov = ';'.join(o for o in (
        data_ov, f'task.train.eval_interval_steps={run.eval_every}',
        'task.train.save_interval_steps=0',
        'task.train.summary_interval_steps=20',
        'task.train.log_interval_steps=100', run.overrides) if o)
    base = [self.python, '-m', 'lingshard.trainer', f'--model={run.model}',
            f'--logdir={logdir}']
    cmds = []
    for stop in run.stops:
      cmds.append(('train', stop, base + [
          '--mode=train_and_eval', '--nojit', f'--seed={run.seed}',
          f'--max_steps={stop}', f'--params_override={train_ov}',
          f'--eval_params_override={eval_ov}', *run.flags]))
      if run.decode:
        dec_ov = ';'.join(o for o in (data_ov, 'task.decode.beam_size=1',
                                      run.overrides) if o)
        for split in DEV_SPLITS:
          cmds.append(('decode', stop, base + [
              '--mode=decode', f'--seed={run.seed}',
              f'--params_override={dec_ov}',
              f"--eval_params_override=input.file_pattern="
              f"'{self.dev_dir}/{split}.tsv'"]))
    return cmds

  def _Execute(self, run):
    logdir = os.path.join(self.work_dir, run.name)
    done = os.path.join(logdir, 'result.json')
    spec, key = run.Spec(), run.SpecHash()
    if os.path.exists(done):
      with open(done, encoding='utf-8') as f:
        result = json.load(f)
      if result.get('spec_hash') == key:
        return result
    stored = self.stored.get(run.name)
    if stored and stored.get('spec_hash') == key:
      os.makedirs(logdir, exist_ok=True)
      with open(done, 'w', encoding='utf-8') as f:
        json.dump(stored, f, indent=1, sort_keys=True)
      return stored
    if os.path.exists(logdir):
      shutil.rmtree(logdir)  # This script's own run directory, stale spec.
    os.makedirs(logdir)
    env = RunEnv()
    commands, seconds = [], []
    with open(logdir + '.log', 'w', encoding='utf-8') as log:
      for kind, stop, argv in self.Commands(run):
        shown = Shown(argv)
        commands.append(shown)
        t0 = time.time()
        log.write(f'$ {shown}\n')
        log.flush()
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT,
                              env=env, check=False)
        if proc.returncode:
          raise RuntimeError(f'run {run.name}: exit {proc.returncode} of '
                             f'{shown} (log: {logdir}.log)')
        seconds.append(round(time.time() - t0, 1))
        if kind == 'decode':
          split = argv[-1].rsplit('/', 1)[-1].split('.')[0]
          shutil.copy(os.path.join(logdir, f'decode_{split}', 'scores.json'),
                      os.path.join(logdir, f'scores-{split}-{stop}.json'))
    result = dict(name=run.name, spec=spec, spec_hash=key, commands=commands,
                  command_seconds=seconds, **Collect(logdir, run))
    with open(done, 'w', encoding='utf-8') as f:
      json.dump(result, f, indent=1, sort_keys=True)
    return result

  def RunAll(self, runs, printer=print):
    """{name: result} of every run (duplicates by name run once)."""
    unique = {}
    for run in runs:
      if run.name in unique and unique[run.name].Spec() != run.Spec():
        raise ValueError(f'two different runs named {run.name}')
      unique[run.name] = run
    results = {}
    with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
      futures = {pool.submit(self._Execute, r): name
                 for name, r in unique.items()}
      for fut in concurrent.futures.as_completed(futures):
        results[futures[fut]] = fut.result()
        printer(f'  run {futures[fut]} done', flush=True)
    return results


def Events(train_dir):
  """{tag: [(step, float)]} of the scalar summaries in `train_dir`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  for path in sorted(glob.glob(os.path.join(train_dir, 'events.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        arr = tf.make_ndarray(v.tensor) if v.HasField('tensor') else None
        if arr is not None and arr.size == 1 and arr.dtype.kind == 'f':
          out.setdefault(v.tag, []).append((event.step, float(arr)))
  return out


def Collect(logdir, run):
  """The run's measurements: dev eval curve, decode scores per stop, train
  routing metrics (mean over the last quarter of training, averaged over
  MoE layers), target tokens per step."""
  curve = []
  for path in sorted(glob.glob(os.path.join(logdir, 'eval_dev',
                                            'metrics-*.json'))):
    with open(path, encoding='utf-8') as f:
      r = json.load(f)
    curve.append(dict(step=r['step'], **{
        k: r['metrics'][k] for k in ('log_pplx', 'loss') if k in r['metrics']}))
  scores = {}
  for split in DEV_SPLITS:
    for stop in run.stops:
      path = os.path.join(logdir, f'scores-{split}-{stop}.json')
      if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
          s = json.load(f)
        scores.setdefault(split, {})[str(stop)] = dict(
            average=s['average'], languages={
                lang: dict(chrf=v['chrf'], bleu=v['bleu'], n=v['n'])
                for lang, v in s['languages'].items()})
  events = Events(os.path.join(logdir, 'train'))
  last = run.stops[-1]
  routing = {}
  for key in ROUTING_KEYS:
    series = [v for tag, vals in events.items()
              if tag.endswith('_' + key) and tag != key
              for s, v in vals if s > 0.75 * last]
    if series:
      routing[key] = float(np.mean(series))
  tokens = [v for _, v in events.get('num_tgt_tokens', [])] or [
      v for _, v in events.get('num_tokens', [])]
  return dict(curve=curve, scores=scores, routing=routing,
              tgt_tokens_per_step=float(np.mean(tokens)) if tokens else None)
