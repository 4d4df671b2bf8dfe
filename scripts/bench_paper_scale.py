"""GShard Table 1 configs at their real scale, proved by XLA's partitioner.

  .venv/bin/python scripts/bench_paper_scale.py --out_dir=/tmp/paper_scale

Nothing here runs a step: every program is lowered from TensorFlow with
tf.TensorSpec arguments (no weight or batch is ever allocated) and
partitioned + compiled by XLA's SPMD partitioner (the pinned jaxlib) for
the config's real device count on virtual CPU devices.

1. Memory (one row per Table 1 config, D = its 128 / 512 / 2048 devices).
   The *slice* is one encoder MoE layer + one dense Transformer layer of the
   config (its M, H, E, heads, groups, dropout, dtype, mesh and split
   mappings) under the real train step (TrainStep.Pure: forward, backward,
   Adafactor update, finiteness guard) on the config's per-device batch
   (its largest bucket: `--length` tokens x the bucket's sentences / D).
   Reported per device:
   - weights, adafactor: the whole model's shards (count_params, exact);
   - activations (incl. the layers' gradients): XLA's temp bytes of the
     slice's step, plus (L/2 - 1) x what one more layer pair adds to it
     (the same slice with 2 pairs, compiled too), plus the softmax logits
     and their gradient (float32 [tokens, V], analytic); an estimate:
     decoder layers also have cross-attention;
   - all_to_all: bytes of the all-to-all results of one slice step (XLA's
     partitioned program) x L/2;
   - slice_argument / slice_temp: XLA's own figures for the slice;
   - remat: the config's per-layer re-materialisation (mt_model remat;
     the slice is compiled with it), remat_extra_flops: XLA's FLOPs of the
     slice step with remat='layer' over remat='none', minus 1 (the
     recompute overhead; GShard §5.1: 28% / 34% of cycles for 36L / 60L);
   - total = weights + adafactor + activations, vs a TPU v3 core's 16 GiB.
2. Compile scaling (GShard Fig. 8): the same slice shape with E = D experts
   and G = D groups, a fixed 2048 tokens per device, for D = 2 ... 2048:
   per-device program size (HLO instructions) right after the partitioner
   and after the CPU backend's own passes, and compile time: the
   partitioner's share (XLA's sharding-propagation + spmd-partitioning
   passes, from XLA's per-pass timing log at vlog 2) next to the whole
   compile (CPU backend: its HLO passes and LLVM code generation).

Prints both tables, writes paper_scale_memory.csv, paper_scale_compile.csv
and paper_scale.png.
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

import csv
import json
import os
import re
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
TABLE1 = ['m4.MoE128E12L', 'm4.MoE128E36L', 'm4.MoE512E12L', 'm4.MoE512E36L',
          'm4.MoE2048E12L', 'm4.MoE2048E36L', 'm4.MoE2048E60L']
flags.DEFINE_list('configs', TABLE1, 'Registered configs (memory table).')
flags.DEFINE_list('scaling_devices', [str(2**i) for i in range(1, 12)],
                  'D of the compile-scaling table (E = G = D).')
flags.DEFINE_integer('length', 128, 'Sequence length of the bucket used.')
flags.DEFINE_integer('scaling_tokens_per_device', 2048,
                     'Tokens per device of the compile-scaling slice.')
flags.DEFINE_string('out_dir', '/tmp/bench_paper_scale', 'Output directory.')
flags.DEFINE_enum('worker', None, ['memory', 'scaling'], 'Internal.')
flags.DEFINE_string('worker_arg', '', 'Internal: config key or D.')

HBM_BYTES = 16 * 2**30  # One TPU v3 core.
GIB = 2**30


def _SliceTaskClass():
  """A BaseTask: the config's 2-layer encoder stack (dense, then MoE) on
  embedded inputs; loss = mean(out^2) + aux (any loss that touches every
  output trains every weight; the step's math is TrainStep's)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from lingshard.models import base_model
  from lingshard.nested_map import NestedMap
  # pylint: enable=g-import-not-at-top

  class SliceTask(base_model.BaseTask):

    @classmethod
    def Params(cls):
      p = super().Params()
      p.Define('stack', None, 'TransformerStack params.')
      return p

    def __init__(self, params):
      super().__init__(params)
      self.CreateChild('stack', self.params.stack)

    def ComputePredictions(self, theta, input_batch, step=None, **kwargs):
      del kwargs
      return self.stack.FProp(theta.stack, input_batch.x,
                              input_batch.paddings, step=step)

    def ComputeLoss(self, theta, predictions, input_batch):
      out, aux = predictions
      aux_loss = tf.add_n([tf.cast(a.aux_loss, tf.float32)
                           for a in aux.values()] or [tf.constant(0.0)])
      loss = tf.reduce_mean(tf.square(tf.cast(out, tf.float32))) + aux_loss
      return NestedMap(loss=(loss, tf.constant(1.0)),
                       aux_loss=(aux_loss, tf.constant(1.0))), NestedMap()

  return SliceTask


