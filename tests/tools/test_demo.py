"""Tests of the README demo's helpers (the demo itself runs in `make demo`;
tests/tools/test_demo_run.py and the README command of lingshard.tools.demo
on lm1b.TinyMoE (tests/readme_checks.py) run it end to end)."""

import math

import numpy as np
import pytest
from absl.testing import flagsaver

from lingshard import base_input
from lingshard.data import corpus_io
from lingshard.data import lm_inputs
from lingshard.data import lm_prepare
from lingshard.tools import demo
from lingshard.tools import demo_lm
from tests.trainer import trainer_testlib


def test_vocab_paths_follow_the_model():
  assert demo.VocabPaths('m4.TinyMoE', 'd') == {
      'src_vocab': 'd/vocab/spm_shared.model',
      'tgt_vocab': 'd/vocab/spm_shared.model'}
  assert demo.VocabPaths('m4.MoE128E12L', 'd') == {
      'src_vocab': 'd/vocab/spm_multi.model',
      'tgt_vocab': 'd/vocab/spm_en.model'}


def test_score_table_marks_where_the_model_beats_copy():
  avg = dict(languages=3, n=10, bleu=8.0, chrf=16.0, copy_bleu=2.0,
             copy_chrf=12.0)
  pooled = dict(avg, chrf=17.5, copy_chrf=13.8)
  worse = dict(avg, chrf=11.0)
  lines = demo.ScoreTable([
      ('dev_unseen_en', 'noph', {'average': avg, 'pooled': pooled}),
      ('dev_seen_en', 'all', {'average': worse, 'pooled': pooled})
  ]).split('\n')
  assert lines[0].split() == ['split', 'subset', 'langs', 'pairs', 'BLEU',
                              'chrF', 'copyBLEU', 'copychrF', 'poolchrF',
                              'copy', 'chrF>copy']
  assert lines[1].split() == ['dev_unseen_en', 'noph', '3', '10', '8.00',
                              '16.00', '2.00', '12.00', '17.50', '13.80',
                              'yes']
  assert lines[2].split()[-1] == 'NO'


# ------------------------------------------------ the language-model path
def test_each_model_reads_its_own_corpus_and_names_its_prepare_command():
  for model, data_dir, args in (
      ('m4.TinyMoE', 'data/ui_m4', ['lingshard.data.prepare']),
      ('m4.TinyMoELarge', 'data/ui_m4_large',
       ['lingshard.data.prepare', '--corpus=large']),
      ('lm1b.TinyMoE', 'data/lm_en', ['lingshard.data.lm_prepare']),
      ('lm1b.TinyMoELarge', 'data/lm_en_large',
       ['lingshard.data.lm_prepare', '--sources=large'])):
    assert demo.DataDir(model) == data_dir
    assert demo_lm.IsLm(model) == model.startswith('lm1b.')
    prepare_args = (lm_prepare if demo_lm.IsLm(model) else
                    corpus_io).PrepareArgs(data_dir)
    assert prepare_args == args + ['--out', data_dir]
  # The trainer's one-line hint for a missing large corpus names the
  # command that builds it, not the default corpus's.
  with pytest.raises(base_input.InputError) as e:
    lm_inputs.LmInput(lm_inputs.LmInput.ParamsForCorpus(
        'nowhere/lm_en_large')).GetDataset()
  assert str(e.value).endswith(
      'prepare the corpus with: python -m lingshard.data.lm_prepare '
      '--sources=large --out nowhere/lm_en_large')
  assert corpus_io.PrepareHint('nowhere/ui_m4_large/vocab/spm.model') == (
      'prepare the corpus with: python -m lingshard.data.prepare '
      '--corpus=large --out nowhere/ui_m4_large')


def test_unigram_counts_read_words_unk_and_one_eos_per_sentence(tmp_path):
  words = list(lm_prepare.SPECIALS) + ['a', 'b']
  path = tmp_path / 'train.txt'
  path.write_text('a b a\n\nzz b\n', encoding='utf-8')
  counts_v = demo_lm.UnigramCounts(str(path), words)
  assert counts_v.tolist() == [0, 0, 2, 1, 2, 2]  # <s> never a label.


def test_unigram_log_pplx_equals_a_per_token_loop():
  rng = np.random.default_rng(0)
  counts_v = rng.integers(0, 50, size=12)
  labels = rng.integers(0, 12, size=200)
  total, v = counts_v.sum(), len(counts_v)
  reference = -sum(math.log((counts_v[w] + 1) / (total + v))
                   for w in labels) / len(labels)
  assert demo_lm.UnigramLogPplx(counts_v, labels) == pytest.approx(
      reference, rel=1e-12)


def test_score_table_compares_with_the_unigram_model_on_the_same_tokens():
  result = {'languages': {'all': {'log_pplx': 4.5, 'weight': 1200.0}}}
  lines = demo_lm.ScoreTable(result, 6.0, 1200).split('\n')
  assert lines[0].split() == ['split', 'tokens', 'log_pplx', 'pplx',
                              'unigram_pplx', 'pplx<unigram']
  assert lines[1].split() == ['dev', '1,200', '4.500', '90.02', '403.43',
                              'yes']
  assert demo_lm.ScoreTable(result, 4.0, 1200).split()[-1] == 'NO'
  with pytest.raises(RuntimeError) as e:
    demo_lm.ScoreTable(result, 6.0, 1199)
  assert str(e.value) == ('the evaluation scored 1200 tokens, the unigram '
                          'model 1199')


def test_a_failed_step_prints_only_its_own_error_line(tmp_path, monkeypatch,
                                                      capfd):
  """The trainer's one line, then the demo exits with its status (it used
  to add a CalledProcessError traceback)."""
  data_dir = tmp_path / 'data'
  (data_dir / 'vocab').mkdir(parents=True)
  (data_dir / 'train.tsv').write_text('de\tHallo\tHello\n')
  (data_dir / 'vocab' / 'spm_shared.model').write_text('')
  monkeypatch.setenv('PYTHONPATH', trainer_testlib.REPO)
  with flagsaver.flagsaver():
    demo.FLAGS.unparse_flags()
    demo.FLAGS(['demo', f'--data_dir={data_dir}',
                f'--logdir={tmp_path / "log"}', '--max_steps=0'])
    with pytest.raises(SystemExit) as e:
      demo.main(['demo'])
  assert e.value.code == 1
  err = capfd.readouterr().err
  assert [line for line in err.splitlines() if 'cuda' not in line and
          not line.startswith(('WARNING: All log', 'E0000', 'I0000'))] == [
      'lingshard.trainer: error: --max_steps=0: must be >= 1 (the step to '
      'train to)']
  assert not (tmp_path / 'log').exists()
