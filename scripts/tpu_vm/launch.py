"""Runs the lingshard trainer as a batch job on a Cloud TPU VM or pod slice.

  python scripts/tpu_vm/launch.py --name=ls-m4 --zone=us-central2-b \
      --project=my-project --accelerator_type=v4-32 \
      --model=m4.MoE128E12L --logdir=gs://my-bucket/runs/m4 \
      [--trainer_args="--params_override=task.train.max_steps=1000"] \
      [--source=local | git+https://...@ref] [--spot] [--keep] [--dry_run]

  # The batch decode job: every --decode_input shard (the eval input's
  # format, e.g. lang<TAB>source<TAB>target TSV files) decoded with the
  # logdir's latest checkpoint into <decode_output>/<shard>.hyp.txt; a rerun
  # skips the shards whose output is complete.
  python scripts/tpu_vm/launch.py ... --mode=decode \
      --decode_input='gs://my-bucket/in/part-*.tsv' \
      --decode_output=gs://my-bucket/out/m4

Steps (each printed as `+ command` before it runs; --dry_run only prints):
  1. describe the TPU VM; create it if it does not exist (reuse otherwise);
  2. install lingshard on every worker: the local checkout's HEAD as a
     `git archive` tarball copied with `tpu-vm scp`, or a pip git URL;
     plus the TPU build of TensorFlow;
  3. start the trainer on every worker (`--strategy=tpu --tpu=local`; the
     hosts of a pod slice find each other through the TPU runtime), in the
     background with its output in ~/lingshard-train.log and its exit code in
     ~/lingshard-train.exit (decode: ~/lingshard-decode.*), so a dropped ssh
     connection does not kill it;
  4. stream worker 0's log until the trainer exits;
  5. copy every worker's log to <logdir>/tpu_vm_logs/ (<host>.log, decode:
     <host>-decode.log) and collect the exit codes;
  6. delete the TPU VM if this run created it (unless --keep).

Before any command, --trainer_args are parsed by the trainer's own flag
parser (an unknown flag or a stray word, e.g. `; touch x`, is refused in
one line) and the model is checked against the slice (the params
the trainer will build, --trainer_args' overrides included; for decode the
decode dataset's inference params, and the
accelerator's device and host counts, lingshard/train/tpu_topology.py): a
mesh that does not tile the slice or a batch that does not split over its
replicas is refused with one line, and the job's shape (devices, hosts,
replicas, logdir) is printed to stderr. That check imports lingshard from
this checkout (TensorFlow installed, as for the laptop proof);
--skip_topology_check skips both (e.g. a --source whose registry or flags
differ).

Local commands run as argv lists (no local shell). Every value put into a
command string that a worker's shell runs (model, logdir, mode, trainer
args, pip source and extras) is shell-quoted word by word, so it reaches
the trainer / pip / gcloud as the same bytes; --trainer_args and
--pip_extra are split into words like a shell command line first.

Apart from that check, only the Python standard library is used.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TARBALL = 'lingshard-src.tar.gz'
DEFAULT_PIP = ('tensorflow-tpu -f '
               'https://storage.googleapis.com/libtpu-tf-releases/index.html')
# Cloud resource names: lowercase letters, digits, hyphens; start with a
# letter, end with a letter or digit, at most 63 characters.
NAME_RE = re.compile(r'[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?')


def _Words(ap, flag, value):
  """`value` split into words like a shell command line (shlex.split)."""
  try:
    return shlex.split(value)
  except ValueError as e:
    ap.error(f'{flag} {value!r} is not a shell-quoted command line ({e}); '
             'close every quote')


def ParseArgs(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--name', required=True, help='TPU VM name.')
  ap.add_argument('--zone', required=True)
  ap.add_argument('--project', required=True)
  ap.add_argument('--accelerator_type', default='v4-8',
                  help='e.g. v4-8 (one host) or v4-32 (a 4-host pod slice).')
  ap.add_argument('--runtime_version', default='tpu-ubuntu2204-base')
  ap.add_argument('--spot', action='store_true', help='Spot capacity.')
  ap.add_argument('--model', required=True, help='Registered model key.')
  ap.add_argument('--logdir', required=True,
                  help='gs:// directory: checkpoints, summaries, logs.')
  ap.add_argument('--mode', default='train', help='Trainer --mode.')
  ap.add_argument('--decode_input', default=None,
                  help='--mode=decode: gs:// glob of the input shards.')
  ap.add_argument('--decode_output', default=None,
                  help='--mode=decode: gs:// directory of the hypotheses.')
  ap.add_argument('--trainer_args', default='',
                  help='More trainer flags, one shell-quoted string.')
  ap.add_argument('--source', default='local',
                  help='"local" (this checkout\'s HEAD) or a pip '
                  'requirement such as git+https://host/lingshard@ref.')
  ap.add_argument('--pip_extra', default=DEFAULT_PIP,
                  help='Extra pip install arguments (the TPU TensorFlow).')
  ap.add_argument('--keep', action='store_true',
                  help='Do not delete the TPU VM at the end.')
  ap.add_argument('--dry_run', action='store_true',
                  help='Print every command without running it.')
  ap.add_argument('--skip_topology_check', action='store_true',
                  help='Do not check the model against the accelerator.')
  args = ap.parse_args(argv)
  if not NAME_RE.fullmatch(args.name):
    ap.error(f'--name {args.name!r} is not a TPU VM name: use lowercase '
             'letters, digits and hyphens, starting with a letter (at most 63)')
  if not args.logdir.startswith('gs://'):
    ap.error('--logdir must be a gs:// path (the TPU VMs write it)')
  _CheckDecodeArgs(ap, args)
  args.trainer_argv = _Words(ap, '--trainer_args', args.trainer_args)
  args.pip_extra_argv = _Words(ap, '--pip_extra', args.pip_extra)
  if not args.skip_topology_check:
    CheckTopology(ap, args)
  return args


def _CheckDecodeArgs(ap, args):
  """The decode job needs gs:// --decode_input and --decode_output; other
  jobs take neither."""
  given = [f for f in ('decode_input', 'decode_output') if getattr(args, f)]
  if args.mode != 'decode':
    if given:
      ap.error(f'--{given[0]} is for --mode=decode (the batch decode job)')
    return
  for flag in ('decode_input', 'decode_output'):
    value = getattr(args, flag)
    if not value or not value.startswith('gs://'):
      ap.error(f'--mode=decode needs --{flag}=gs://... (every host reads '
               'the shards and writes the hypotheses there)')


def DecodeFlags(args):
  """The trainer flags of the decode job (none for other jobs)."""
  if args.mode != 'decode':
    return []
  return [f'--decode_input={args.decode_input}',
          f'--decode_output={args.decode_output}']


def CheckTopology(ap, args, err=sys.stderr):
  """Refuses (ap.error, one line) a model that cannot run on the slice;
  prints the job's shape to `err`."""
  # pylint: disable=g-import-not-at-top
  from absl import flags
  from lingshard import trainer
  from lingshard.train import overrides
  from lingshard.train import tpu_topology
  # pylint: enable=g-import-not-at-top
  fv = flags.FlagValues()
  trainer.DefineFlags(fv)
  try:
    rest = fv(['trainer', f'--model={args.model}', f'--mode={args.mode}'] +
              DecodeFlags(args) + args.trainer_argv)
    if len(rest) > 1:  # The trainer would refuse it on the VM, after boot.
      ap.error(f'--trainer_args {args.trainer_args!r}: {rest[1]!r} is not a '
               'trainer flag (the trainer takes --flags only; every word '
               'reaches it quoted, so shell syntax is not run)')
    if args.mode == 'decode':  # The program decode runs: its dataset's
      # params, the task's inference params (trainer.InferenceTask's).
      params, _ = trainer.BuildParams(fv, fv.eval_dataset, for_eval=True)
      params.task = params.task.cls.InferenceParams(params.task)
    else:
      params, _ = trainer.BuildParams(fv)
    topo, replicas, cores = tpu_topology.CheckModelOnTpu(
        params, args.model, args.accelerator_type)
  except (flags.Error, trainer.ConfigError, overrides.OverrideError,
          tpu_topology.TopologyError) as e:
    ap.error(str(e).splitlines()[0])
  job = ('every host runs the trainer with the same flags' if
         args.mode != 'decode' else
         f'every host runs the decode job with the same flags: shards '
         f'{args.decode_input} -> {args.decode_output}/<shard>.hyp.txt, '
         'complete outputs skipped')
  err.write(f'{args.model} on {topo.accelerator_type}: {topo.devices} TPU '
            f'devices on {topo.hosts} host(s), {replicas} replica(s) of a '
            f'{cores}-device mesh; {job}; logdir {args.logdir}\n')