def _SliceParams(task_p, mesh, num_experts=None, num_groups=None,
                 num_layers=2, remat=None):
  """SliceTask params from an MT config's task params."""
  # pylint: disable=g-import-not-at-top
  from lingshard.layers import transformer
  from lingshard.layers.moe import top2
  # pylint: enable=g-import-not-at-top
  moe_p = task_p.moe_tpl.Copy()
  if num_experts:
    moe_p.Set(num_experts=num_experts, num_groups=num_groups)
    moe_p = top2.MoELayer.SetExpertSharding(moe_p, mesh)
  stack = transformer.TransformerStack.Params().Set(
      name='enc', model_dim=task_p.model_dim, hidden_dim=task_p.hidden_dim,
      num_heads=task_p.num_heads, dim_per_head=task_p.dim_per_head,
      num_layers=num_layers, moe_tpl=moe_p,
      remat=task_p.remat if remat is None else remat,
      residual_dropout_prob=task_p.residual_dropout_prob,
      atten_dropout_prob=task_p.atten_dropout_prob)
  p = _SliceTaskClass().Params().Set(
      name='slice', stack=stack, device_mesh=mesh,
      mesh_axis_names=task_p.mesh_axis_names, fprop_dtype=task_p.fprop_dtype)
  p.train = task_p.train.Copy()
  return p


def _CompileSlice(slice_p, num_devices, batch, length):
  """Exports the slice's train step from specs, partitions + compiles it
  for `num_devices` (spmd/compile_only.py); returns XLA's figures."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from lingshard.nested_map import NestedMap
  from lingshard.spmd import compile_only
  # pylint: enable=g-import-not-at-top
  task = slice_p.Instantiate()
  m = slice_p.stack.model_dim
  # The stack's input is an embedding output: in the activation dtype.
  batch_spec = NestedMap(x=tf.TensorSpec([batch, length, m],
                                         task.fprop_dtype),
                         paddings=tf.TensorSpec([batch, length], tf.float32))
  r = compile_only.CompileTrainStep(task, batch_spec, num_devices)
  a2a = r.CollectivesOf('all-to-all')
  mem = r.memory
  return dict(
      devices=num_devices, batch=batch, length=length,
      slice_argument=mem['argument'], slice_output=mem['output'],
      slice_temp=mem['temp'], slice_alias=mem['alias'],
      slice_flops=r.flops,
      all_to_all_slice=sum(c.bytes for c in a2a), all_to_all_ops=len(a2a),
      export_seconds=r.export_seconds, compile_seconds=r.compile_seconds,
      program_instructions=r.program_size,
      partitioned_instructions=r.partitioned_size)


def _MemoryWorker(key):
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard import config_check
  from lingshard import model_registry
  from lingshard.tools import count_params
  # pylint: enable=g-import-not-at-top
  params = model_registry.GetParams(key, 'Train')
  task = config_check.Validate(params)
  counts = count_params.CountTask(task)
  tp = params.task
  mesh = np.asarray(tp.device_mesh)
  bounds = list(params.input.bucket_upper_bounds)
  batch = params.input.bucket_batch_limits[bounds.index(FLAGS.length)]
  row = _CompileSlice(_SliceParams(tp, mesh), mesh.size, batch,
                      FLAGS.length)
  # XLA's temp of 2 layer pairs minus 1: what each pair keeps for the
  # backward pass (activations, its gradients); the rest of the slice's
  # temp is the step's transient peak, counted once.
  two = _CompileSlice(_SliceParams(tp, mesh, num_layers=4), mesh.size, batch,
                      FLAGS.length)
  per_pair = two['slice_temp'] - row['slice_temp']
  # Recompute overhead (GShard §5.1: 28% / 34% of cycles for 36L / 60L):
  # XLA's FLOPs of the slice step with per-layer remat over without.
  other = 'none' if tp.remat == 'layer' else 'layer'
  flops = {tp.remat: row['slice_flops'], other: _CompileSlice(
      _SliceParams(tp, mesh, remat=other), mesh.size, batch,
      FLAGS.length)['slice_flops']}
  pairs = (tp.num_encoder_layers + tp.num_decoder_layers) // 2
  tokens = batch * FLAGS.length // mesh.size
  # Softmax logits and their gradient, float32 [tokens, V] (not in the
  # slice; the batch is split over the mesh, the vocabulary is not).
  softmax = 2 * 4 * tokens * tp.tgt_vocab_size
  row.update(
      config=key, layers=2 * pairs, experts=tp.moe_tpl.num_experts,
      remat=tp.remat,
      remat_extra_flops=flops['layer'] / flops['none'] - 1.0,
      groups=tp.moe_tpl.num_groups, tokens_per_device=tokens,
      fprop_dtype=getattr(tp.fprop_dtype, 'name', str(tp.fprop_dtype)),
      weights=counts.weight_bytes_per_device,
      adafactor=counts.adafactor_bytes_per_device,
      per_pair_temp=per_pair, softmax=softmax,
      activations=row['slice_temp'] + per_pair * (pairs - 1) + softmax,
      all_to_all=row['all_to_all_slice'] * pairs)
  row['total'] = row['weights'] + row['adafactor'] + row['activations']
  row['fits_16GiB'] = row['total'] <= HBM_BYTES
  return row


def _ScalingWorker(d):
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from lingshard import model_registry
  # pylint: enable=g-import-not-at-top
  tp = model_registry.GetParams('m4.MoE2048E36L', 'Train').task
  batch = FLAGS.scaling_tokens_per_device * d // FLAGS.length
  row = _CompileSlice(_SliceParams(tp, np.arange(d), num_experts=d,
                                   num_groups=d), d, batch, FLAGS.length)
  row.update(experts=d, tokens_per_device=FLAGS.scaling_tokens_per_device)
  return row


# XLA's HloPassPipeline log (vlog 2): "HLO pass: dce time: 16.4 ms (16360
# us) (cumulative: ...)" after each pass, "Number of instructions: N"
# before each pass.
_PASS_RE = re.compile(r'HLO pass: (\S+) time: [^(]*\((\d+) us\)')
_SIZE_RE = re.compile(r'Number of instructions: (\d+)')
# The GSPMD partitioner: sharding propagation, then partitioning (which
# runs its own cleanup pipeline inside its logged time).
PARTITIONER_PASSES = ('sharding-propagation', 'spmd-partitioning')


def XlaPassLog(log_text):
  """(partitioner seconds, seconds of all HLO passes, instructions of the
  module right after spmd-partitioning) from XLA's pass log."""
  partitioner = total = 0.0
  size, after_spmd = None, False
  for line in log_text.splitlines():
    m = _PASS_RE.search(line)
    if m:
      seconds = int(m.group(2)) / 1e6
      total += seconds
      if m.group(1) in PARTITIONER_PASSES:
        partitioner += seconds
      after_spmd = after_spmd or m.group(1) == 'spmd-partitioning'
      continue
    m = _SIZE_RE.search(line)
    if m and after_spmd and size is None:
      size = int(m.group(1))
  return partitioner, total, size


