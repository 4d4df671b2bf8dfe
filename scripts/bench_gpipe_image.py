"""GPipe (Huang et al. 2019) Tables 1 and 2 in miniature for AmoebaNet-D,
on K virtual CPU devices: `scripts/bench_gpipe.py --body=amoebanet`.

  .venv/bin/python scripts/bench_gpipe.py --body=amoebanet
  .venv/bin/python scripts/bench_gpipe.py --body=amoebanet \\
      --amoeba_parts=table1 --amoeba_budget_mib=128

The body is the cells alone of an AmoebaNet-D(L, D) (layers/amoebanet.py;
models/amoebanet_model.CellPlan / CellShapes with no stem cells and a
stride-1 stem: L normal cells in 3 groups, a reduction cell before groups
2 and 3, D the first group's filters), as a
`pipeline_cells.CellPipelinedLayer` on a random input of the stem's output
shape [N, H, W, --amoeba_stem_filters] (no stem conv, no head). The step
is its train step (loss linear in the cells' output, gradients of every
weight), exported with its sharding annotations, partitioned by XLA's SPMD
partitioner for K virtual CPU devices (lingshard.spmd.check with
compare=False; xla_runtime.CompileSpmd to run it).

Table 1 (GPipe Table 1: the largest AmoebaNet-D that fits one accelerator's
memory). Per-device memory = XLA's compiled memory statistics of the
partitioned step (arguments + temp of one device's program: the weights,
the inputs and every buffer live at once; not the outputs). For each row
the largest D (a multiple of --amoeba_filter_step; L fixed at
--amoeba_layers) whose step fits --amoeba_budget_mib, found by doubling
then bisection (memory grows with D), with its parameter count
(CellParamCounts) and memory, and the memory of the next D (which does not
fit). GPipe grows both L and D; here only D, so that every probe compiles a
program of the same structure (compile time grows with L, K and M, not D).
Rows: naive-1 (the cells one after another on the whole batch, no remat,
1 device: CellPipelinedLayer.FPropUnpipelined), Pipeline-1 (K = 1, remat,
M micro-batches) and Pipeline-K (K stages split over K devices, remat, M
micro-batches, schedule --amoeba_schedule: fill-drain or circular-R, which
needs M >= K and L + R_red >= K R cells, a one-line error otherwise).

Table 2 (GPipe Table 2: normalised training throughput vs K and M). A fixed
AmoebaNet-D(--amoeba_t2_layers, --amoeba_t2_filters), remat, at each K and
M: every program compiled first, then their timed runs interleaved
(round-robin, median of --run_reps), so a change in the machine's load hits
all alike; examples/s normalised to fill-drain at K = 2, M = 1. Each
schedule of --amoeba_t2_schedules runs at every (K, M): fill-drain
(GPipe §2.2, bubble (K - 1) / (M + K - 1)) and circular-R
(pipeline_schedule.Circular: K R chunks of consecutive cells, stage k holds
chunks k, k + K, ..., a micro-batch goes R times round the ring; bubble
(K - 1) / (R M + K - 1)). Circular needs M >= K (a micro-batch re-enters
stage 0 after leaving the last) and at least K R cells (L + R_red: with the
default 3 + 1 cells, K = 4 at R = 2 needs --amoeba_t2_layers=7); a
(K, M, R) it refuses is skipped with the schedule's reason printed. GPipe's
ideal throughput on K real devices, normalised likewise, is
K (1 - bubble). Here the K virtual devices share this
machine's cores (2 on the reference machine), so the measured throughput
cannot grow with K beyond the core count: a bubble stage computes nothing,
so it frees a core rather than idling an accelerator.

Prints the tables, writes gpipe_amoebanet_table1.csv and
gpipe_amoebanet_table2.csv to --out_dir.
"""

import statistics
import time

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_list('amoeba_parts', ['table1', 'table2'],
                  'Which AmoebaNet tables to measure: table1, table2.')
flags.DEFINE_integer('amoeba_budget_mib', 32, 'Table 1: per-device memory '
                     'budget (arguments + temp, MiB).')
flags.DEFINE_integer('amoeba_image', 16, 'H = W of the cells\' input.')
flags.DEFINE_integer('amoeba_stem_filters', 8, 'Channels of the cells\' '
                     'input (the stem\'s output).')
