"""Benchmark: MoE layer fwd+bwd step time vs a FLOP-matched dense FFN.

For top-2 routing at capacity factor 1 the experts do the work of a dense
FFN with hidden 2H on the same tokens (E*G*C = 2*G*S rows of M->H->M), so
the MoE/dense time ratio measures the cost of gating, dispatch and combine,
plus moving E times more weight bytes: at fixed H the expert weights (and
their gradients) grow with E (E=256: 2 x 1 GiB vs 16 MiB dense), so large-E
configs are bound by memory bandwidth, not by FLOPs.

Roofline (same machine, same run): before the table, the peak matmul rate
F (a [N, M] x [M, 2H] matmul, the dense FFN's first) and the memory
read bandwidth B (the sum of a 512 MiB tensor: one read pass) are
measured per mode; each variant's roofline is max(FLOPs / F, bytes / B) with
FLOPs and bytes counted by `_Cost` (fwd + bwd: every matmul 3 times; weights
read twice and their gradients written once; each activation written once
and read about three times) and the table shows measured / roofline.

Each step computes the loss sum(y * r) (+ aux) and the gradients w.r.t. the
inputs and every weight. Timing is interleaved: every repetition runs each
variant once, in rotation, and the ratio is the median over repetitions of
(moe time / dense time of the same repetition), so load drift on a shared
machine affects both sides alike. Prints ms (median), tokens/s and the ratio.

  .venv/bin/python scripts/bench_moe.py                 # full table
  .venv/bin/python scripts/bench_moe.py --experts 16 --reps 5
"""

import argparse
import os
import time

import numpy as np


def _Args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--groups', type=int, default=4)
  ap.add_argument('--group_size', type=int, default=1024)
  ap.add_argument('--model_dim', type=int, default=512)
  ap.add_argument('--hidden_dim', type=int, default=2048)
  ap.add_argument('--experts', type=int, nargs='+', default=[16, 8, 64, 256])
  ap.add_argument('--capacity_factor', type=float, default=1.0)
  ap.add_argument('--impls', nargs='+', default=['gather', 'einsum'],
                  help='dispatch_impl values; IMPL_bfloat16 runs the experts '
                  'in bfloat16 (expert_dtype; float32 master weights).')
  ap.add_argument('--modes', nargs='+', default=['graph', 'jit'])
  ap.add_argument('--einsum_max_experts', type=int, default=256,
                  help='Skip the O(GSECM) einsum impl above this E.')
  ap.add_argument('--reps', type=int, default=5)
  ap.add_argument('--warmup', type=int, default=1)
  ap.add_argument('--allocator', choices=['bfc', 'default'], default='bfc',
                  help='bfc: TF_CPU_ALLOCATOR_USE_BFC=true (reuses memory; '
                  'the default allocator page-faults fresh buffers for every '
                  'large gradient).')
  ap.add_argument('--inter_op_threads', type=int, default=1,
                  help='1 runs one big matmul at a time on all cores; 0 = '
                  'TF default (concurrent matmuls oversubscribe 2 cores).')
  return ap.parse_args()


def _DenseStep(m, h2, jit):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  w1 = tf.Variable(rng.normal(0, m**-0.5, [m, h2]).astype(np.float32))
  w2 = tf.Variable(rng.normal(0, h2**-0.5, [h2, m]).astype(np.float32))

  @tf.function(jit_compile=jit)
  def Step(x, r):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
      loss = tf.reduce_sum(y * r)
    return loss, tape.gradient(loss, [x, w1, w2])

  return Step


def _MoEStep(args, num_experts, impl, jit):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingshard.layers.moe import top2  # pylint: disable=g-import-not-at-top
  dispatch, _, expert_dtype = impl.partition('_')
  p = top2.MoELayer.Params().Set(
      name='moe', input_dim=args.model_dim, hidden_dim=args.hidden_dim,
      num_experts=num_experts, num_groups=args.groups,
      capacity_factor=args.capacity_factor, dispatch_impl=dispatch,
      expert_dtype=tf.as_dtype(expert_dtype) if expert_dtype else None)
  layer = p.Instantiate()
  theta = layer.theta
  leaves = theta.Flatten()

  @tf.function(jit_compile=jit)
  def Step(x, r, paddings):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y, aux = layer.FProp(theta, x, paddings, step=1)
      loss = tf.reduce_sum(tf.reshape(y, tf.shape(r)) * r) + aux.aux_loss
    return loss, tape.gradient(loss, [x] + leaves)

  return Step, layer.Capacity(args.group_size)


def _Cost(args, num_experts, impl, capacity):
  """(matmul FLOPs, bytes moved) of one fwd + bwd step of a variant.

  Letters: N = G*S tokens, R = E*G*C expert rows (= 2 N at cf 1).
  FLOPs: each matmul once forward and twice backward (input and weight
  gradients). dense: NM(2H) twice. moe: the experts RMH twice, gating
  `GSM,ME->GSE` NME; einsum dispatch `GSEC,GSM->EGCM` (fwd + input grad)
  and combine `GSEC,GECM->GSM` (fwd + both grads) 5 GSECM in all.
  Bytes (float32): weights read in fwd and bwd, gradients written: 3 |W|;
  activations: every tensor of the FFN written once and read ~3 times
  (fwd consumer, bwd for its gradient and the weight gradient): 4 bytes x
  4 x (inputs + hidden + outputs), plus the one-hot [G, S, E, C] tensors of
  the einsum dispatch (2 of them, 4 x each). bfloat16 experts are counted
  as float32 (their cast passes read the float32 weights anyway).
  """
  g, s, m, h = args.groups, args.group_size, args.model_dim, args.hidden_dim
  n = g * s
  if impl == 'dense':
    flops = 3 * 2 * (2 * n * m * (2 * h))
    weights = 2 * m * (2 * h)
    acts = n * m + n * 2 * h + n * m
  else:
    e, c = num_experts, capacity
    rows = e * g * c
    flops = 3 * 2 * (2 * rows * m * h) + 3 * 2 * n * m * e
    weights = 2 * e * m * h + m * e
    acts = 2 * n * m + rows * (2 * m + h) + n * e
    if impl.startswith('einsum'):
      flops += 5 * 2 * g * s * e * c * m
      acts += 2 * g * s * e * c
  return flops, 4 * (3 * weights + 4 * acts)