def _RunWorker(kind, arg):
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env['PYTHONPATH'] = os.pathsep.join(
      [root] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  # XLA's HloPassPipeline logs each pass's time at vlog 2.
  env.update(TF_CPP_MIN_LOG_LEVEL='0', TF_CPP_VMODULE='hlo_pass_pipeline=2')
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), f'--worker={kind}',
       f'--worker_arg={arg}', f'--length={FLAGS.length}',
       f'--scaling_tokens_per_device={FLAGS.scaling_tokens_per_device}'],
      env=env, capture_output=True, text=True, check=False)
  lines = [x for x in proc.stdout.splitlines() if x.startswith('{')]
  if proc.returncode != 0 or not lines:
    raise RuntimeError(f'{kind} {arg} failed (exit {proc.returncode}):\n'
                       f'{proc.stderr[-3000:]}')
  row = json.loads(lines[-1])
  (row['partitioner_seconds'], row['hlo_passes_seconds'],
   row['spmd_instructions']) = XlaPassLog(proc.stderr)
  return row


def _Table(rows, cols, fmt):
  table = [cols] + [tuple(fmt(c, r[c]) for c in cols) for r in rows]
  widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
  for row in table:
    print('  '.join(v.rjust(w) for v, w in zip(row, widths)))


def _Fmt(col, v):
  if col in ('weights', 'adafactor', 'activations', 'all_to_all', 'total',
             'slice_argument', 'slice_temp', 'per_pair_temp', 'softmax'):
    return f'{v / GIB:.2f}'
  if isinstance(v, float):
    return f'{v:.2f}'
  if isinstance(v, bool):
    return 'yes' if v else 'NO'
  return f'{v:,}' if isinstance(v, int) else str(v)


def _Write(rows, path):
  with open(path, 'w', newline='', encoding='utf-8') as f:
    writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
    writer.writeheader()
    writer.writerows(rows)
  print(f'wrote {path}')


