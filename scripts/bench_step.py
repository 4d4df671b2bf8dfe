"""Benchmark: the whole training step of m4.TinyMoE vs m4.TinyDense.

  .venv/bin/python scripts/bench_step.py [--modes graph jit] [--reps 5]
      [--profile_dir=/tmp/step_profile]

Both models have the same matmul FLOPs per token (m4.py: TINY_DENSE_HIDDEN),
so the MoE/dense ratio of step times is the price of conditional
computation: gating, dispatch/combine, routing metrics and the larger
expert weights in the optimizer. Each variant is a real `train_loop.Trainer`
(the trainer binary's own step: variables, optimizer, the finiteness guard,
the per-step host read of [is_finite, examples, tokens]) on the same
`--batches` real batches of the prepared corpus (every length bucket), so
what is timed is what `python -m lingshard.trainer --mode=train` runs per
step. Timing is interleaved: each repetition runs every variant over all
batches, in rotation, after a warm-up pass that compiles every bucket; the
ratio is the median over repetitions of (moe time / dense time).

Reports ms per step, target tokens/s and the ratio per mode (graph: TF
graph execution; jit: the step XLA-compiled, as `--jit` and the demo).
With --profile_dir, traces a few MoE steps per mode with the TF profiler
and prints the top ops by self time (host events of the trace).
"""

import argparse
import collections
import glob
import os
import tempfile
import time

import numpy as np

LM_TRAIN = 'train.txt'  # lm_prepare's training split (prepare: train.tsv).


def _Args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--models', nargs='+',
                  default=['m4.TinyMoE', 'm4.TinyDense'],
                  help='First = the numerator of the ratio, last = the '
                  'denominator.')
  ap.add_argument('--modes', nargs='+', default=['graph', 'jit'])
  ap.add_argument('--data_dir', default='data/ui_m4',
                  help='A prepare corpus (translation models) or an '
                  'lm_prepare corpus (language models, with train.txt).')
  ap.add_argument('--batches', type=int, default=12,
                  help='Real batches per timed pass (all buckets occur).')
  ap.add_argument('--reps', type=int, default=5)
  ap.add_argument('--params_override', default='',
                  help='Extra overrides for every model (e.g. '
                  'task.moe_tpl.dispatch_impl=einsum).')
  ap.add_argument('--variant', action='append', default=[],
                  help='NAME=MODEL:OVERRIDES, an extra variant (repeatable), '
                  'e.g. einsum=m4.TinyMoE:task.moe_tpl.dispatch_impl=einsum')
  ap.add_argument('--profile_dir', default='')
  ap.add_argument('--profile_steps', type=int, default=20)
  ap.add_argument('--top', type=int, default=25)
  return ap.parse_args()


def _Params(model, data_dir, overrides):
  from lingshard import model_registry  # pylint: disable=g-import-not-at-top
  from lingshard.tools import demo  # pylint: disable=g-import-not-at-top
  from lingshard.train import overrides as overrides_lib  # pylint: disable=g-import-not-at-top
  p = model_registry.GetParams(model, 'Train')
  if os.path.exists(os.path.join(data_dir, LM_TRAIN)):
    # An lm_prepare corpus (language-model configs): words + vocab.txt.
    p.input.Set(file_pattern=os.path.join(data_dir, LM_TRAIN),
                vocab=os.path.join(data_dir, 'vocab.txt'))
  else:
    p.input.file_pattern = os.path.join(data_dir, 'train.tsv')
    for key, path in demo.VocabPaths(model, data_dir).items():
      p.input.Set(**{key: path})
  if overrides:
    overrides_lib.ApplyOverrides(p, overrides)
  return p


def _Trainer(p, jit, logdir):
  from lingshard.train import strategies  # pylint: disable=g-import-not-at-top
  from lingshard.train import train_loop  # pylint: disable=g-import-not-at-top
  from lingshard import platform  # pylint: disable=g-import-not-at-top
  info = strategies.StrategyInfo(
      kind='default', program=platform.ForStrategy('default', jit))
  return train_loop.Trainer(p, logdir, info=info, printer=lambda *a: None)


def _Batches(trainer, n):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingshard.train import strategies  # pylint: disable=g-import-not-at-top
  info = strategies.StrategyInfo(kind='default')
  ds = trainer.model.GetInput(strategies.InputContext(
      tf.distribute.get_strategy(), info)).GetDataset()
  return list(ds.take(n))


