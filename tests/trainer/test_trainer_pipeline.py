"""The trainer on the pipelined twin of m4.TinyDense (GPipe), on the corpus
prepared by lingshard.data.prepare: it trains, and a micro-batch count that
does not divide the batch is one line naming both numbers."""

import os

import numpy as np
import pytest
import sentencepiece as spm

from lingshard import config_check
from lingshard import trainer
from tests.trainer import trainer_testlib

MODEL = 'gpipe.TinyDensePipelined'


def _Overrides(prepared_dir, batch):
  vocab = os.path.join(prepared_dir, 'vocab', 'spm_shared.model')
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  return ';'.join([
      f"input.file_pattern='{prepared_dir}/train.tsv'",
      f"input.src_vocab='{vocab}'", f"input.tgt_vocab='{vocab}'",
      'input.bucket_upper_bounds=[64]', f'input.bucket_batch_limits=[{batch}]',
      f'task.src_vocab_size={size}', f'task.tgt_vocab_size={size}'])


def _Execute(*args):
  lines = []
  out = trainer.Execute(trainer_testlib.ParseFlags(*args),
                        printer=lines.append)
  return out, lines


def test_trains_the_pipelined_tiny_dense(prepared_dir, tmp_path):
  out, lines = _Execute(f'--model={MODEL}', f'--logdir={tmp_path}',
                        '--mode=train', '--max_steps=2',
                        '--params_override=' + _Overrides(prepared_dir, 8))
  assert lines[-1].startswith('step 2/2 loss '), lines[-3:]
  assert np.isfinite(out['loss'][0])


def test_micro_batches_not_dividing_the_batch_is_one_line(prepared_dir,
                                                          tmp_path):
  overrides = (_Overrides(prepared_dir, 8) +
               ';task.pipeline_tpl.num_micro_batches=3')
  # config_check refuses it before anything is built.
  message = ('input.bucket_batch_limits[0]=8 must be divisible by '
             'model/dec/pipeline: num_micro_batches=3 x mesh axis 0 of size '
             '2 = 6 (each micro-batch is split over it)')
  with pytest.raises(config_check.ConfigCheckError) as e:
    _Execute(f'--model={MODEL}', f'--logdir={tmp_path}', '--mode=train',
             '--max_steps=1', f'--params_override={overrides}')
  assert str(e.value) == message
  # The CLI prints it as one line and exits 1.
  run = trainer_testlib.RunTrainer(f'--model={MODEL}',
                                   f'--logdir={tmp_path / "cli"}',
                                   '--mode=train', '--max_steps=1',
                                   f'--params_override={overrides}')
  assert run.returncode == 1, run.stderr[-3000:]
  assert run.stderr.rstrip().splitlines()[-1] == (
      f'lingshard.trainer: error: {message}')


def test_pipelined_moe_trains_evaluates_decodes_and_exports(prepared_dir,
                                                            tmp_path):
  """gpipe.TinyMoEPipelined (GShard inside GPipe) through the trainer:
  train op by op, then one XLA-compiled (--jit) step, eval, decode (the
  same weights unpipelined) and export; every MoE layer reports its own
  routing metrics."""
  model = 'gpipe.TinyMoEPipelined'
  base = [f'--model={model}', f'--logdir={tmp_path}',
          '--params_override=' + _Overrides(prepared_dir, 16) +
          ';task.decode.max_decode_len=8',
          '--eval_params_override=' + ';'.join([
              f"input.file_pattern='{prepared_dir}/dev_seen_en.tsv'",
              'input.bucket_upper_bounds=[64]',
              'input.bucket_batch_limits=[16]'])]
  out, lines = _Execute(*base, '--mode=train', '--max_steps=1')
  assert lines[-1].startswith('step 1/1 loss '), lines[-3:]
  layers = sorted({k.split('_frac_dispatched_2')[0] for k in out
                   if k.endswith('_frac_dispatched_2')})
  assert layers == ['dec_layer_001', 'dec_layer_003', 'enc_layer_001',
                    'enc_layer_003']
  out, lines = _Execute(*base, '--mode=train', '--max_steps=2', '--jit')
  assert lines[-1].startswith('step 2/2 loss '), lines[-3:]
  assert np.isfinite(out['loss'][0]) and np.isfinite(out['grad_norm'][0])
  _, lines = _Execute(*base, '--mode=eval')
  assert any('log_pplx' in line for line in lines), lines[-5:]
  _Execute(*base, '--mode=decode')
  assert os.listdir(tmp_path / 'decode_dev_seen_en')
  _Execute(*base, '--mode=export')
  assert os.path.exists(tmp_path / 'export' / '00000002' /
                        'saved_model.pb')
