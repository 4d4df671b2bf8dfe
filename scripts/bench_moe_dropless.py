"""Benchmark: sorted dropless vs padded dropless vs capacity-factor dispatch.

One GShard top-2 MoE layer (layers/moe/top2.py) at inference
(`is_inference`, second expert 'all'), XLA-compiled, three variants on the
same weights and tokens:

  sorted   dispatch_impl='sorted', eval_capacity_factor=None: only the
           2 choices of each token, grouped matmuls over blocks
           (moe/dispatch_sorted.py);
  padded   dispatch_impl='gather', eval_capacity_factor=None: C = S, every
           expert's buffer holds the whole group (E * tokens rows);
  cf2      dispatch_impl='gather', eval_capacity_factor=2.0: C = 4S/E
           (can drop tokens).

Timing is interleaved: every repetition runs each variant once, in
rotation, and each ratio is the median over repetitions of the two times of
the same repetition, so load drift on a shared machine affects both sides
alike. Peak memory: the BFC CPU allocator's peak during one step minus the
bytes held before it (the step's temporaries and outputs;
tf.config.experimental.get_memory_info). `--step fwd_bwd` times outputs
and gradients (training use) instead of the forward pass. Prints the load
average before and after.

  .venv/bin/python scripts/bench_moe_dropless.py
  .venv/bin/python scripts/bench_moe_dropless.py --experts 64 --reps 3
"""

import argparse
import os
import time

import numpy as np

VARIANTS = (('sorted', 'sorted', None), ('padded', 'gather', None),
            ('cf2', 'gather', 2.0))


def _Args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--groups', type=int, default=4)
  ap.add_argument('--group_size', type=int, default=256)
  ap.add_argument('--model_dim', type=int, default=256)
  ap.add_argument('--hidden_dim', type=int, default=512)
  ap.add_argument('--experts', type=int, nargs='+', default=[8, 16, 64])
  ap.add_argument('--step', choices=['fwd', 'fwd_bwd'], default='fwd')
  ap.add_argument('--reps', type=int, default=5)
  ap.add_argument('--block_size', type=int, default=None,
                  help='sorted_block_size (None: AutoBlockSize).')
  return ap.parse_args()


def _Step(tf, layer, x, pad, backward):
  theta = layer.theta

  @tf.function(jit_compile=True)
  def Fwd(x):
    y, _ = layer.FProp(theta, x, pad)
    return tf.reduce_sum(y * y)

  @tf.function(jit_compile=True)
  def FwdBwd(x):
    leaves = [theta.wi, theta.wo, theta.wg]
    with tf.GradientTape() as tape:
      tape.watch(leaves + [x])
      loss = Fwd.python_function(x)
    grads = tape.gradient(loss, leaves + [x])
    return [loss] + [tf.convert_to_tensor(g) for g in grads]

  return FwdBwd if backward else Fwd


def _Run(tf, fn, x):
  """(seconds, peak bytes above what was held before) of one step."""
  tf.config.experimental.reset_memory_stats('CPU:0')
  before = tf.config.experimental.get_memory_info('CPU:0')['current']
  start = time.perf_counter()
  out = fn(x)
  tf.nest.map_structure(lambda t: t.numpy(), out)
  secs = time.perf_counter() - start
  peak = tf.config.experimental.get_memory_info('CPU:0')['peak'] - before
  return secs, peak


def main():
  args = _Args()
  os.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingshard.layers.moe import top2  # pylint: disable=g-import-not-at-top
  g, s, m = args.groups, args.group_size, args.model_dim
  print(f'# load average {os.getloadavg()}; G={g} S={s} M={m} '
        f'H={args.hidden_dim} step={args.step} reps={args.reps} '
        f'intra-op threads {tf.config.threading.get_intra_op_parallelism_threads()}')
  rng = np.random.RandomState(0)
  x = tf.constant(rng.normal(size=[g, s, m]).astype(np.float32))
  pad = tf.zeros([g, s])
  print('| E | sorted ms | padded ms | cf2 ms | sorted/cf2 | padded/sorted '
        '| sorted MiB | padded MiB | cf2 MiB |')
  print('|---|---|---|---|---|---|---|---|---|')
  for e in args.experts:
    fns, theta = {}, None
    for name, impl, cf in VARIANTS:
      layer = top2.MoELayer.Params().Set(
          name='moe', input_dim=m, hidden_dim=args.hidden_dim, num_experts=e,
          num_groups=g, is_inference=True, second_expert_policy='all',
          dispatch_impl=impl, eval_capacity_factor=cf,
          sorted_block_size=args.block_size).Instantiate()
      if theta is None:
        theta = layer.theta
      else:
        for dst, src in zip(layer.theta.Flatten(), theta.Flatten()):
          dst.assign(src)
      fns[name] = _Step(tf, layer, x, pad, args.step == 'fwd_bwd')
      _Run(tf, fns[name], x)  # Compile.
    times = {name: [] for name in fns}
    peaks = {name: 0 for name in fns}
    for _ in range(args.reps):
      for name, fn in fns.items():
        secs, peak = _Run(tf, fn, x)
        times[name].append(secs)
        peaks[name] = max(peaks[name], peak)
    t = {k: np.asarray(v) for k, v in times.items()}
    ms = {k: 1e3 * float(np.median(v)) for k, v in t.items()}
    mib = {k: v / 2 ** 20 for k, v in peaks.items()}
    print(f'| {e} | {ms["sorted"]:.1f} | {ms["padded"]:.1f} | {ms["cf2"]:.1f} '
          f'| {float(np.median(t["sorted"] / t["cf2"])):.2f} '
          f'| {float(np.median(t["padded"] / t["sorted"])):.1f} '
          f'| {mib["sorted"]:.1f} | {mib["padded"]:.1f} | {mib["cf2"]:.1f} |',
          flush=True)
  print(f'# load average {os.getloadavg()}')


if __name__ == '__main__':
  main()
