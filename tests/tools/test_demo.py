"""Tests of the README demo's helpers (the demo itself runs in `make demo`)."""

from lingshard.tools import demo


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
