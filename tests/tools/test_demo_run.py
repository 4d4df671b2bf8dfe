"""The README's main job (`make demo`: python -m lingshard.tools.demo) runs
end to end as the demo does, but on the tests' prepared corpus and for 2
steps: the trainer binary trains with --jit on batches that carry string
leaves, beam-decodes both dev splits, and the demo prints its score table
with one row per split and subset, counting every pair of the split."""

import os
import re

import sentencepiece as spm

from lingshard.data import corpus_io
from lingshard.tools import demo
from tests.trainer import trainer_testlib


def test_demo_trains_decodes_and_scores(prepared_dir, tmp_path):
  vocab = os.path.join(prepared_dir, 'vocab', 'spm_shared.model')
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  logdir = str(tmp_path / 'log')
  overrides = ';'.join([
      f'task.src_vocab_size={size}', f'task.tgt_vocab_size={size}',
      'input.bucket_upper_bounds=[64]', 'input.bucket_batch_limits=[8]',
      'task.decode.max_decode_len=8'])
  run = trainer_testlib.RunModule(
      'lingshard.tools.demo', f'--data_dir={prepared_dir}',
      f'--logdir={logdir}', '--max_steps=2', f'--params_override={overrides}')
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  assert re.search(r'^step 2/2 loss \d+\.\d+', run.stdout, re.M), run.stdout
  assert 'strategy default: 1 replica(s), jit on' in run.stdout
  table = run.stdout.split('vs copying the source ==\n', 1)[1]
  rows = [line.split() for line in table.splitlines()[1:5]]
  for split in demo.DEV_SPLITS:
    pairs = corpus_io.ReadTsv(os.path.join(prepared_dir, f'{split}.tsv'))
    langs = corpus_io.LanguageCounts(pairs)
    assert [split, 'all', str(len(langs)), str(len(pairs))] in [
        r[:4] for r in rows], (split, rows)
    assert os.path.isfile(os.path.join(logdir, f'decode_{split}',
                                       'scores.txt'))
  assert re.search(r'^model m4\.TinyMoE; training \d+\.\d min', run.stdout,
                   re.M)
