"""GShard Fig 7/8 (and Fig 2) in miniature: one MoE layer, E = D experts.

  .venv/bin/python scripts/bench_spmd_scaling.py --out_dir=/tmp/spmd_scaling

For each D in --devices, a fresh process (each D needs its own number of
virtual CPU devices) builds the MoE layer's train step (forward + backward,
lingshard.spmd.check with compare=False) with a fixed number of tokens per
device (one group of S tokens per device, G = D), partitions it with XLA's
SPMD partitioner for D devices and reads XLA's analyses of the per-device
program: FLOPs, memory (argument / output / temp), all-to-all bytes sent per
device, compile time (fastest of --compile_reps: the machine is shared),
program size. GShard's claim: per-device FLOPs and
memory stay O(1) and compile time does not depend on D (SPMD: one program).

The MPMD baseline (GShard Fig 2a) writes the same layer as an explicit graph
with one piece per device: D gating + dispatch pieces, an exchange that
slices every piece for every expert (D^2 ops), D expert FFNs and D combine
pieces. It is compiled as one XLA program on one device (the per-device
placement does not change the graph size), to show graph size and compile
time growing with D.

Prints a table, writes scaling.csv and (with matplotlib) scaling.png.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import csv
import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_list('devices', ['2', '4', '8', '16', '32', '64'],
                  'Device counts D (experts E = D).')
flags.DEFINE_integer('tokens_per_device', 128, 'Tokens per device S (one '
                     'group per device).')
flags.DEFINE_integer('model_dim', 32, 'M.')
flags.DEFINE_integer('hidden_dim', 64, 'Expert hidden dim H.')
flags.DEFINE_enum('dispatch_impl', 'einsum', ['einsum', 'gather'],
                  'MoE dispatch implementation.')
flags.DEFINE_integer('mpmd_max_devices', 32, 'Largest D for the MPMD '
                     'baseline (0 = skip it).')
flags.DEFINE_integer('compile_reps', 3, 'Compile each program this many '
                     'times and report the fastest (the machine is shared).')
flags.DEFINE_string('out_dir', '/tmp/bench_spmd_scaling',
                    'Where to write the CSV and the PNG.')
flags.DEFINE_enum('worker', None, ['spmd', 'mpmd'], 'Internal: measure one '
                  'D in this process and print one JSON line.')
flags.DEFINE_integer('worker_devices', 0, 'Internal: D of the worker.')

_FIELDS = ('mode', 'devices', 'experts', 'tokens_per_device', 'capacity',
           'flops_per_device', 'mem_argument', 'mem_output', 'mem_temp',
           'mem_total', 'all_to_all_bytes', 'all_gather_bytes',
           'compile_seconds', 'export_seconds', 'program_instructions',
           'partitioned_instructions')


def _Inputs(d, s, m):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  x = rng.normal(size=[d, s, m]).astype(np.float32)
  return x, np.zeros([d, s], np.float32)


def _LayerParams(d):
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard.layers.moe import top2
  # pylint: enable=g-import-not-at-top
  p = top2.MoELayer.Params().Set(
      name='moe', input_dim=FLAGS.model_dim, hidden_dim=FLAGS.hidden_dim,
      num_experts=d, num_groups=d, capacity_factor=1.0,  # C = 2S/E (§2.2)
      dispatch_impl=FLAGS.dispatch_impl, second_expert_policy='all')
  return top2.MoELayer.SetExpertSharding(p, np.arange(d))


def _SpmdWorker(d):
  """One SPMD-partitioned train step of the MoE layer on D devices."""
  # pylint: disable=g-import-not-at-top
  from lingshard.layers.moe import routing
  from lingshard.spmd import check
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  xla_runtime.ConfigureCpuDevices(d)
  s = FLAGS.tokens_per_device
  x, paddings = _Inputs(d, s, FLAGS.model_dim)
  r = check.CheckLayerParams(
      _LayerParams(d), d, [x, paddings],
      input_split_dims_mapping=[[0, -1, -1], [0, -1]],
      grad_outputs=['out[0]', 'out[1].aux_loss'], compare=False)
  compile_seconds = min([r.compile_seconds] + [
      xla_runtime.CompileSpmd(r.exported_hlo, d).compile_seconds
      for _ in range(FLAGS.compile_reps - 1)])
  moved = {k: sum(c.moved_bytes for c in r.CollectivesOf(k))
           for k in ('all-to-all', 'all-gather')}
  m = r.memory
  return dict(
      mode='spmd', devices=d, experts=d, tokens_per_device=s,
      capacity=routing.ExpertCapacity(s, d, 1.0), flops_per_device=r.flops,
      mem_argument=m['argument'], mem_output=m['output'],
      mem_temp=m['temp'],
      mem_total=m['argument'] + m['output'] + m['temp'] - m['alias'],
      all_to_all_bytes=moved['all-to-all'],
      all_gather_bytes=moved['all-gather'],
      compile_seconds=compile_seconds, export_seconds=r.export_seconds,
      program_instructions=r.program_size,
      partitioned_instructions=r.partitioned_size)


def _MpmdStep(d, s, m, h):
  """The MoE train step as D explicit per-device pieces (GShard Fig 2a)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from lingshard.layers.moe import dispatch as moe_dispatch
  from lingshard.layers.moe import routing as moe_routing
  from lingshard.layers.moe import top2
  # pylint: enable=g-import-not-at-top
  e, c = d, moe_routing.ExpertCapacity(s, d, 1.0)

  def Step(x, wg, wi, wo):
    """x [D, S, M]; wi, wo: lists of D per-expert weights."""
    params = [wg] + wi + wo
    with tf.GradientTape() as tape:
      tape.watch(params)
      xs = tf.unstack(x)                 # device d's group [S, M]
      dispatched, combines, aux = [], [], []
      for x_d in xs:                     # gating + dispatch on device d
        logits = tf.einsum('sm,me->se', x_d, wg)[tf.newaxis]
        routing, aux_loss, _ = top2.Top2Gating(logits, tf.ones([1, s]), c,
                                                 'all')
        combines.append(moe_dispatch.CombineWeightsGSEC(routing, e, c)[0])
        mask = moe_dispatch.DispatchMaskGSEC(routing, e, c)[0]
        dispatched.append(tf.einsum('sec,sm->ecm', mask, x_d))
        aux.append(aux_loss)
      expert_out = []
      for k in range(e):                 # expert k on device k
        x_k = tf.stack([dispatched[j][k] for j in range(d)])  # [D, C, M]
        hid = tf.nn.relu(tf.einsum('dcm,mh->dch', x_k, wi[k]))
        expert_out.append(tf.einsum('dch,hm->dcm', hid, wo[k]))
      loss = tf.add_n(aux)
      for j in range(d):                 # combine on device j
        y_j = tf.stack([expert_out[k][j] for k in range(e)])  # [E, C, M]
        out = tf.einsum('sec,ecm->sm', combines[j], y_j)
        loss += tf.reduce_sum(out * out)
    return [loss] + tape.gradient(loss, params)

  return Step


