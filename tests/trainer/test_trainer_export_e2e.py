"""The README's models export end to end: train a few steps on a small
corpus prepared by lingshard.data.prepare, decode and export with the
trainer (in this process: the binary's own flags and `Execute`; README
commands run the binary), then a fresh process with only tensorflow +
tensorflow_text loads
the SavedModel and `translate` returns exactly decode's hypotheses, though
it batches and pads the sources differently (chunks of 8 padded to the
largest bucket; decode: batches of 5 padded to the smallest bucket)."""

import json
import os
import subprocess
import sys

import pytest
import sentencepiece as spm

from lingshard import trainer
from tests.trainer import trainer_testlib
from tests.trainer.test_trainer_write_failures import FileSizeLimit

SPLIT = 'dev_seen_en'

RELOAD = r'''
import json, sys
import tensorflow as tf
import tensorflow_text  # Registers the SentencePiece ops.
model = tf.saved_model.load(sys.argv[1])
with open(sys.argv[2], encoding='utf-8') as f:
  sources, languages = json.load(f)
out = model.signatures['translate'](source=tf.constant(sources, tf.string),
                                    language=tf.constant(languages, tf.string))
print(json.dumps([t.decode('utf-8') for t in out['translation'].numpy()]))
'''


def _Run(*args):
  trainer.Execute(trainer_testlib.ParseFlags(*args), printer=lambda _: None)


@pytest.mark.parametrize('model', ['m4.TinyMoE', 'm4.TinyDense'])
def test_export_translates_like_decode(prepared_dir, tmp_path, model):
  vocab = os.path.join(prepared_dir, 'vocab', 'spm_shared.model')
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  logdir = str(tmp_path / 'log')
  # One training bucket (one trace); a softmax the size of the vocabulary,
  # so that hypotheses are real pieces, not <unk>; short hypotheses.
  overrides = ';'.join([
      f"input.file_pattern='{prepared_dir}/train.tsv'",
      f"input.src_vocab='{vocab}'", f"input.tgt_vocab='{vocab}'",
      'input.bucket_upper_bounds=[64]', 'input.bucket_batch_limits=[8]',
      f'task.src_vocab_size={size}', f'task.tgt_vocab_size={size}',
      'task.decode.max_decode_len=16'])
  base = [f'--model={model}', f'--logdir={logdir}',
          f'--params_override={overrides}']
  # (The demo's --jit training is tests/tools/test_demo_run.py's.)
  _Run(*base, '--mode=train', '--max_steps=3')
  decode = ['--mode=decode', '--eval_params_override=' + ';'.join([
      f"input.file_pattern='{prepared_dir}/{SPLIT}.tsv'",
      'input.bucket_upper_bounds=[8,16,32,64]',
      'input.bucket_batch_limits=[5,5,5,5]'])]
  _Run(*base, *decode)
  _Run(*base, '--mode=export')
  if model == 'm4.TinyMoE':
    _FullDiskLeavesDecodeAndExport(base, decode, logdir)
  export_dir = os.path.join(logdir, 'export', '00000003')
  with open(os.path.join(export_dir, 'lingshard_export.json')) as f:
    assert json.load(f) == {'model': model, 'step': 3}

  decode_dir = os.path.join(logdir, f'decode_{SPLIT}')
  sources, languages, hypotheses = [], [], []
  for name in sorted(os.listdir(decode_dir)):
    if name.endswith('.src.txt'):
      lang = name[:-len('.src.txt')]
      for ext, out in (('src', sources), ('hyp', hypotheses)):
        with open(os.path.join(decode_dir, f'{lang}.{ext}.txt'),
                  encoding='utf-8') as f:
          out.extend(f.read().split('\n')[:-1])
      languages.extend([lang] * (len(sources) - len(languages)))
  assert len(sources) == len(hypotheses) == 22
  assert len(set(hypotheses)) > 5  # Not one answer to every source.
  request = tmp_path / 'request.json'
  request.write_text(json.dumps([sources, languages]), encoding='utf-8')
  run = subprocess.run(
      [sys.executable, '-c', RELOAD, export_dir, str(request)],
      env=trainer_testlib.TrainerEnv(), cwd=str(tmp_path),
      capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  assert [t.replace('\n', ' ') for t in got] == hypotheses


def _FullDiskLeavesDecodeAndExport(base, decode, logdir):
  """Decode (one batch) again on a full disk: one line, the previous
  outputs kept byte for byte, no temporary (it crashed with a TF
  traceback, leaving a partial directory). Export's full disk is
  test_trainer_write_failures.py's (its error is an ExportDirError, which
  the trainer prints as every --export_dir refusal)."""
  before = _Files(logdir)
  with FileSizeLimit(256), pytest.raises(trainer.ConfigError) as e:
    _Run(*base, decode[0], decode[1] + ';task.train.eval_num_batches=1')
  assert str(e.value) == (
      f'--logdir {logdir}: cannot write {logdir}/decode_{SPLIT}: File too '
      'large; it was left as it was: free space or choose another --logdir')
  assert _Files(logdir) == before


def _Files(root):
  out = {}
  for dirpath, _, filenames in os.walk(root):
    for name in filenames:
      with open(os.path.join(dirpath, name), 'rb') as f:
        out[os.path.relpath(os.path.join(dirpath, name), root)] = f.read()
  return out