def _Plot(memory, scaling, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(20, 5))
  if memory:
    names = [r['config'].split('.')[1] for r in memory]
    bottom = [0.0] * len(memory)
    for key in ('weights', 'adafactor', 'activations'):
      vals = [r[key] / GIB for r in memory]
      ax0.bar(names, vals, bottom=bottom, label=key)
      bottom = [b + v for b, v in zip(bottom, vals)]
    ax0.axhline(16, color='k', linestyle='--', label='TPU v3 core HBM')
    ax0.set_ylabel('GiB per device')
    ax0.set_title('Per-device memory (train step)')
    ax0.tick_params(axis='x', rotation=30)
    ax0.legend()
  if scaling:
    ds = [r['devices'] for r in scaling]
    ax1.plot(ds, [r['compile_seconds'] for r in scaling], 'o-',
             label='whole compile (CPU backend)')
    ax1.plot(ds, [r['partitioner_seconds'] for r in scaling], 's-',
             label='GSPMD partitioner (propagation + partitioning)')
    ax1.set_xscale('log', base=2)
    ax1.set_xlabel('devices D (= experts = groups)')
    ax1.set_ylabel('seconds')
    ax1.set_title('Compile time (GShard Fig. 8)')
    ax1.legend()
    ax2.plot(ds, [r['spmd_instructions'] for r in scaling], 's-',
             label='after the partitioner')
    ax2.plot(ds, [r['partitioned_instructions'] for r in scaling], 'o-',
             label='after the CPU backend')
    ax2.set_xscale('log', base=2)
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel('devices D')
    ax2.set_title('Per-device program (HLO instructions)')
    ax2.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f'wrote {path}')


def main(argv):
  del argv
  if FLAGS.worker:
    # pylint: disable=g-import-not-at-top
    from lingshard.spmd import xla_runtime
    # pylint: enable=g-import-not-at-top
    if FLAGS.worker == 'memory':
      from lingshard import model_registry  # pylint: disable=g-import-not-at-top
      import numpy as np  # pylint: disable=g-import-not-at-top
      d = int(np.size(model_registry.GetParams(FLAGS.worker_arg).task
                      .device_mesh))
      xla_runtime.ConfigureCpuDevices(d)
      print(json.dumps(_MemoryWorker(FLAGS.worker_arg)))
    else:
      xla_runtime.ConfigureCpuDevices(int(FLAGS.worker_arg))
      print(json.dumps(_ScalingWorker(int(FLAGS.worker_arg))))
    return
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  memory, scaling = [], []
  for key in FLAGS.configs:
    start = time.time()
    memory.append(_RunWorker('memory', key))
    print(f'# memory {key}: {time.time() - start:.0f}s '
          f'{json.dumps(memory[-1])}', flush=True)
  for d in sorted(int(x) for x in FLAGS.scaling_devices):
    start = time.time()
    scaling.append(_RunWorker('scaling', d))
    print(f'# scaling D={d}: {time.time() - start:.0f}s '
          f'{json.dumps(scaling[-1])}', flush=True)
  if memory:
    print('\nPer-device memory, GiB (TPU v3 core: 16 GiB); slice = 1 dense '
          '+ 1 MoE encoder layer train step (module docstring):')
    _Table(memory, ('config', 'devices', 'tokens_per_device', 'fprop_dtype',
                    'remat', 'remat_extra_flops', 'weights', 'adafactor',
                    'activations', 'all_to_all',
                    'total', 'fits_16GiB', 'slice_argument', 'slice_temp',
                    'per_pair_temp', 'softmax', 'compile_seconds'), _Fmt)
    _Write(memory, os.path.join(FLAGS.out_dir, 'paper_scale_memory.csv'))
  if scaling:
    print('\nCompile scaling (E = G = D, fixed tokens per device):')
    _Table(scaling, ('devices', 'program_instructions', 'spmd_instructions',
                     'partitioned_instructions', 'partitioner_seconds',
                     'hlo_passes_seconds', 'compile_seconds',
                     'export_seconds'), _Fmt)
    lo, hi = scaling[0], scaling[-1]
    for key in ('spmd_instructions', 'partitioner_seconds',
                'partitioned_instructions', 'compile_seconds'):
      print(f'D={lo["devices"]} -> D={hi["devices"]}: {key} '
            f'x{hi[key] / max(lo[key], 1e-9):.2f}')
    _Write(scaling, os.path.join(FLAGS.out_dir, 'paper_scale_compile.csv'))
  _Plot(memory, scaling, os.path.join(FLAGS.out_dir, 'paper_scale.png'))


if __name__ == '__main__':
  app.run(main)
