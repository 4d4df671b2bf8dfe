"""Benchmark: decoding speed of a trained MT model (greedy, beam, flat beam).

  .venv/bin/python scripts/bench_decode.py --logdir=logs/demo/m4.TinyMoE \
      [--model=m4.TinyMoE] [--data_dir=data/ui_m4] [--split=dev_unseen_en]

Decodes the split with the latest checkpoint of `--logdir` the way
`python -m lingshard.trainer --mode=decode` does (the task's
InferenceParams, the eval input's batches and buckets, `task.Decode` in a
tf.function: the KV cache, one tf.while_loop per batch) for each search:
greedy (beam 1), beam 4 with the state re-ordered every step, and flat beam
4 (GShard App. A.1, the default). Each is timed twice over the same batches:
the first pass includes tracing / compiling (one per distinct batch shape),
the second is steady state. Reports hypothesis tokens/s (EOS included),
sentences/s and traces, per way of running the search: `plain` (a graph TF
runs op by op, traced unannotated), `annotated` (--annotated: the same with
the sharding annotations, what the decoder ran before sharding.ForProgram)
and `jit` (--jit: the whole search XLA-compiled, the decoder's default,
`p.decode.jit`).

  .venv/bin/python scripts/bench_decode.py --batch_sizes 1 4 16 64 \
      [--model=m4.TinyMoE] [--logdir=...] [--searches greedy flat_beam4]

--batch_sizes: decode tokens/s vs batch size instead. No data is read:
each batch is B random source sentences of --src_len tokens; weights are
the checkpoint's with --logdir, else random (throughput only, no
translation quality), and EOS is disabled so every hypothesis runs to
max_decode_len, the same work at every batch size whatever the weights.
Each (search, batch size) is XLA-compiled once (the decoder's default),
then timed --rounds times, the rounds interleaved over batch sizes and
searches (a load change hits them all); the median is reported.
"""

import argparse
import os
import time


def _Args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--model', default='m4.TinyMoE')
  ap.add_argument('--logdir', default=None,
                  help='Trainer logdir with a checkpoint (e.g. the demo\'s); '
                  'needed but for --batch_sizes (random weights without).')
  ap.add_argument('--data_dir', default='data/ui_m4')
  ap.add_argument('--split', default='dev_unseen_en')
  ap.add_argument('--num_batches', type=int, default=0, help='0 = all.')
  ap.add_argument('--searches', nargs='+',
                  default=['greedy', 'beam4', 'flat_beam4'])
  ap.add_argument('--jit', action='store_true',
                  help='Also time every search XLA-compiled (jit_compile).')
  ap.add_argument('--annotated', action='store_true',
                  help='Also time every search traced with annotations.')
  ap.add_argument('--batch_sizes', type=int, nargs='+', default=None,
                  help='Tokens/s vs batch size (module doc), e.g. 1 4 16 64.')
  ap.add_argument('--src_len', type=int, default=16,
                  help='--batch_sizes: source tokens per sentence.')
  ap.add_argument('--rounds', type=int, default=3,
                  help='--batch_sizes: timed rounds after the compile.')
  args = ap.parse_args()
  if not args.batch_sizes and not args.logdir:
    ap.error('--logdir is required (but for --batch_sizes)')
  if args.batch_sizes and (min(args.batch_sizes) < 1 or args.src_len < 2 or
                           args.rounds < 1):
    ap.error('--batch_sizes, --rounds must be >= 1 and --src_len >= 2')
  return args


SEARCHES = {'greedy': dict(beam_size=1),
            'beam4': dict(beam_size=4, flat_beam=False),
            'flat_beam4': dict(beam_size=4, flat_beam=True)}


