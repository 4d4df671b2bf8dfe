"""The evidence page's experiments that run the repository's benchmark
scripts (scripts/bench_*.py), each with the machine to itself: the step
benchmark behind every equal wall-clock budget, the SPMD scaling and MoE
layer speed section, and the GPipe sections (the Transformer stack's
§2.3 tables, AmoebaNet's Tables 1 and 2)."""

import os
import subprocess
import sys

from lingshard.experiments import runs as runs_lib


# The checkout this package is in: the scripts are found from any working
# directory (the commands are shown from the repository root, as run there).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def RunScript(ctx, argv, log_name):
  """Runs a repository script (argv[0], relative to the repository) with
  the machine to itself; returns (the command shown, stdout)."""
  script = os.path.join(REPO, argv[0])
  if not os.path.isfile(script):
    raise RuntimeError(f'{script} not found: the benchmark scripts come with '
                       'a checkout of the repository (pip install -e .)')
  shown = runs_lib.Shown([sys.executable] + argv)
  cmd = [sys.executable, script] + argv[1:]
  print(f'  $ {shown}', flush=True)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        check=False)  # Data paths: the working directory's.
  os.makedirs(ctx.work_dir, exist_ok=True)
  with open(os.path.join(ctx.work_dir, log_name), 'w', encoding='utf-8') as f:
    f.write(proc.stdout + proc.stderr)
  if proc.returncode:
    raise RuntimeError(f'exit {proc.returncode}: {shown}\n'
                       f'{proc.stderr[-2000:]}')
  return shown, proc.stdout


def BenchStep(ctx, models, mode, variants=(), data_dir=None, reps=None,
              batches=None):
  """{variant name: ms/step} from scripts/bench_step.py (interleaved), on
  `data_dir` (default: the translation corpus), `reps` x `batches`
  (default: the mode's bench_step_reps / _batches)."""
  cfg = ctx.cfg
  data_dir = data_dir or ctx.data_dir
  argv = ['scripts/bench_step.py', '--models', *models, '--modes', mode,
          '--reps', str(reps or cfg['bench_step_reps']), '--batches',
          str(batches or cfg['bench_step_batches']), '--data_dir', data_dir]
  if ctx.params_override and data_dir == ctx.data_dir:
    argv.append(f'--params_override={ctx.params_override}')
  for v in variants:
    argv.append(f'--variant={v}')
  tag = '' if data_dir == ctx.data_dir else '_' + os.path.basename(
      os.path.normpath(data_dir))
  shown, out = RunScript(ctx, argv, f'bench_step_{mode}_{len(models)}{tag}.log')
  ms = {}
  for line in out.splitlines():
    parts = line.split()
    if len(parts) == 5 and parts[0] == mode:
      ms[parts[1]] = float(parts[2])
  return dict(command=shown, ms_per_step=ms, output=out)


def _ReadCsv(path):
  with open(path, encoding='utf-8') as f:
    rows = [line.rstrip('\n').split(',') for line in f if line.strip()]
  return dict(header=rows[0], rows=rows[1:])


def Speed(ctx):
  cfg = ctx.cfg
  res_dir = os.path.join(ctx.out_dir, 'results')
  spmd_dir = os.path.join(ctx.work_dir, 'spmd_scaling')
  shown_spmd, out_spmd = RunScript(ctx, [
      'scripts/bench_spmd_scaling.py', f'--out_dir={spmd_dir}',
      f'--devices={cfg["spmd_devices"]}'], 'bench_spmd_scaling.log')
  png = os.path.join(spmd_dir, 'scaling.png')
  if os.path.exists(png):
    os.replace(png, os.path.join(res_dir, 'spmd_scaling.png'))
  shown_moe, out_moe = RunScript(ctx, [
      'scripts/bench_moe.py', '--experts', *cfg['moe_experts'].split(),
      '--reps', str(cfg['moe_reps'])], 'bench_moe.log')
  return dict(spmd=dict(command=shown_spmd, output=out_spmd,
                        csv=_ReadCsv(os.path.join(spmd_dir, 'scaling.csv'))),
              moe=dict(command=shown_moe, output=out_moe))


def Gpipe(ctx):
  out_dir = os.path.join(ctx.work_dir, 'gpipe')
  # bench_gpipe.py's own --quick subset in the full run (its full table
  # takes 24 min on 2 cores).
  argv = ['scripts/bench_gpipe.py', f'--out_dir={out_dir}',
          *ctx.cfg['gpipe_args']]
  shown, out = RunScript(ctx, argv, 'bench_gpipe.log')
  png = os.path.join(out_dir, 'gpipe.png')
  if os.path.exists(png):
    os.replace(png, os.path.join(ctx.out_dir, 'results', 'gpipe.png'))
  return dict(command=shown, output=out,
              memory=_ReadCsv(os.path.join(out_dir, 'gpipe_memory.csv')),
              efficiency=_ReadCsv(os.path.join(out_dir,
                                               'gpipe_efficiency.csv')),
              schedule=_ReadCsv(os.path.join(out_dir,
                                             'gpipe_schedule.csv')))


def GpipeImage(ctx):
  """GPipe Tables 1 and 2 for AmoebaNet-D cells: bench_gpipe.py
  --body=amoebanet (bench_gpipe_image.py) with the mode's args; a table
  the args leave out is None."""
  out_dir = os.path.join(ctx.work_dir, 'gpipe_image')
  argv = ['scripts/bench_gpipe.py', '--body=amoebanet',
          f'--out_dir={out_dir}', *ctx.cfg['gpipe_image_args']]
  shown, out = RunScript(ctx, argv, 'bench_gpipe_image.log')
  tables = {}
  for key in ('table1', 'table2'):
    path = os.path.join(out_dir, f'gpipe_amoebanet_{key}.csv')
    tables[key] = _ReadCsv(path) if os.path.exists(path) else None
  # The (K, M, schedule) the schedule refused, as the script printed them.
  skipped = [line[2:] for line in out.splitlines()
             if line.startswith('# table 2 ') and ': skipped (' in line]
  return dict(bench=dict(command=shown), output=out, skipped=skipped,
              **tables)
