"""Tests of the README demo's helpers (the demo itself runs in `make demo`)."""

from lingshard.tools import demo


def testVocabOverridesFollowTheModel():
  assert demo._VocabOverrides('m4.TinyMoE', 'd') == [
      "input.src_vocab='d/vocab/spm_shared.model'",
      "input.tgt_vocab='d/vocab/spm_shared.model'"]
  assert demo._VocabOverrides('m4.MoE128E12L', 'd') == [
      "input.src_vocab='d/vocab/spm_multi.model'",
      "input.tgt_vocab='d/vocab/spm_en.model'"]


def testScoreTableMarksWhereTheModelBeatsCopy():
  scores = dict(languages=3, n=10, bleu=8.0, chrf=16.0, copy_bleu=2.0,
                copy_chrf=12.0)
  worse = dict(scores, chrf=11.0)
  lines = demo.ScoreTable([('dev_unseen_en', 'noph', scores),
                           ('dev_seen_en', 'all', worse)]).split('\n')
  assert lines[1].split() == ['dev_unseen_en', 'noph', '3', '10', '8.00',
                              '16.00', '2.00', '12.00', 'yes']
  assert lines[2].split()[-1] == 'NO'
