"""GPipe (Huang et al. 2019) §2.3 in miniature: re-materialisation memory and
pipeline efficiency of a pipelined Transformer stack on virtual CPU devices.

  .venv/bin/python scripts/bench_gpipe.py --out_dir=/tmp/bench_gpipe
  .venv/bin/python scripts/bench_gpipe.py --quick   # a small subset
  .venv/bin/python scripts/bench_gpipe.py --body=moe  # GShard in GPipe
  .venv/bin/python scripts/bench_gpipe.py --body=amoebanet  # Tables 1, 2

`--body=amoebanet`: GPipe Tables 1 and 2 for AmoebaNet-D cells
(scripts/bench_gpipe_image.py's docstring); the rest of this docstring is
about the Transformer bodies.

The body is one Transformer encoder layer (transformer.TransformerLayer,
model dim --model_dim, FFN --hidden_dim, sequences of --seq_len), stacked
by `pipeline.PipelinedLayer`. With `--body=moe` the body is GShard's
pattern, a `transformer.TransformerLayerGroup` of a dense and an MoE layer
(top-2, --num_experts experts, groups of --group_size tokens, GShard's
einsum dispatch; every token's global offset passed per micro-batch), and
L counts both (L/2 bodies); its loss adds the MoE layers' aux loss. The
step is its train step (loss linear in the
outputs, gradients of every weight), exported with every sharding
annotation, partitioned by XLA's SPMD partitioner and compiled for K virtual
CPU devices (lingshard.spmd.check with compare=False, then
xla_runtime.CompileSpmd to run it).

(a) Memory (§2.3): XLA's compiled memory statistics of one device's
program (temp = the activations and gradients live at once) for L layers
and M micro-batches of a mini-batch of N sequences, with and without
re-materialisation, on K = 1 device. The paper: without re-materialisation
O(N * L); with it O(N + (L/K) * (N/M)) (boundary activations of the N
examples plus one cell's activations of one micro-batch). The table gives
both in units of one sequence's activations of one layer.

(b) Efficiency (§2.3): per-device FLOPs of the pipelined program (XLA cost
analysis, of the unrolled schedule: `loop=False`) for K stages and M
micro-batches against the unpipelined step (K = 1, M = 1, one device)
divided by K. The SPMD pipeline runs all K stages in each of its
M + K - 1 iterations, bubble iterations included, so the FLOPs efficiency
is M / (M + K - 1) = 1 - the bubble (K-1)/(M+K-1).
The measured wall-clock speedup on K virtual CPU devices is printed too;
the K virtual devices share this machine's cores, so it is bounded by the
number of cores, not by K.

(c) Schedule (`--parts=schedule`): the step time of fill-drain against the
circular schedule (pipeline_schedule.Circular, R = 2, 4 layer chunks per
stage) at each K and M, L = --sched_layers, N = --sched_batch_size,
remat and the while-loop runner (the default path). Every program is
compiled first, then their timed runs are interleaved (round-robin,
median of --run_reps), so a change in the machine's load hits all alike. Circular runs R M + K - 1
iterations of 1/R of a stage's layers, fill-drain M + K - 1 of all of
them: the predicted time ratio is ((R M + K - 1) / R) / (M + K - 1). XLA's
temp memory of each program is printed with it.

Prints the tables, writes gpipe_memory.csv, gpipe_efficiency.csv,
gpipe_schedule.csv and (with matplotlib) gpipe.png.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import csv
import os
import statistics
import time

from absl import app
from absl import flags
import bench_gpipe_image  # Its flags; --body=amoebanet runs it.

FLAGS = flags.FLAGS
flags.DEFINE_bool('quick', False, 'A small subset: L in {4, 16}, M in {1, '
                  '8}; K in {2, 4}, M in {1, 8}.')
flags.DEFINE_list('parts', ['memory', 'efficiency'],
                  'Which tables to measure: memory, efficiency, schedule.')
flags.DEFINE_list('sched_stages', ['2', '4'], 'K of the schedule table.')
flags.DEFINE_list('sched_micro_batches', ['4', '8'],
                  'M of the schedule table.')
flags.DEFINE_list('sched_repeats', ['2', '4'],
                  'R of the circular rows of the schedule table.')
flags.DEFINE_integer('sched_layers', 16, 'L of the schedule table (a '
                     'multiple of every K R).')
flags.DEFINE_integer('sched_model_dim', 64, 'Model dim of the schedule '
                     'table (larger: the layers\' compute, which the '
                     'predicted ratio counts, weighs more against the '
                     'per-iteration costs).')
flags.DEFINE_integer('sched_hidden_dim', 256, 'FFN hidden dim of the '
                     'schedule table.')
flags.DEFINE_integer('sched_batch_size', None, 'Mini-batch N (sequences) '
                     'of the schedule table, default --batch_size (larger: '
                     'each micro-batch\'s '
                     'layer compute, which the predicted ratio counts, '
                     'weighs more against the per-iteration costs).')
flags.DEFINE_list('mem_layers', ['4', '8', '16'], 'L of the memory table.')
flags.DEFINE_list('mem_micro_batches', ['1', '2', '4', '8'],
                  'M of the memory table.')
flags.DEFINE_list('stages', ['2', '4', '8'], 'K of the efficiency table.')
flags.DEFINE_list('micro_batches', ['1', '4', '8', '32'],
                  'M of the efficiency table.')
flags.DEFINE_integer('eff_layers', 8, 'L of the efficiency table (a '
                     'multiple of every K).')
flags.DEFINE_integer('batch_size', 32, 'Mini-batch N (sequences) of the '
                     'efficiency table.')
flags.DEFINE_integer('mem_batch_size', 128, 'Mini-batch N (sequences) of the '
                     'memory table: large enough that activations, not '
                     'the fixed buffers, dominate.')
flags.DEFINE_integer('seq_len', 32, 'Sequence length T.')
flags.DEFINE_integer('model_dim', 64, 'Model dim.')
flags.DEFINE_integer('hidden_dim', 256, 'FFN hidden dim.')
flags.DEFINE_integer('num_heads', 4, 'Attention heads.')
flags.DEFINE_integer('run_reps', 5, 'Timed runs per program (median).')
flags.DEFINE_enum('body', 'dense', ['dense', 'moe', 'amoebanet'],
                  'dense: one Transformer layer per body; moe: a dense + an '
                  'MoE layer per body; amoebanet: GPipe Tables 1 and 2 of '
                  'AmoebaNet-D cells (bench_gpipe_image.py).')
flags.DEFINE_integer('num_experts', 4, 'Experts of the MoE layers (moe).')
flags.DEFINE_integer('group_size', 32, 'Tokens per MoE group (moe).')
flags.DEFINE_string('out_dir', '/tmp/bench_gpipe',
                    'Where to write the CSVs and the PNG.')

MAX_DEVICES = 8


def _LayerParams(num_layers, num_stages, num_micro_batches, remat,
                 loop=True, repeats=None, dims=None):
  # pylint: disable=g-import-not-at-top
  from lingshard.layers import pipeline
  from lingshard.layers import transformer
  from lingshard.layers.moe import top2
  # pylint: enable=g-import-not-at-top
  model_dim, hidden_dim = dims or (FLAGS.model_dim, FLAGS.hidden_dim)
  body = transformer.TransformerLayer.Params().Set(
      model_dim=model_dim, hidden_dim=hidden_dim, num_heads=FLAGS.num_heads,
      dim_per_head=model_dim // FLAGS.num_heads)
  if FLAGS.body == 'moe':
    moe = body.Copy().Set(moe_tpl=top2.MoELayer.Params().Set(
        num_experts=FLAGS.num_experts, group_size=FLAGS.group_size,
        dispatch_impl='einsum', second_expert_policy='random'))
    body = transformer.TransformerLayerGroup.Params().Set(
        layer_tpls=[body, moe])
    num_layers //= 2
  p = pipeline.PipelinedLayer.Params().Set(
      name='stack', body_tpl=body, num_layers=num_layers,
      num_stages=num_stages, num_micro_batches=num_micro_batches,
      remat=remat, loop=loop)
  return bench_gpipe_image.OnStageMesh(p, num_stages, repeats)


def _Measure(num_layers, num_stages, num_micro_batches, remat, run=False,
             batch_size=None, loop=True, repeats=None, dims=None):
  """Partitions one train step; returns (CheckResult, median run seconds),
  or with run='later' (CheckResult, fn() -> one run's seconds)."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  from lingshard.nested_map import NestedMap
  from lingshard.spmd import check
  # pylint: enable=g-import-not-at-top
  layer = _LayerParams(num_layers, num_stages, num_micro_batches,
                       remat, loop, repeats, dims).Instantiate()
  n, t = batch_size or FLAGS.batch_size, FLAGS.seq_len
  m = dims[0] if dims else FLAGS.model_dim
  rng = np.random.RandomState(0)
  inputs = NestedMap(
      theta=layer.theta.Transform(lambda v: v.numpy()),
      x=rng.normal(size=[n, t, m]).astype(np.float32),
      paddings=np.zeros([n, t], np.float32),
      cot=rng.normal(size=[n, t, m]).astype(np.float32))

  def Step(ins):
    theta = layer.ShardTheta(ins.theta)
    leaves = theta.Flatten()
    with tf.GradientTape() as tape:
      tape.watch(leaves)
      y, aux = layer.FProp(theta.Pack(leaves), ins.x, ins.paddings,
                           step=tf.constant(1, tf.int64), token_offset=0)
      loss = tf.reduce_sum(y * ins.cot) + aux.get('aux_loss', 0.0)
    grads = theta.Pack(tape.gradient(loss, leaves))
    return NestedMap(loss=loss, grads=layer.ShardTheta(grads))

  result = check.CheckFunction(Step, inputs, num_stages, compare=False,
                               name=f'L{num_layers} K{num_stages} '
                               f'M{num_micro_batches} remat={remat}')
  seconds = None
  if run:
    once = bench_gpipe_image.TimedStep(result, inputs, num_stages)
    if run == 'later':
      return result, once
    seconds = statistics.median([once()[0] for _ in range(FLAGS.run_reps)])
  return result, seconds


def _MemoryRows(layers, micro_batches):
  rows = []
  n = FLAGS.mem_batch_size
  for num_layers in layers:
    for mb in micro_batches:
      row = dict(layers=num_layers, micro_batches=mb, stages=1)
      for remat in (False, True):
        r, _ = _Measure(num_layers, 1, mb, remat, batch_size=n)
        key = 'remat' if remat else 'plain'
        row[f'temp_{key}'] = r.memory['temp']
      row['measured_ratio'] = row['temp_plain'] / max(row['temp_remat'], 1)
      row['paper_plain'] = n * num_layers  # O(N * L)
      row['paper_remat'] = n + num_layers * n / mb  # O(N + L/K * N/M), K=1
      row['paper_ratio'] = row['paper_plain'] / row['paper_remat']
      rows.append(row)
      print(f'# memory L={num_layers} M={mb}: plain {row["temp_plain"]:,} '
            f'remat {row["temp_remat"]:,} B', flush=True)
  return rows


def _EfficiencyRows(stages, micro_batches):
  # Unrolled (loop=False): XLA's cost analysis counts a loop body once.
  ref, ref_seconds = _Measure(FLAGS.eff_layers, 1, 1, True, run=True,
                              loop=False)
  rows = []
  for k in stages:
    for mb in micro_batches:
      r, seconds = _Measure(FLAGS.eff_layers, k, mb, True, run=True,
                            loop=False)
      kinds = r.CollectiveCounts()
      rows.append(dict(
          stages=k, micro_batches=mb, flops_per_device=r.flops,
          unpipelined_flops=ref.flops,
          flops_efficiency=ref.flops / k / r.flops,
          bubble=(k - 1) / (mb + k - 1),
          one_minus_bubble=mb / (mb + k - 1),
          seconds=seconds, unpipelined_seconds=ref_seconds,
          speedup=ref_seconds / seconds,
          collective_permutes=kinds['collective-permute'],
          all_gathers=kinds['all-gather']))
      print(f'# efficiency K={k} M={mb}: {r.flops:,.0f} FLOPs/device, '
            f'{seconds:.3f}s', flush=True)
  return rows


def _ScheduleRows(stages, micro_batches, repeats):
  """Fill-drain vs circular R per (K, M): every program compiled first,
  then the timed runs interleaved round-robin."""
  programs = []
  for k in stages:
    for mb in micro_batches:
      for r in [None] + repeats:
        result, once = _Measure(
            FLAGS.sched_layers, k, mb, True, run='later', repeats=r,
            batch_size=FLAGS.sched_batch_size or FLAGS.batch_size,
            dims=(FLAGS.sched_model_dim, FLAGS.sched_hidden_dim))
        programs.append(((k, mb, r), result, once))
        print(f'# schedule K={k} M={mb} R={r or 1}: compiled', flush=True)
  times = {key: [] for key, _, _ in programs}
  for _ in range(FLAGS.run_reps):
    for key, _, once in programs:
      times[key].append(once())
  seconds = {key: statistics.median(t[0] for t in ts)
             for key, ts in times.items()}
  cpu = {key: statistics.median(t[1] for t in ts) for key, ts in times.items()}
  rows = []
  for (k, mb, r), result, _ in programs:
    base = seconds[(k, mb, None)]
    rr = r or 1
    rows.append(dict(
        stages=k, micro_batches=mb,
        schedule='fill-drain' if r is None else f'circular R={r}',
        iterations=rr * mb + k - 1, bubble=(k - 1) / (rr * mb + k - 1),
        seconds=seconds[(k, mb, r)],
        measured_ratio=seconds[(k, mb, r)] / base,
        cpu_seconds=cpu[(k, mb, r)],
        cpu_ratio=cpu[(k, mb, r)] / cpu[(k, mb, None)],
        predicted_ratio=(rr * mb + k - 1) / rr / (mb + k - 1),
        temp=result.memory['temp']))
  return rows


def _Fmt(v):
  if isinstance(v, float):
    return f'{v:.3g}' if abs(v) < 1000 else f'{v:,.0f}'
  if isinstance(v, int):
    return f'{v:,}'
  return str(v)


def _PrintTable(title, rows, cols):
  print(f'\n{title}')
  table = [cols] + [tuple(_Fmt(r[c]) for c in cols) for r in rows]
  widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
  for row in table:
    print('  '.join(v.rjust(w) for v, w in zip(row, widths)))


def _WriteCsv(path, rows):
  with open(path, 'w', newline='', encoding='utf-8') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  print(f'wrote {path}')


def _Plot(mem_rows, eff_rows, path):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    print('matplotlib not installed: no PNG (pip install matplotlib)')
    return
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
  for num_layers in sorted({r['layers'] for r in mem_rows}):
    pts = [r for r in mem_rows if r['layers'] == num_layers]
    mbs = [r['micro_batches'] for r in pts]
    line, = ax1.plot(mbs, [r['temp_plain'] / 2**20 for r in pts], 's--',
                     label=f'L={num_layers} no remat')
    ax1.plot(mbs, [r['temp_remat'] / 2**20 for r in pts], 'o-',
             color=line.get_color(), label=f'L={num_layers} remat')
  ax1.set_xscale('log', base=2)
  ax1.set_xlabel('micro-batches M')
  ax1.set_ylabel('XLA temp memory (MiB)')
  ax1.set_title('(a) train-step memory, K = 1')
  ax1.legend(fontsize=7)
  for k in sorted({r['stages'] for r in eff_rows}):
    pts = [r for r in eff_rows if r['stages'] == k]
    mbs = [r['micro_batches'] for r in pts]
    line, = ax2.plot(mbs, [r['flops_efficiency'] for r in pts], 'o',
                     label=f'K={k} FLOPs')
    ax2.plot(mbs, [r['one_minus_bubble'] for r in pts], '-',
             color=line.get_color(), label=f'K={k} 1 - bubble')
    ax2.plot(mbs, [r['speedup'] / k for r in pts], 'x:',
             color=line.get_color(), label=f'K={k} wall-clock speedup / K')
  ax2.set_xscale('log', base=2)
  ax2.set_ylim(0, 1.05)
  ax2.set_xlabel('micro-batches M')
  ax2.set_title('(b) pipeline efficiency vs M / (M + K - 1)')
  ax2.legend(fontsize=7)
  fig.suptitle('GPipe §2.3 in miniature (pipelined Transformer stack, '
               f'{FLAGS.body} body)')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f'wrote {path}')


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  if FLAGS.body == 'amoebanet':
    error = bench_gpipe_image.FlagError(MAX_DEVICES)
    if error:  # One line, no traceback.
      raise SystemExit(f'bench_gpipe.py: error: {error}')
  xla_runtime.ConfigureCpuDevices(MAX_DEVICES)
  if FLAGS.body == 'amoebanet':
    start = time.time()
    bench_gpipe_image.Run(_PrintTable, _WriteCsv, FLAGS.out_dir)
    print(f'\n{time.time() - start:.0f}s in all')
    return
  if FLAGS.quick:
    mem_layers, mem_mb, stages, mbs = [4, 16], [1, 8], [2, 4], [1, 8]
  else:
    mem_layers = [int(x) for x in FLAGS.mem_layers]
    mem_mb = [int(x) for x in FLAGS.mem_micro_batches]
    stages = [int(x) for x in FLAGS.stages]
    mbs = [int(x) for x in FLAGS.micro_batches]
  bad = [k for k in stages if k > MAX_DEVICES or FLAGS.eff_layers % k]
  if bad:
    raise app.UsageError(f'--stages {bad}: K must be <= {MAX_DEVICES} and '
                         f'divide --eff_layers {FLAGS.eff_layers}')
  sched = [[int(x) for x in v] for v in (
      FLAGS.sched_stages, FLAGS.sched_micro_batches, FLAGS.sched_repeats)]
  bad = [(k, r) for k in sched[0] for r in sched[2]
         if k > MAX_DEVICES or FLAGS.sched_layers % (k * r)
         or min(sched[1]) < k]
  if 'schedule' in FLAGS.parts and bad:
    raise app.UsageError(f'--sched_stages x --sched_repeats {bad}: K must be '
                         f'<= {MAX_DEVICES} and <= every M, K R divide '
                         f'--sched_layers {FLAGS.sched_layers}')
  start = time.time()
  mem_rows = (_MemoryRows(mem_layers, mem_mb) if 'memory' in FLAGS.parts
              else [])
  eff_rows = (_EfficiencyRows(stages, mbs) if 'efficiency' in FLAGS.parts
              else [])
  sched_rows = (_ScheduleRows(*sched) if 'schedule' in FLAGS.parts else [])
  _Report(mem_rows, eff_rows, sched_rows)
  print(f'\n{time.time() - start:.0f}s in all')