def _MpmdWorker(d):
  """Compiles the MPMD-style program for D devices on one device."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  from lingshard.spmd import check
  from lingshard.spmd import xla_runtime
  # pylint: enable=g-import-not-at-top
  xla_runtime.ConfigureCpuDevices(1)
  s, m, h = FLAGS.tokens_per_device, FLAGS.model_dim, FLAGS.hidden_dim
  rng = np.random.RandomState(0)
  x, _ = _Inputs(d, s, m)
  wg = rng.normal(size=[m, d]).astype(np.float32)
  wi = [rng.normal(size=[m, h]).astype(np.float32) for _ in range(d)]
  wo = [rng.normal(size=[h, m]).astype(np.float32) for _ in range(d)]
  fn = tf.function(_MpmdStep(d, s, m, h), jit_compile=True, autograph=False)
  start = time.perf_counter()
  hlo = fn.experimental_get_compiler_ir(x, wg, wi, wo)(
      stage='hlo_serialized')
  export_seconds = time.perf_counter() - start
  exe = xla_runtime.CompileSpmd(hlo, 1)
  compile_seconds = min([exe.compile_seconds] + [
      xla_runtime.CompileSpmd(hlo, 1).compile_seconds
      for _ in range(FLAGS.compile_reps - 1)])
  return dict(
      mode='mpmd', devices=d, experts=d, tokens_per_device=s, capacity='',
      # Total work of the D pieces / D (the same math as the SPMD step).
      flops_per_device=exe.CostAnalysis().get('flops', 0.0) / d,
      # One program for all pieces: its memory is not a per-device figure.
      mem_argument='', mem_output='', mem_temp='', mem_total='',
      all_to_all_bytes='', all_gather_bytes='',
      compile_seconds=compile_seconds, export_seconds=export_seconds,
      program_instructions=check.ProgramSize(hlo),
      partitioned_instructions='')


def _RunWorker(mode, d):
  """Runs one measurement in a fresh process; returns its dict."""
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env['PYTHONPATH'] = os.pathsep.join(
      [root] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  args = [sys.executable, os.path.abspath(__file__), f'--worker={mode}',
          f'--worker_devices={d}',
          f'--tokens_per_device={FLAGS.tokens_per_device}',
          f'--model_dim={FLAGS.model_dim}', f'--hidden_dim={FLAGS.hidden_dim}',
          f'--dispatch_impl={FLAGS.dispatch_impl}',
          f'--compile_reps={FLAGS.compile_reps}']
  proc = subprocess.run(args, env=env, capture_output=True, text=True,
                        check=False)
  lines = [x for x in proc.stdout.splitlines() if x.startswith('{')]
  if proc.returncode != 0 or not lines:
    raise RuntimeError(f'{mode} D={d} failed (exit {proc.returncode}):\n'
                       f'{proc.stderr[-3000:]}')
  return json.loads(lines[-1])


def _Fmt(v):
  if isinstance(v, float):
    return f'{v:.3g}' if v < 1000 else f'{v:,.0f}'
  if isinstance(v, int):
    return f'{v:,}'
  return str(v)


def _PrintTable(rows):
  cols = ('mode', 'devices', 'capacity', 'flops_per_device', 'mem_total',
          'mem_temp', 'all_to_all_bytes', 'all_gather_bytes',
          'compile_seconds', 'program_instructions',
          'partitioned_instructions')
  table = [cols] + [tuple(_Fmt(r[c]) for c in cols) for r in rows]
  widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
  for row in table:
    print('  '.join(v.rjust(w) for v, w in zip(row, widths)))


def _Ratios(rows, lo, hi):
  spmd = {r['devices']: r for r in rows if r['mode'] == 'spmd'}
  if lo not in spmd or hi not in spmd:
    return
  print(f'\nSPMD growth from D={lo} to D={hi} (goal: <= 1.2x FLOPs and '
        'memory, <= 1.5x compile time):')
  for key in ('flops_per_device', 'mem_total', 'compile_seconds',
              'all_to_all_bytes', 'program_instructions'):
    a, b = spmd[lo][key], spmd[hi][key]
    print(f'  {key:<24} {_Fmt(a):>12} -> {_Fmt(b):>12}  '
          f'x{b / a if a else float("nan"):.2f}')


def _Plot(rows, path):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    print('matplotlib not installed: no PNG (pip install matplotlib)')
    return
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  panels = (('flops_per_device', 'FLOPs per device'),
            ('mem_total', 'memory per device (bytes)'),
            ('all_to_all_bytes', 'all-to-all bytes sent per device'),
            ('compile_seconds', 'compile time (s)'))
  fig, axes = plt.subplots(1, 4, figsize=(18, 4))
  for ax, (key, title) in zip(axes, panels):
    for mode, style in (('spmd', 'o-'), ('mpmd', 's--')):
      pts = [(r['devices'], r[key]) for r in rows
             if r['mode'] == mode and r[key] != '']
      if pts:
        ax.plot(*zip(*pts), style, label=mode.upper())
    ax.set_xscale('log', base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel('devices D (= experts E)')
    ax.set_title(title)
    ax.legend()
  fig.suptitle('One MoE layer, fixed tokens per device (GShard Fig 7/8, '
               'Fig 2 in miniature)')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f'wrote {path}')


def main(argv):
  del argv
  if FLAGS.worker:
    d = FLAGS.worker_devices
    row = _SpmdWorker(d) if FLAGS.worker == 'spmd' else _MpmdWorker(d)
    print(json.dumps(row))
    return
  rows = []
  for d in sorted(int(x) for x in FLAGS.devices):
    modes = ['spmd'] + (['mpmd'] if d <= FLAGS.mpmd_max_devices else [])
    for mode in modes:
      start = time.time()
      rows.append(_RunWorker(mode, d))
      print(f'# {mode} D={d}: {time.time() - start:.1f}s', flush=True)
  rows.sort(key=lambda r: (r['mode'] != 'spmd', r['devices']))
  print()
  _PrintTable(rows)
  _Ratios(rows, 4, max(int(x) for x in FLAGS.devices))
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  path = os.path.join(FLAGS.out_dir, 'scaling.csv')
  with open(path, 'w', newline='', encoding='utf-8') as f:
    writer = csv.DictWriter(f, fieldnames=_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
  print(f'wrote {path}')
  _Plot(rows, os.path.join(FLAGS.out_dir, 'scaling.png'))


if __name__ == '__main__':
  app.run(main)