def main():
  args = _Args()
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  from lingshard import startup  # pylint: disable=g-import-not-at-top
  startup.Install()  # Before TF's import.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingshard import sharding  # pylint: disable=g-import-not-at-top
  from lingshard import model_registry  # pylint: disable=g-import-not-at-top
  from lingshard import platform as platform_lib  # pylint: disable=g-import-not-at-top
  from lingshard.layers import base_layer  # pylint: disable=g-import-not-at-top
  from lingshard.models import mt_decoder  # pylint: disable=g-import-not-at-top
  from lingshard.tools import demo  # pylint: disable=g-import-not-at-top
  from lingshard.train import checkpointer  # pylint: disable=g-import-not-at-top
  from lingshard.train import state as state_lib  # pylint: disable=g-import-not-at-top

  def Params(dataset, file_pattern):
    p = model_registry.GetParams(args.model, dataset)
    p.input.file_pattern = file_pattern
    for key, path in demo.VocabPaths(args.model, args.data_dir).items():
      p.input.Set(**{key: path})
    base_layer.ResolveParams(p.task, platform=platform_lib.Platform('default'))
    return p

  if args.batch_sizes:
    return _Sweep(args)
  params = Params('Train', os.path.join(args.data_dir, 'train.tsv'))
  dev = Params('Dev', os.path.join(args.data_dir, f'{args.split}.tsv'))
  state = state_lib.TrainState(params.task.Instantiate())
  step, _ = checkpointer.Checkpointer(
      os.path.join(args.logdir, 'train'), state,
      include_optimizer=False).Restore()
  if step is None:
    raise SystemExit(f'no checkpoint in {args.logdir}/train')
  theta = state.theta.Transform(lambda v: v.read_value())
  task = dev.task.cls.InferenceParams(dev.task).Instantiate()
  ds = dev.input.Instantiate().GetDataset()
  if args.num_batches:
    ds = ds.take(args.num_batches)
  batches = [(b.src.ids, b.src.paddings) for b in ds]
  sents = sum(int(ids.shape[0]) for ids, _ in batches)
  shapes = sorted({tuple(ids.shape) for ids, _ in batches})
  print(f'# bench_decode: {args.model} step {step} on {args.split}: '
        f'{sents} sentences in {len(batches)} batches, {len(shapes)} '
        f'shapes; max_decode_len {dev.task.decode.max_decode_len}; load '
        f'{os.getloadavg()}')
  print(f'{"search":>11} {"graph":>9} {"traces":>6} {"1st pass s":>10} '
        f'{"steady s":>8} {"tokens/s":>9} {"sent/s":>7} {"tok/sent":>8}')
  t_start = time.time()
  for name in args.searches:
    graphs = [('plain', False, False)]
    if args.annotated:
      graphs.append(('annotated', True, False))
    if args.jit:
      graphs.append(('jit', True, True))
    for graph, annotated, jit in graphs:
      kwargs = SEARCHES[name]

      def Decode(theta, ids, paddings, kwargs=kwargs, annotated=annotated):
        with sharding.ForProgram(annotated):
          return task.Decode(theta, ids, paddings, **kwargs)

      fn = tf.function(Decode, jit_compile=jit)
      passes = []
      for _ in range(2):
        tokens = 0
        t0 = time.perf_counter()
        for ids, paddings in batches:
          _, lengths = mt_decoder.BestHypotheses(fn(theta, ids, paddings))
          tokens += int(lengths.sum())
        passes.append(time.perf_counter() - t0)
      steady = passes[1]
      print(f'{name:>11} {graph:>9} '
            f'{fn.experimental_get_tracing_count():>6} {passes[0]:10.1f} '
            f'{steady:8.1f} {tokens / steady:9.0f} {sents / steady:7.1f} '
            f'{tokens / sents:8.1f}', flush=True)
  print(f'# total {time.time() - t_start:.0f} s; load {os.getloadavg()}')


def _Sweep(args):
  """Tokens/s vs batch size (module doc); prints the table."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  from lingshard import model_registry
  from lingshard import platform as platform_lib
  from lingshard.layers import base_layer
  from lingshard.train import checkpointer
  from lingshard.train import state as state_lib
  # pylint: enable=g-import-not-at-top
  params = model_registry.GetParams(args.model, 'Train')
  base_layer.ResolveParams(params.task,
                           platform=platform_lib.Platform('default'))
  state = state_lib.TrainState(params.task.Instantiate())
  weights = 'random weights (throughput only)'
  if args.logdir:
    step, _ = checkpointer.Checkpointer(
        os.path.join(args.logdir, 'train'), state,
        include_optimizer=False).Restore()
    if step is None:
      raise SystemExit(f'no checkpoint in {args.logdir}/train')
    weights = f'{args.logdir} step {step}'
  theta = state.theta.Transform(lambda v: v.read_value())
  task_p = params.task.cls.InferenceParams(params.task)
  task_p.eos_id = -1  # Never emitted: every hypothesis runs to max_len.
  task = task_p.Instantiate()
  max_len = task_p.decode.max_decode_len
  rng = np.random.default_rng(0)
  inputs = {b: (tf.constant(rng.integers(3, task_p.src_vocab_size,
                                         [b, args.src_len]), tf.int32),
                tf.zeros([b, args.src_len], tf.float32))
            for b in args.batch_sizes}
  # One function per (search, batch size): each is traced and compiled once
  # (TF's retracing warning counts those first traces; silenced).
  tf.get_logger().setLevel('ERROR')
  fns = {(name, b): tf.function(
      lambda th, ids, pad, kw=SEARCHES[name]: task.Decode(th, ids, pad, **kw),
      jit_compile=True) for name in args.searches for b in args.batch_sizes}
  print(f'# bench_decode --batch_sizes: {args.model}, {weights}; EOS '
        f'disabled, so every hypothesis is max_decode_len={max_len} tokens; '
        f'sources {args.src_len} random tokens; XLA-compiled; median of '
        f'{args.rounds} interleaved rounds; load {os.getloadavg()}')
  compile_s = {}
  for (name, b), fn in fns.items():
    t0 = time.perf_counter()
    out = fn(theta, *inputs[b])
    compile_s[name, b] = time.perf_counter() - t0
    assert int(np.min(out['lengths'])) == max_len, 'decoding stopped early'
  times = {key: [] for key in fns}
  for _ in range(args.rounds):
    for (name, b), fn in fns.items():
      t0 = time.perf_counter()
      np.asarray(fn(theta, *inputs[b])['ids'])
      times[name, b].append(time.perf_counter() - t0)
  print(f'{"search":>11} {"batch":>5} {"tokens/s":>9} {"sent/s":>8} '
        f'{"ms/step":>8} {"x batch 1":>9} {"compile s":>9}')
  for name in args.searches:
    first = None
    for b in args.batch_sizes:
      t = float(np.median(times[name, b]))
      tps = b * max_len / t
      first = first or tps
      print(f'{name:>11} {b:>5} {tps:9.0f} {b / t:8.1f} '
            f'{1e3 * t / max_len:8.2f} {tps / first:9.1f} '
            f'{compile_s[name, b]:9.1f}', flush=True)
  print(f'# load {os.getloadavg()}')


if __name__ == '__main__':
  main()
