"""Helpers for the trainer tests: parse trainer flags in-process, or run the
trainer binary in a subprocess."""

import glob
import hashlib
import importlib.util
import os
import subprocess
import sys

from absl import flags
from lingshard import trainer
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def CorpusOverrides(prepared_dir, bucket=64, batch=8):
  """--params_override items training a translation model on the prepared
  corpus `prepared_dir` (shared vocabulary) in one bucket."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  vocab = os.path.join(prepared_dir, 'vocab', 'spm_shared.model')
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  return [f"input.file_pattern='{prepared_dir}/train.tsv'",
          f"input.src_vocab='{vocab}'", f"input.tgt_vocab='{vocab}'",
          f'input.bucket_upper_bounds=[{bucket}]',
          f'input.bucket_batch_limits=[{batch}]',
          f'task.src_vocab_size={size}', f'task.tgt_vocab_size={size}']


def ParseFlags(*args):
  """Trainer flags parsed from `args` on a fresh FlagValues."""
  fv = flags.FlagValues()
  trainer.DefineFlags(fv)
  fv(['trainer'] + list(args))
  return fv


def Run(*args):
  """trainer.Execute in this process, printing nothing."""
  return trainer.Execute(ParseFlags(*args), printer=lambda _: None)


def CheckpointValues(path):
  """{key: value} of the variables in checkpoint `path`."""
  reader = tf.train.load_checkpoint(path)
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.endswith('VARIABLE_VALUE')}


def StraightAndResumed(args, straight, resumed):
  """Trains 4 steps in logdir `straight`, and 2 then (restarted, from
  ckpt-2) 4 in `resumed`; args(logdir, max_steps) are the trainer's flags.
  Returns the ckpt-4 values (straight, resumed), their keys checked equal."""
  Run(*args(straight, 4))
  Run(*args(resumed, 2))
  Run(*args(resumed, 4))  # Restarted: resumes from ckpt-2.
  want = CheckpointValues(os.path.join(straight, 'train', 'ckpt-4'))
  got = CheckpointValues(os.path.join(resumed, 'train', 'ckpt-4'))
  assert sorted(got) == sorted(want)
  return want, got


def TrainerEnv():
  env = dict(os.environ)
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  env.pop('TF_CONFIG', None)
  return env


def TrainerCommand(*args):
  return [sys.executable, '-m', 'lingshard.trainer'] + list(args)


def RunTrainer(*args, timeout=300):
  """Runs the trainer binary to completion; returns CompletedProcess."""
  return RunModule('lingshard.trainer', *args, timeout=timeout)


def RunModule(module, *args, timeout=600):
  """Runs `python -m module args` from the repository to completion in the
  trainer's environment; returns CompletedProcess."""
  return subprocess.run([sys.executable, '-m', module] + list(args),
                        env=TrainerEnv(), cwd=REPO, capture_output=True,
                        text=True, timeout=timeout, check=False)


def Events(directory):
  """{tag: [(step, value ndarray, plugin name)]} of a directory's
  TensorBoard event files."""
  out = {}
  for path in glob.glob(os.path.join(directory, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        out.setdefault(value.tag, []).append(
            (event.step, tf.make_ndarray(value.tensor),
             value.metadata.plugin_data.plugin_name))
  return out


def Snapshot(directory):
  """{relative path: (size, mtime_ns, sha256)} of every file under
  `directory`: equal before and after = nothing was written there."""
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
      st = os.stat(path)
      out[os.path.relpath(path, directory)] = (st.st_size, st.st_mtime_ns,
                                               digest)
  return out


LAUNCH_SCRIPT = os.path.join(REPO, 'scripts', 'tpu_vm', 'launch.py')
TPU_VM = ['gcloud', 'compute', 'tpus', 'tpu-vm']


def LaunchModule():
  """scripts/tpu_vm/launch.py as a module (a script, not in a package)."""
  spec = importlib.util.spec_from_file_location('tpu_vm_launch',
                                                LAUNCH_SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def TpuSsh(name, where, worker, command):
  """The launcher's `gcloud ... ssh` command line on `worker`."""
  return TPU_VM + ['ssh', name] + where + [f'--worker={worker}',
                                           f'--command={command}']
