"""Per-layer re-materialisation: XLA's memory and FLOPs with and without.

  .venv/bin/python scripts/bench_remat.py [--batch=64 --length=32]

For each 6 + 6-layer model (m4.TinyMoE12L, and m4.TinyDense made 6 + 6
deep), compiles the real train step (spmd/compile_only.py: forward,
backward, optimizer update; from shapes, nothing run) on one device with
`remat='none'` and `remat='layer'`, and prints XLA's temp bytes (the
buffers live between the forward and the backward pass among them) and
FLOPs: the memory ratio and the recompute overhead (GShard §5.1 reports
28% / 34% of cycles for its 36L / 60L models).
"""

from lingshard import startup

if __name__ == '__main__':  # A program: its start-up before TF's import.
  startup.Install()

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer('batch', 64, 'Sentences per batch.')
flags.DEFINE_integer('length', 32, 'Tokens per sentence (one bucket).')


def _Compile(key, policy, layers):
  # pylint: disable=g-import-not-at-top
  from lingshard import model_registry
  from lingshard.spmd import compile_only
  # pylint: enable=g-import-not-at-top
  params = model_registry.GetParams(key, 'Train')
  tp = params.task.Set(remat=policy, device_mesh=None,
                       num_encoder_layers=layers, num_decoder_layers=layers)
  if tp.moe_tpl is not None:
    tp.moe_tpl.device_mesh = None  # One device: no expert sharding.
  params.input.Set(bucket_upper_bounds=[FLAGS.length],
                   bucket_batch_limits=[FLAGS.batch])
  task = tp.Instantiate()
  return compile_only.CompileTrainStep(
      task, params.input.Instantiate().BatchSpec(), 1)


def main(argv):
  del argv
  print(f'batch {FLAGS.batch} x {FLAGS.length} tokens, 6 + 6 layers, one '
        'device; temp = XLA temp buffers of the train step')
  print(f'{"model":<16}{"temp none":>12}{"temp layer":>12}{"ratio":>8}'
        f'{"GFLOP none":>12}{"GFLOP layer":>13}{"extra":>8}')
  for key in ('m4.TinyMoE12L', 'm4.TinyDense'):
    none, layer = (_Compile(key, p, 6) for p in ('none', 'layer'))
    mib = 2**20
    print(f'{key:<16}{none.memory["temp"] / mib:>9.1f}MiB'
          f'{layer.memory["temp"] / mib:>9.1f}MiB'
          f'{none.memory["temp"] / layer.memory["temp"]:>7.2f}x'
          f'{none.flops / 1e9:>12.2f}{layer.flops / 1e9:>13.2f}'
          f'{layer.flops / none.flops - 1:>7.0%} ', flush=True)


if __name__ == '__main__':
  app.run(main)