def _Pass(trainer, batches):
  """The training loop's per-step work over `batches`; returns seconds and
  non-padding target tokens."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tokens = 0.0
  t0 = time.perf_counter()
  for batch in batches:
    m = trainer.Step(batch)
    _, _, tok = tf.stack([m.is_finite[0], m.num_examples[0],
                          m.num_tokens[0]]).numpy()
    tokens += tok
  return time.perf_counter() - t0, tokens


def _TopOps(trace_dir, top):
  """(name, total self ms, count) of the trace's host events, largest first.

  Events nest (a tf.function call contains its ops); self time subtracts
  the children on the same thread line.
  """
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  paths = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'),
                    recursive=True)
  totals = collections.defaultdict(float)
  counts = collections.Counter()
  for path in paths:
    space = xplane_pb2.XSpace()
    with open(path, 'rb') as f:
      space.ParseFromString(f.read())
    for plane in space.planes:
      if not plane.name.startswith('/host:CPU'):
        continue
      names = {k: v.name for k, v in plane.event_metadata.items()}
      for line in plane.lines:
        events = sorted(line.events, key=lambda e: (e.offset_ps,
                                                    -e.duration_ps))
        stack = []  # (end_ps, name, duration_ps, [children's ps])
        for e in events + [None]:
          while stack and (e is None or stack[-1][0] <= e.offset_ps):
            _, name, dur, child = stack.pop()
            totals[name] += (dur - child[0]) / 1e9
            counts[name] += 1
            if stack:
              stack[-1][3][0] += dur
          if e is not None:
            stack.append((e.offset_ps + e.duration_ps,
                          names.get(e.metadata_id, '?'), e.duration_ps, [0]))
  rows = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
  return [(name, ms, counts[name]) for name, ms in rows]


def main():
  args = _Args()
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  from lingshard import startup  # pylint: disable=g-import-not-at-top
  startup.Install()  # Before TF's import.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  specs = [(m.split('.')[-1], m, args.params_override) for m in args.models]
  for v in args.variant:
    name, rest = v.split('=', 1)
    model, over = rest.split(':', 1)
    specs.insert(len(specs) - 1, (name, model, ';'.join(
        o for o in (args.params_override, over) if o)))
  tmp = tempfile.mkdtemp(prefix='bench_step_')
  print(f'# bench_step: {", ".join(f"{n}={m}" for n, m, _ in specs)}; '
        f'{args.batches} real batches per pass, reps={args.reps}; '
        f'load {os.getloadavg()}')
  print(f'{"mode":>5} {"variant":>10} {"ms/step":>8} {"tgt tok/s":>10} '
        f'{"ratio":>6}')
  t_start = time.time()
  batches = None
  for mode in args.modes:
    jit = mode == 'jit'
    trainers = {}
    for name, model, over in specs:
      p = _Params(model, args.data_dir, over)
      trainers[name] = _Trainer(p, jit, os.path.join(tmp, f'{name}_{mode}'))
      if batches is None:
        batches = _Batches(trainers[name], args.batches)
    for trainer in trainers.values():
      _Pass(trainer, batches)  # Traces / compiles every bucket.
    times = {k: [] for k in trainers}
    tokens = 0.0
    for rep in range(args.reps):
      order = list(trainers)
      order = order[rep % len(order):] + order[:rep % len(order)]
      for k in order:
        secs, tokens = _Pass(trainers[k], batches)
        times[k].append(secs)
    base = np.array(times[specs[-1][0]])
    for k, ts in times.items():
      ts = np.array(ts)
      print(f'{mode:>5} {k:>10} {np.median(ts) / len(batches) * 1e3:8.1f} '
            f'{tokens / np.median(ts):10.0f} {np.median(ts / base):6.3f}',
            flush=True)
    if args.profile_dir:
      trace_dir = os.path.join(args.profile_dir, mode)
      trainer = trainers[specs[0][0]]
      tf.profiler.experimental.start(trace_dir)
      for i in range(args.profile_steps):
        _Pass(trainer, batches[i % len(batches):i % len(batches) + 1])
      tf.profiler.experimental.stop()
      print(f'# {mode}: top host ops of {specs[0][0]} by self time over '
            f'{args.profile_steps} steps (trace in {trace_dir})')
      for name, ms, count in _TopOps(trace_dir, args.top):
        print(f'#   {ms:9.1f} ms {count:6d}x  {name[:100]}')
  print(f'# total {time.time() - t_start:.0f} s; load {os.getloadavg()}')


if __name__ == '__main__':
  main()