def _Tpu(args, verb, *rest):
  return (['gcloud', 'compute', 'tpus', 'tpu-vm', verb, args.name,
           f'--zone={args.zone}', f'--project={args.project}'] + list(rest))


def Ssh(args, command, worker='all'):
  return _Tpu(args, 'ssh', f'--worker={worker}', f'--command={command}')


def DescribeCommand(args):
  return _Tpu(args, 'describe', '--format=value(state)')


def CreateCommand(args):
  cmd = _Tpu(args, 'create', f'--accelerator-type={args.accelerator_type}',
             f'--version={args.runtime_version}')
  return cmd + (['--spot'] if args.spot else [])


def InstallCommands(args):
  pip = 'python3 -m pip install --quiet'
  extra = shlex.join(args.pip_extra_argv)
  if args.source == 'local':
    tarball = os.path.join('/tmp', TARBALL)
    return [
        ['git', '-C', REPO, 'archive', '--format=tar.gz', '-o', tarball,
         'HEAD'],
        ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp', tarball,
         f'{args.name}:~/{TARBALL}', '--worker=all', f'--zone={args.zone}',
         f'--project={args.project}'],
        Ssh(args, f'rm -rf ~/lingshard && mkdir ~/lingshard && '
                  f'tar -xzf ~/{TARBALL} -C ~/lingshard && '
                  f'{pip} ~/lingshard {extra}'),
    ]
  return [Ssh(args, f'{pip} {shlex.quote(args.source)} {extra}')]