flags.DEFINE_integer('amoeba_batch', 16, 'Mini-batch N (images).')
flags.DEFINE_integer('amoeba_reductions', 1, 'R: reduction cells between '
                     'the groups of normal cells.')
flags.DEFINE_integer('amoeba_layers', 3, 'Table 1: L normal cells (plus R '
                     'reduction cells).')
flags.DEFINE_integer('amoeba_micro_batches', 2, 'Table 1: M of the '
                     'Pipeline rows.')
flags.DEFINE_list('amoeba_stages', ['2', '4'], 'Table 1: K of the '
                  'Pipeline-K rows.')
flags.DEFINE_string('amoeba_schedule', 'fill-drain', 'Table 1: schedule of '
                    'the Pipeline-K rows (K > 1): fill-drain or circular-R '
                    '(R >= 2; needs M >= K and L + reductions >= K R).')
flags.DEFINE_integer('amoeba_filter_step', 8, 'Table 1: D is searched in '
                     'multiples of this.')
flags.DEFINE_integer('amoeba_t2_layers', 3, 'Table 2: L.')
flags.DEFINE_integer('amoeba_t2_filters', 16, 'Table 2: D.')
flags.DEFINE_list('amoeba_t2_stages', ['2', '4'], 'Table 2: K.')
flags.DEFINE_list('amoeba_t2_micro_batches', ['1', '4', '8'], 'Table 2: M.')
flags.DEFINE_list('amoeba_t2_schedules', ['fill-drain', 'circular-2'],
                  'Table 2: schedules, each at every (K, M): fill-drain or '
                  'circular-R (R >= 2); a circular (K, M) with M < K or '
                  'fewer than K R cells is skipped with its reason.')

MIB = 2**20


class Body:
  """The body's settings: image H, input channels C, batch N, R
  reduction cells."""

  def __init__(self, image=16, channels=8, batch=16, reductions=1):
    self.image, self.channels, self.batch = image, channels, batch
    self.reductions = reductions


def ParseSchedule(name):
  """'fill-drain' -> None, 'circular-R' -> R (>= 2); ValueError else."""
  if name == 'fill-drain':
    return None
  head, _, tail = name.partition('-')
  if head == 'circular' and tail.isdigit() and int(tail) >= 2:
    return int(tail)
  raise ValueError(f'unknown schedule {name!r}; use fill-drain or '
                   'circular-R (R >= 2)')


def ScheduleName(repeats):
  """The tables' schedule column: None = fill-drain, R = circular R."""
  return 'fill-drain' if repeats is None else f'circular R={repeats}'


def Bubble(stages, micro_batches, repeats):
  """The schedule's bubble: (K - 1) / (R M + K - 1), R = 1 fill-drain."""
  return (stages - 1) / ((repeats or 1) * micro_batches + stages - 1)


def ScheduleProblem(cells, stages, micro_batches, repeats):
  """The schedule's own one-line reason it cannot run `cells` cells as
  (K, M), or None (pipeline_schedule.Circular.Check)."""
  if repeats is None:
    return None
  from lingshard.layers import pipeline_schedule  # pylint: disable=g-import-not-at-top
  try:
    pipeline_schedule.Circular.Params().Set(repeats=repeats).Instantiate(
        ).Check('cells', cells, stages, micro_batches)
  except pipeline_schedule.ScheduleError as e:
    return str(e)
  return None


def LayerParams(body, layers, filters, stages, micro_batches, remat,
                repeats=None):
  """CellPipelinedLayer params of AmoebaNet-D(layers, filters)'s cells;
  repeats: None = fill-drain, R = Circular(R)."""
  # pylint: disable=g-import-not-at-top
  from lingshard.layers import amoebanet
  from lingshard.layers import pipeline_cells
  from lingshard.models import amoebanet_model
  # pylint: enable=g-import-not-at-top
  shape = (body.image, body.image, body.channels)
  mp = amoebanet_model.AmoebaNetClassifier.Params().Set(
      image_shape=(body.image, body.image, 3), genotype='D',
      num_normal_cells=layers, filters=filters, num_stem_cells=0,
      stem_stride=1, stem_filters=body.channels,
      num_reduction_cells=body.reductions)
  tpls = [amoebanet.AmoebaCell.Params().Set(
      genotype='D', reduction=reduction, filters=f, input_shape=x,
      prev_shape=prev)
          for (reduction, f), (x, prev, _) in zip(
              amoebanet_model.CellPlan(mp), amoebanet_model.CellShapes(mp))]
  p = pipeline_cells.CellPipelinedLayer.Params().Set(
      name='cells', cell_tpls=tpls, input_shape=shape, num_stages=stages,
      num_micro_batches=micro_batches, remat=remat)
  return OnStageMesh(p, stages, repeats)