def _Report(mem_rows, eff_rows, sched_rows=()):
  """Prints the tables, writes the CSVs and the PNG."""
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  prefix = 'gpipe' if FLAGS.body == 'dense' else 'gpipe_moe'
  print(f'\nbody: {FLAGS.body}' + (
      f' (dense + MoE layer, {FLAGS.num_experts} experts, groups of '
      f'{FLAGS.group_size})' if FLAGS.body == 'moe' else ''))
  if mem_rows:
    _PrintTable(
        f'(a) train-step temp memory (bytes), K = 1, N = '
        f'{FLAGS.mem_batch_size} sequences; paper columns in units of one '
        'sequence-layer',
        mem_rows, ('layers', 'micro_batches', 'temp_plain', 'temp_remat',
                   'measured_ratio', 'paper_plain', 'paper_remat',
                   'paper_ratio'))
    _WriteCsv(os.path.join(FLAGS.out_dir, f'{prefix}_memory.csv'), mem_rows)
  if eff_rows:
    _PrintTable(
        f'(b) pipeline efficiency, L = {FLAGS.eff_layers}, remat on; FLOPs '
        'efficiency = (unpipelined FLOPs / K) / per-device FLOPs',
        eff_rows, ('stages', 'micro_batches', 'flops_per_device',
                   'flops_efficiency', 'one_minus_bubble', 'bubble',
                   'seconds', 'speedup', 'collective_permutes',
                   'all_gathers'))
    _WriteCsv(os.path.join(FLAGS.out_dir, f'{prefix}_efficiency.csv'),
              eff_rows)
  if sched_rows:
    _PrintTable(
        f'(c) schedule, L = {FLAGS.sched_layers}, model dim '
        f'{FLAGS.sched_model_dim}, FFN {FLAGS.sched_hidden_dim}, N = '
        f'{FLAGS.sched_batch_size or FLAGS.batch_size} x {FLAGS.seq_len} '
        'tokens, remat, '
        'while loops; '
        'ratio = step time / fill-drain\'s, interleaved runs; predicted = '
        '((R M + K - 1) / R) / (M + K - 1)',
        sched_rows, ('stages', 'micro_batches', 'schedule', 'iterations',
                     'bubble', 'seconds', 'measured_ratio', 'cpu_seconds',
                     'cpu_ratio', 'predicted_ratio', 'temp'))
    _WriteCsv(os.path.join(FLAGS.out_dir, f'{prefix}_schedule.csv'),
              sched_rows)
  if mem_rows and eff_rows:
    _Plot(mem_rows, eff_rows, os.path.join(FLAGS.out_dir, f'{prefix}.png'))


if __name__ == '__main__':
  app.run(main)