def _Peaks(args, jit, reps):
  """(matmul FLOP/s, memory bytes/s) measured now, best of `reps`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n = args.groups * args.group_size
  rng = np.random.RandomState(2)
  a = tf.constant(rng.normal(size=[n, args.model_dim]).astype(np.float32))
  b = tf.constant(rng.normal(
      size=[args.model_dim, 2 * args.hidden_dim]).astype(np.float32))
  big = tf.constant(np.ones([128, 1024, 1024], np.float32))  # 512 MiB.
  matmul = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)[0]),
                       jit_compile=jit)
  read = tf.function(tf.reduce_sum, jit_compile=jit)

  def Best(fn, *xs):
    fn(*xs).numpy()
    ts = []
    for _ in range(reps):
      t0 = time.perf_counter()
      fn(*xs).numpy()
      ts.append(time.perf_counter() - t0)
    return min(ts)

  flops = 2 * n * args.model_dim * 2 * args.hidden_dim / Best(matmul, a, b)
  bandwidth = big.shape.num_elements() * 4 / Best(read, big)
  return flops, bandwidth


def _Run(fn, *xs):
  """One step; the call returns when it is done (eager is synchronous).

  Only the loss is fetched: copying GB of expert gradients to numpy would
  time the copy, not the step (an optimizer consumes them in place).
  """
  loss, _ = fn(*xs)
  loss.numpy()


def main():
  args = _Args()
  if args.allocator == 'bfc':
    os.environ['TF_CPU_ALLOCATOR_USE_BFC'] = 'true'
  # TensorFlow is imported only now, after the allocator choice is in env.
  from lingshard import startup  # pylint: disable=g-import-not-at-top
  startup.Install()  # Before TF's import.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if args.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(
        args.inter_op_threads)
  n = args.groups * args.group_size
  m = args.model_dim
  rng = np.random.RandomState(1)
  x_nm = tf.constant(rng.normal(size=[n, m]).astype(np.float32))
  r_nm = tf.constant(rng.normal(size=[n, m]).astype(np.float32))
  x_btm = tf.reshape(x_nm, [args.groups, args.group_size, m])
  pad = tf.zeros([args.groups, args.group_size])
  print(f'# bench_moe: G={args.groups} S={args.group_size} M={m} '
        f'H={args.hidden_dim} cf={args.capacity_factor} tokens={n}; '
        f'dense hidden {2 * args.hidden_dim}; load {os.getloadavg()}')
  print(f'# allocator={args.allocator} inter_op_threads='
        f'{args.inter_op_threads} reps={args.reps}')
  t_start = time.time()
  peaks = {}
  for mode in args.modes:
    peaks[mode] = _Peaks(args, mode == 'jit', args.reps)
    print(f'# {mode}: matmul {peaks[mode][0] / 1e9:.1f} GFLOP/s, memory '
          f'{peaks[mode][1] / 1e9:.1f} GB/s (measured)')
  print(f'{"E":>4} {"C":>4} {"mode":>5} {"variant":>15} {"ms":>8} '
        f'{"tokens/s":>9} {"ratio":>6} {"GFLOP":>7} {"GB":>6} '
        f'{"roof ms":>8} {"bound":>6} {"/roof":>6}')
  for e in args.experts:
    for mode in args.modes:
      jit = mode == 'jit'
      variants = {'dense': (_DenseStep(m, 2 * args.hidden_dim, jit),
                            (x_nm, r_nm))}
      capacity = None
      for impl in args.impls:
        if impl.startswith('einsum') and e > args.einsum_max_experts:
          continue
        step, capacity = _MoEStep(args, e, impl, jit)
        variants[impl] = (step, (x_btm, r_nm, pad))
      for fn, xs in variants.values():
        for _ in range(args.warmup + 1):  # First call traces/compiles.
          _Run(fn, *xs)
      times = {k: [] for k in variants}
      for rep in range(args.reps):
        order = list(variants)
        order = order[rep % len(order):] + order[:rep % len(order)]
        for k in order:
          fn, xs = variants[k]
          t0 = time.perf_counter()
          _Run(fn, *xs)
          times[k].append(time.perf_counter() - t0)
      dense = np.array(times['dense'])
      for k, ts in times.items():
        ts = np.array(ts)
        ratio = np.median(ts / dense)
        ms = np.median(ts) * 1e3
        flops, nbytes = _Cost(args, e, k, capacity)
        t_flops, t_bytes = flops / peaks[mode][0], nbytes / peaks[mode][1]
        roof = max(t_flops, t_bytes)
        print(f'{e:>4} {capacity:>4} {mode:>5} {k:>15} {ms:8.1f} '
              f'{n / np.median(ts):9.0f} {ratio:6.3f} {flops / 1e9:7.1f} '
              f'{nbytes / 1e9:6.2f} {roof * 1e3:8.1f} '
              f'{"flops" if t_flops >= t_bytes else "bytes":>6} '
              f'{np.median(ts) / roof:6.3f}', flush=True)
  print(f'# total {time.time() - t_start:.0f} s; load {os.getloadavg()}')


if __name__ == '__main__':
  main()