def OnStageMesh(p, stages, repeats=None):
  """Pipeline params p with Circular(repeats) (None: fill-drain) and, for
  K > 1, one device per stage (both benches' layout)."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard.layers import pipeline_schedule
  if repeats is not None:
    p.schedule = pipeline_schedule.Circular.Params().Set(repeats=repeats)
  if stages > 1:
    p.device_mesh = np.arange(stages)
    p.stage_mesh_axis = 0
  return p


def Measure(body, layers, filters, stages, micro_batches, remat,
            naive=False, run=False, repeats=None):
  """Partitions one train step.

  Returns (CheckResult, the layer, fn() -> one run's wall seconds or None).
  naive: the cells one after another on the whole batch (FPropUnpipelined).
  repeats: None = fill-drain, R = Circular(R).
  """
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  from lingshard.nested_map import NestedMap
  from lingshard.spmd import check
  # pylint: enable=g-import-not-at-top
  layer = LayerParams(body, layers, filters, stages, micro_batches,
                      remat, repeats).Instantiate()
  rng = np.random.RandomState(0)
  n = body.batch
  y_shape = layer.CellShapes()[-1][2]
  inputs = NestedMap(
      theta=layer.theta.Transform(lambda v: v.numpy()),
      x=rng.normal(size=[n, body.image, body.image, body.channels]).astype(
          np.float32),
      cot=rng.normal(size=[n, *y_shape]).astype(np.float32))

  def Step(ins):
    theta = layer.ShardTheta(ins.theta)
    leaves = theta.Flatten()
    with tf.GradientTape() as tape:
      tape.watch(leaves)
      packed = theta.Pack(leaves)
      y = (layer.FPropUnpipelined(packed, ins.x) if naive else
           layer.FProp(packed, ins.x))
      loss = tf.reduce_sum(y * ins.cot)
    grads = theta.Pack(tape.gradient(loss, leaves,
                                     unconnected_gradients='zero'))
    return NestedMap(loss=loss, grads=layer.ShardTheta(grads))

  name = (f'AmoebaNet-D({layers}, {filters}) K{stages} M{micro_batches} '
          f'remat={remat}{" naive" if naive else ""} {ScheduleName(repeats)}')
  result = check.CheckFunction(Step, inputs, stages, compare=False,
                               name=name)
  once = None
  if run:
    timed = TimedStep(result, inputs, stages)
    once = lambda: timed()[0]  # noqa: E731
  return result, layer, once


def TimedStep(result, inputs, num_devices):
  """The partitioned step `result` compiled for num_devices and run once
  (warm-up); returns fn() -> (wall seconds, this process's CPU seconds)
  of one more run on `inputs` (outputs: loss and grads of inputs.theta)."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard.nested_map import NestedMap
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  exe = xla_runtime.CompileSpmd(result.exported_hlo, num_devices)
  values = [np.asarray(v) for v in inputs.Flatten()]
  shapes = [np.shape(v) for v in NestedMap(
      loss=np.zeros([]), grads=inputs.theta).Flatten()]
  exe.Run(values, shapes)  # Warm-up.

  def Once():
    start, cpu = time.perf_counter(), time.process_time()
    exe.Run(values, shapes)
    return time.perf_counter() - start, time.process_time() - cpu

  return Once


def DeviceBytes(result):
  """Per-device arguments + temp of the compiled step."""
  return result.memory['argument'] + result.memory['temp']


def Probe(body, layers, filters, stages, micro_batches, remat, naive,
          repeats=None):
  """(per-device bytes, parameter count) of AmoebaNet-D(layers, filters)."""
  result, layer, _ = Measure(body, layers, filters, stages, micro_batches,
                             remat, naive=naive, repeats=repeats)
  return DeviceBytes(result), int(sum(layer.CellParamCounts()))


def LargestFit(probe, budget, step, start=1, log=print):
  """The largest i >= 1 with probe(i * step)[0] <= budget (probe's bytes
  grow with i): doubling from `start`, then bisection.

  Returns (i or 0 if even step does not fit, {i: probe(i * step)}).
  """
  seen = {}

  def Fits(i):
    if i not in seen:
      seen[i] = probe(i * step)
      log(f'#   D={i * step}: {seen[i][0] / MIB:.1f} MiB '
          f'{"fits" if seen[i][0] <= budget else "does not fit"}')
    return seen[i][0] <= budget

  start = max(start, 1)
  if Fits(start):
    lo, hi = start, 2 * start
    while Fits(hi):
      lo, hi = hi, 2 * hi
  else:
    lo, hi = start // 2, start
    while lo >= 1 and not Fits(lo):
      lo, hi = lo // 2, lo
    if lo < 1:
      return 0, seen
  while hi - lo > 1:  # lo fits, hi does not.
    mid = (lo + hi) // 2
    if Fits(mid):
      lo = mid
    else:
      hi = mid
  return lo, seen


def Table1Settings(stages, micro_batches, repeats=None):
  """[(row name, K, M, remat, naive, R)] of GPipe Table 1's columns; the
  Pipeline-K rows (K > 1) run `repeats` (None = fill-drain, R = circular
  R), the others fill-drain (one stage: no bubble to shrink)."""
  rows = [('naive-1', 1, 1, False, True, None),
          ('Pipeline-1', 1, micro_batches, True, False, None)]
  rows += [(f'Pipeline-{k}', k, micro_batches, True, False,
            repeats if k > 1 else None) for k in stages]
  return rows


def Table1Rows(body, layers, settings, budget, step, log=print):
  """Per setting the largest D that fits `budget` bytes per device."""
  rows, start = [], 1
  for name, k, m, remat, naive, r in settings:
    log(f'# table 1 {name}: K={k} M={m} remat={remat} {ScheduleName(r)}')
    i, seen = LargestFit(
        lambda d, k=k, m=m, remat=remat, naive=naive, r=r: Probe(
            body, layers, d, k, m, remat, naive, r),
        budget, step, start, log)
    if i == 0:
      rows.append(dict(row=name, stages=k, micro_batches=m,
                       schedule=ScheduleName(r),
                       remat='yes' if remat else 'no',
                       layers=layers, filters=0, params=0, device_mib=0.0,
                       next_filters=step, next_device_mib=seen[1][0] / MIB,
                       probes=len(seen)))
      continue
    nxt = seen[i + 1]
    rows.append(dict(
        row=name, stages=k, micro_batches=m, schedule=ScheduleName(r),
        remat='yes' if remat else 'no', layers=layers,
        filters=i * step, params=seen[i][1], device_mib=seen[i][0] / MIB,
        next_filters=(i + 1) * step, next_device_mib=nxt[0] / MIB,
        probes=len(seen)))
    start = i  # The next row (more stages) fits at least as much, mostly.
  return rows


def Table2Base(keys):
  """The (K, M, R) throughput is normalised to: fill-drain K = 2, M = 1
  if measured, else the first."""
  return (2, 1, None) if (2, 1, None) in keys else keys[0]


def Table2Rows(body, layers, filters, stages, micro_batches, reps,
               schedules=(None,), log=print):
  """Normalised throughput of each schedule (None = fill-drain, R =
  circular R) at each (K, M): every program compiled first, then the timed
  runs interleaved round-robin; a (K, M, R) the schedule refuses is
  skipped with its reason. Normalised to fill-drain at K = 2, M = 1 (or
  the first program)."""
  programs = []
  for k in stages:
    for m in micro_batches:
      for r in schedules:
        what = f'# table 2 K={k} M={m} {ScheduleName(r)}'
        problem = ScheduleProblem(layers + body.reductions, k, m, r)
        if problem:
          log(f'{what}: skipped ({problem})')
          continue
        result, _, once = Measure(body, layers, filters, k, m, True,
                                  run=True, repeats=r)
        programs.append(((k, m, r), result, once))
        log(f'{what}: compiled')
  if not programs:
    return []
  times = {key: [] for key, _, _ in programs}
  for _ in range(reps):
    for key, _, once in programs:
      times[key].append(once())
  seconds = {key: statistics.median(ts) for key, ts in times.items()}
  base_key = Table2Base([key for key, _, _ in programs])
  base = body.batch / seconds[base_key]
  base_ideal = base_key[0] * (1 - Bubble(*base_key))
  rows = []
  for (k, m, r), result, _ in programs:
    rows.append(dict(
        stages=k, micro_batches=m, schedule=ScheduleName(r),
        iterations=(r or 1) * m + k - 1, bubble=Bubble(k, m, r),
        seconds=seconds[(k, m, r)],
        examples_per_s=body.batch / seconds[(k, m, r)],
        normalized=body.batch / seconds[(k, m, r)] / base,
        ideal_normalized=k * (1 - Bubble(k, m, r)) / base_ideal,
        device_mib=DeviceBytes(result) / MIB))
  return rows


def FlagError(max_devices):
  """One line on what is wrong with the --amoeba_* flags, or None."""
  try:
    ks = [int(k) for k in FLAGS.amoeba_stages + FLAGS.amoeba_t2_stages]
    ms = [int(m) for m in FLAGS.amoeba_t2_micro_batches]
  except ValueError as e:
    return f'--amoeba_stages / --amoeba_t2_*: {e}'
  ms.append(FLAGS.amoeba_micro_batches)
  try:
    t1_repeats = ParseSchedule(FLAGS.amoeba_schedule)
  except ValueError as e:
    return f'--amoeba_schedule: {e}'
  try:
    t2_repeats = [ParseSchedule(name) for name in FLAGS.amoeba_t2_schedules]
  except ValueError as e:
    return f'--amoeba_t2_schedules: {e}'
  if not t2_repeats:
    return '--amoeba_t2_schedules lists no schedule'
  if len(set(t2_repeats)) < len(t2_repeats):
    return (f'--amoeba_t2_schedules {",".join(FLAGS.amoeba_t2_schedules)} '
            'names a schedule twice')
  r = FLAGS.amoeba_reductions
  cells = min(FLAGS.amoeba_layers, FLAGS.amoeba_t2_layers) + r
  positive = ('amoeba_budget_mib', 'amoeba_image', 'amoeba_stem_filters',
              'amoeba_batch', 'amoeba_layers', 'amoeba_t2_layers',
              'amoeba_t2_filters', 'amoeba_filter_step')
  bad = [f'--{name}' for name in positive if getattr(FLAGS, name) < 1]
  if bad:
    return f'{", ".join(bad)} must be >= 1'
  unknown = set(FLAGS.amoeba_parts) - {'table1', 'table2'}
  if unknown:
    return f'--amoeba_parts: unknown {sorted(unknown)}; use table1, table2'
  if not 0 <= r < min(FLAGS.amoeba_layers, FLAGS.amoeba_t2_layers):
    return (f'--amoeba_reductions {r} must be >= 0 and < --amoeba_layers and '
            '--amoeba_t2_layers')
  if FLAGS.amoeba_image % 2**r:
    return (f'--amoeba_image {FLAGS.amoeba_image} must be a multiple of '
            f'2^{r} (each reduction cell halves it)')
  if any(k < 1 or k > min(max_devices, cells) for k in ks):
    return (f'--amoeba_stages / --amoeba_t2_stages {sorted(set(ks))}: K must '
            f'be in 1..{min(max_devices, cells)} (devices, cells)')
  if any(m < 1 or FLAGS.amoeba_batch % m for m in ms):
    return (f'micro-batches {sorted(set(ms))} must be >= 1 and divide '
            f'--amoeba_batch {FLAGS.amoeba_batch}')
  if r and (FLAGS.amoeba_filter_step % 2 or FLAGS.amoeba_t2_filters % 2):
    return ('--amoeba_filter_step and --amoeba_t2_filters must be even '
            '(factorized reductions)')
  if 'table1' in FLAGS.amoeba_parts:
    for k in {int(k) for k in FLAGS.amoeba_stages} - {1}:
      problem = ScheduleProblem(FLAGS.amoeba_layers + r, k,
                                FLAGS.amoeba_micro_batches, t1_repeats)
      if problem:
        return f'--amoeba_schedule {FLAGS.amoeba_schedule}, K={k}: {problem}'
  return None


def Run(fmt_table, write_csv, out_dir):
  """bench_gpipe.py --body=amoebanet: the tables FLAGS select."""
  import os  # pylint: disable=g-import-not-at-top
  body = Body(FLAGS.amoeba_image, FLAGS.amoeba_stem_filters,
              FLAGS.amoeba_batch, FLAGS.amoeba_reductions)
  os.makedirs(out_dir, exist_ok=True)
  if 'table1' in FLAGS.amoeba_parts:
    start = time.time()
    settings = Table1Settings([int(k) for k in FLAGS.amoeba_stages],
                              FLAGS.amoeba_micro_batches,
                              ParseSchedule(FLAGS.amoeba_schedule))
    rows = Table1Rows(body, FLAGS.amoeba_layers, settings,
                      FLAGS.amoeba_budget_mib * MIB, FLAGS.amoeba_filter_step)
    fmt_table(
        f'Table 1 analogue: largest AmoebaNet-D(L={FLAGS.amoeba_layers}, D) '
        f'cells (+{body.reductions} reduction cells) fitting {FLAGS.amoeba_budget_mib} MiB '
        f'per device (XLA arguments + temp), {body.image}x{body.image}x'
        f'{body.channels} input, N = {body.batch}; D searched in multiples '
        f'of {FLAGS.amoeba_filter_step}; Pipeline-K (K > 1) rows '
        f'{ScheduleName(ParseSchedule(FLAGS.amoeba_schedule))}, naive-1 and '
        'Pipeline-1 one stage (no schedule to choose)',
        rows, ('row', 'stages', 'micro_batches', 'schedule', 'remat',
               'filters',
               'params', 'device_mib', 'next_filters', 'next_device_mib',
               'probes'))
    write_csv(os.path.join(out_dir, 'gpipe_amoebanet_table1.csv'), rows)
    print(f'table 1: {time.time() - start:.0f}s')
  if 'table2' in FLAGS.amoeba_parts:
    start = time.time()
    rows = Table2Rows(body, FLAGS.amoeba_t2_layers, FLAGS.amoeba_t2_filters,
                      [int(k) for k in FLAGS.amoeba_t2_stages],
                      [int(m) for m in FLAGS.amoeba_t2_micro_batches],
                      FLAGS.run_reps,
                      [ParseSchedule(n) for n in FLAGS.amoeba_t2_schedules])
    if not rows:
      print('table 2: every (K, M, schedule) was skipped; nothing measured')
      return
    base = next((r for r in rows if (r['stages'], r['micro_batches'],
                                     r['schedule']) == (2, 1, 'fill-drain')),
                rows[0])  # Table2Base's choice: rows are in program order.
    fmt_table(
        f'Table 2 analogue: normalised throughput (K = {base["stages"]}, '
        f'M = {base["micro_batches"]}, {base["schedule"]} = 1) of '
        f'AmoebaNet-D({FLAGS.amoeba_t2_layers}, {FLAGS.amoeba_t2_filters}) '
        f'cells (+{body.reductions} reduction cells), N = {body.batch}, '
        'remat; schedules fill-drain (bubble (K - 1) / (M + K - 1)) and '
        'circular R (K R chunks of cells, bubble (K - 1) / (R M + K - 1); '
        'needs M >= K and >= K R cells); interleaved runs; ideal = '
        'K (1 - bubble) normalised likewise, for K real devices (here K '
        'virtual devices share the host\'s cores)',
        rows, ('stages', 'micro_batches', 'schedule', 'iterations', 'bubble',
               'seconds', 'examples_per_s', 'normalized', 'ideal_normalized',
               'device_mib'))
    write_csv(os.path.join(out_dir, 'gpipe_amoebanet_table2.csv'), rows)
    print(f'table 2: {time.time() - start:.0f}s')