def _Job(args):
  """The job's name in its worker files: 'decode' or 'train' (the other
  modes run like training), so a decode on a kept VM keeps the train log."""
  return 'decode' if args.mode == 'decode' else 'train'


def Log(args):
  return f'~/lingshard-{_Job(args)}.log'


def Exit(args):
  return f'~/lingshard-{_Job(args)}.exit'


def TrainerCommand(args):
  """The shell command each worker runs in the background."""
  trainer = ['python3', '-m', 'lingshard.trainer', f'--model={args.model}',
             f'--logdir={args.logdir}', f'--mode={args.mode}',
             '--strategy=tpu', '--tpu=local'] + DecodeFlags(args) + (
                 args.trainer_argv)
  job = shlex.join(trainer) + f'; echo $? > {Exit(args)}'
  return (f'cd ~ && rm -f {Exit(args)} && '
          f'nohup sh -c {shlex.quote(job)} > {Log(args)} 2>&1 < /dev/null &')


def StreamCommand(args):
  # Follow the log until the exit file appears (the trainer finished).
  return Ssh(args, f'tail -n +1 -F {Log(args)} & t=$!; '
                   f'while [ ! -f {Exit(args)} ]; do sleep 10; done; '
                   f'sleep 2; kill $t', worker='0')


def CollectCommand(args):
  """Copies the log to <logdir>/tpu_vm_logs/<host>.log; exits with the
  trainer's exit code (1 if it left none), whatever the copy did."""
  dest = shlex.quote(f'{args.logdir}/tpu_vm_logs/')
  name = '.log' if _Job(args) == 'train' else f'-{_Job(args)}.log'
  return Ssh(args, f'rc=$(cat {Exit(args)}); '
                   f'gcloud storage cp {Log(args)} {dest}"$(hostname){name}"; '
                   'echo "$(hostname) exit ${rc:-none}"; exit "${rc:-1}"')


def DeleteCommand(args):
  return _Tpu(args, 'delete', '--quiet')


class Runner:
  """Prints each command; runs it unless dry_run."""

  def __init__(self, dry_run, out=sys.stdout):
    self.dry_run = dry_run
    self._out = out

  def __call__(self, argv, check=True):
    self._out.write('+ ' + shlex.join(argv) + '\n')
    self._out.flush()
    if self.dry_run:
      return 0
    code = subprocess.run(argv, check=False).returncode
    if check and code:
      raise RuntimeError(f'command failed with exit code {code}: '
                         f'{shlex.join(argv)}')
    return code


def Launch(args, run):
  """Runs the whole job; returns the process exit code."""
  exists = run(DescribeCommand(args), check=False) == 0 and not run.dry_run
  created = False
  try:
    if not exists:
      run(CreateCommand(args))
      created = True
    for cmd in InstallCommands(args):
      run(cmd)
    run(Ssh(args, TrainerCommand(args)))
    run(StreamCommand(args))
    return run(CollectCommand(args), check=False)
  finally:
    if created and not args.keep:
      run(DeleteCommand(args), check=False)


def main(argv=None):
  args = ParseArgs(sys.argv[1:] if argv is None else argv)
  return Launch(args, Runner(args.dry_run))


if __name__ == '__main__':
  sys.exit(main())
