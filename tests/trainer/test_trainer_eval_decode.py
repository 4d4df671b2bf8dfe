"""Eval (loss / log-perplexity per language), decode (detokenized
hypotheses, BLEU / chrF per language and averaged, copy baseline, files)
and the trainer's eval modes."""

import collections
import json
import os

import numpy as np
import pytest
import sacrebleu
import sentencepiece as spm

from lingshard import trainer
from lingshard.models import mt_decoder
from lingshard.train import eval_loop
from tests.trainer import fake_translation
from tests.trainer import trainer_testlib


@pytest.fixture(name='corpus', scope='module')
def CorpusFixture(tmp_path_factory):
  return fake_translation.WriteCorpus(str(tmp_path_factory.mktemp('corpus')))


def test_evaluator_per_language(corpus):
  tsv, spm_path = corpus
  task = fake_translation.NewTask()
  task.vars.scale.assign(2.0)
  gen = fake_translation.InputParams(tsv, spm_path).Instantiate()
  result = eval_loop.Evaluator(task, gen).Evaluate(task.theta, step=17)
  # Reference: per token NLL 2 * (label % 7 + 1) / 7 over target pieces + EOS.
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  sums, counts = collections.Counter(), collections.Counter()
  for line in open(tsv, encoding='utf-8'):
    lang, _, target = line.rstrip('\n').split('\t')
    labels = sp.encode(target) + [2]
    sums[lang] += sum(2.0 * (y % 7 + 1) / 7 for y in labels)
    counts[lang] += len(labels)
  assert result['step'] == 17
  assert sorted(result['languages']) == ['rev', 'same']
  for lang in ('rev', 'same'):
    entry = result['languages'][lang]
    assert entry['examples'] == 12
    assert entry['weight'] == counts[lang]
    np.testing.assert_allclose(entry['log_pplx'], sums[lang] / counts[lang],
                               rtol=1e-6)
    np.testing.assert_allclose(entry['pplx'], np.exp(entry['log_pplx']))
  np.testing.assert_allclose(result['metrics']['log_pplx'],
                             sum(sums.values()) / sum(counts.values()),
                             rtol=1e-6)
  scalars = eval_loop.Scalars(result)
  assert scalars['lang/same/log_pplx'] == result['languages']['same'][
      'log_pplx']


def test_decode_and_score(corpus, tmp_path):
  tsv, spm_path = corpus
  task = fake_translation.NewTask()
  gen = fake_translation.InputParams(tsv, spm_path).Instantiate()
  detok = mt_decoder.Detokenizer(spm_path)
  records = mt_decoder.MtDecoder(task, detok, detok).DecodeDataset(
      task.theta, gen.GetDataset())
  by_lang = collections.defaultdict(list)
  for r in records:
    by_lang[r.language].append(r)
  assert sorted(by_lang) == ['rev', 'same'] and len(records) == 24
  for r in records:
    assert r.hypothesis == r.source  # The identity table copies.
    want = r.source if r.language == 'same' else ' '.join(
        reversed(r.source.split()))
    assert r.reference == want
  scores = mt_decoder.ScoreByLanguage(records, high_resource={'same'})
  same, rev = scores['languages']['same'], scores['languages']['rev']
  assert same['bleu'] == pytest.approx(100.0) and same['n'] == 12
  assert same['chrf'] == pytest.approx(100.0)
  assert rev['bleu'] == pytest.approx(rev['copy_bleu']) and rev['bleu'] < 50
  assert scores['high']['bleu'] == pytest.approx(100.0)
  assert scores['low']['bleu'] == pytest.approx(rev['bleu'])
  assert scores['average']['chrf'] == pytest.approx(
      (same['chrf'] + rev['chrf']) / 2)
  assert scores['average']['languages'] == 2 and scores['average']['n'] == 24
  pooled = mt_decoder.CorpusScores([r.hypothesis for r in records],
                                    [r.reference for r in records])
  assert scores['pooled']['chrf'] == pytest.approx(pooled['chrf'])
  assert scores['pooled']['n'] == 24
  # Pooled is one corpus, not the mean of the languages' scores.
  assert scores['pooled']['bleu'] != pytest.approx(scores['average']['bleu'])
  assert mt_decoder.FormatExamples(records, n=1) == (
      '[same] the cat sat on the mat\n  hyp: the cat sat on the mat\n'
      '  ref: the cat sat on the mat\n')
  out = tmp_path / 'decode_dev'
  mt_decoder.WriteOutputs(str(out), records, scores, step=3)
  assert sorted(os.listdir(out)) == [
      'rev.hyp.txt', 'rev.ref.txt', 'rev.src.txt', 'same.hyp.txt',
      'same.ref.txt', 'same.src.txt', 'scores.json', 'scores.txt']
  hyps = (out / 'rev.hyp.txt').read_text().splitlines()
  assert hyps == [r.hypothesis for r in by_lang['rev']]
  assert json.loads((out / 'scores.json').read_text())['step'] == 3
  table = (out / 'scores.txt').read_text().splitlines()
  assert table[0].split() == ['lang', 'n', 'BLEU', 'chrF', 'copyBLEU',
                              'copychrF']
  assert table[2].split()[:3] == ['same', '12', '100.00']
  assert [t.split()[0] for t in table[3:]] == ['[average]', '[high]', '[low]',
                                               '[pooled]']


def test_permuted_table_changes_hypotheses(corpus):
  tsv, spm_path = corpus
  task = fake_translation.NewTask()
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  cat, dog = sp.piece_to_id('▁cat'), sp.piece_to_id('▁dog')
  table = np.arange(60, dtype=np.float32)
  table[cat], table[dog] = dog, cat
  task.vars.table.assign(table)
  gen = fake_translation.InputParams(tsv, spm_path).Instantiate()
  detok = mt_decoder.Detokenizer(spm_path)
  records = mt_decoder.MtDecoder(task, detok).DecodeDataset(
      task.theta, gen.GetDataset(), num_batches=1)
  assert len(records) == 5
  assert records[0].source == 'the cat sat on the mat'
  assert records[0].hypothesis == 'the dog sat on the mat'


def test_scores_match_sacrebleu():
  rs = [mt_decoder.Record('de', 'Hallo Welt', 'hello world', 'hello world'),
        mt_decoder.Record('de', 'Guten Tag', 'good day', 'good morning'),
        mt_decoder.Record('fr', 'bonjour', 'hello', 'good morning')]
  scores = mt_decoder.ScoreByLanguage(rs)
  de = scores['languages']['de']
  want = sacrebleu.corpus_bleu(['hello world', 'good day'],
                               [['hello world', 'good morning']]).score
  assert de['bleu'] == pytest.approx(want)
  assert de['copy_chrf'] == pytest.approx(sacrebleu.corpus_chrf(
      ['Hallo Welt', 'Guten Tag'], [['hello world', 'good morning']]).score)
  assert scores['languages']['fr']['bleu'] == pytest.approx(0.0)
  assert sorted(scores) == ['average', 'languages', 'pooled']
  assert scores['pooled']['chrf'] == pytest.approx(sacrebleu.corpus_chrf(
      ['hello world', 'good day', 'hello'],
      [['hello world', 'good morning', 'good morning']]).score)


def test_high_resource_languages():
  counts = {'de': 100, 'fr': 80, 'sw': 3, 'zu': 1}
  assert mt_decoder.HighResourceLanguages(counts) == {'de', 'fr'}
  assert mt_decoder.HighResourceLanguages({}) == set()


def test_hypotheses_stop_at_length_or_eos(corpus):
  _, spm_path = corpus
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  cat, sat = sp.piece_to_id('▁cat'), sp.piece_to_id('▁sat')
  detok = mt_decoder.Detokenizer(spm_path)
  ids, lengths = mt_decoder.BestHypotheses(
      {'ids': np.array([[cat, sat, 2, sat], [cat, sat, sat, 0]]),
       'lengths': np.array([4, 2])})
  assert [detok(r[:n]) for r, n in zip(ids, lengths)] == ['cat sat',
                                                           'cat sat']
  ids, lengths = mt_decoder.BestHypotheses({'ids': np.array([[4, 2]])})
  np.testing.assert_array_equal(lengths, [2])
  # Ids past the vocabulary (a padded softmax) read as <unk>.
  assert detok([cat, 10**6]) == sp.decode([cat, sp.unk_id()])


def _Execute(*args):
  lines = []
  trainer.Execute(trainer_testlib.ParseFlags(*args), printer=lines.append)
  return lines


def test_train_and_eval_then_eval_mode(tmp_path):
  args = ['--model=toy.FFRegression', f'--logdir={tmp_path}',
          '--params_override=task.train.eval_interval_steps=5;'
          'task.train.eval_num_batches=2']
  lines = _Execute(*args, '--mode=train_and_eval', '--max_steps=10')
  evals = [x.split(':')[0] for x in lines if x.startswith('eval Dev')]
  assert evals == ['eval Dev step 5', 'eval Dev step 10']
  lines = _Execute(*args, '--mode=eval', '--max_steps=10')
  assert lines[-1].startswith('eval Dev step 10: loss ')
  files = sorted(f for f in os.listdir(tmp_path / 'eval_dev')
                 if f.startswith('metrics-'))
  assert files == ['metrics-00000005.json', 'metrics-00000010.json']
  results = [json.loads((tmp_path / 'eval_dev' / f).read_text())
             for f in files]
  assert [r['step'] for r in results] == [5, 10]
  assert lines[-1] == 'eval Dev step 10: ' + ' '.join(  # Same checkpoint.
      f'{k} {v:.6f}' for k, v in results[1]['metrics'].items())
  assert sorted(results[0]['metrics']) == ['loss', 'mse']
  assert results[0]['languages']['all']['examples'] == 2 * 64
  assert any(n.startswith('events.out') for n in
             os.listdir(tmp_path / 'eval_dev'))


def test_eval_needs_a_checkpoint(tmp_path):
  with pytest.raises(trainer.ConfigError) as e:
    _Execute('--model=toy.FFRegression', f'--logdir={tmp_path}',
             '--mode=eval')
  assert str(e.value) == f'no checkpoint in {tmp_path}/train; train first'


def _NoHookMessage(mode, hook, what):
  return (f'--mode={mode}: FeedForwardRegression has no {what} '
          f'(BaseTask.{hook} returns None); use a task that defines one, '
          'e.g. a translation model')


@pytest.mark.parametrize('mode', ['decode', 'export'])
def test_decode_and_export_refuse_a_task_without_the_hook(tmp_path, mode):
  _Execute('--model=toy.FFRegression', f'--logdir={tmp_path}',
           '--max_steps=1')
  with pytest.raises(trainer.ConfigError) as e:
    _Execute('--model=toy.FFRegression', f'--logdir={tmp_path}',
             f'--mode={mode}')
  assert str(e.value) == (
      _NoHookMessage('export', 'CreateExportModule', 'export module')
      if mode == 'export' else
      _NoHookMessage('decode', 'CreateDecoder', 'decoder'))
  assert sorted(os.listdir(tmp_path)) == ['params.txt', 'train']


def test_cli_trains_evaluates_and_refuses_decode_of_a_regression_task(
    tmp_path):
  """The trainer binary runs a task that is not a translation model: train
  and eval succeed; decode and export are one line, exit 1."""
  base = ['--model=toy.FFRegression', f'--logdir={tmp_path}',
          '--params_override=task.train.eval_num_batches=2']
  run = trainer_testlib.RunTrainer(*base, '--mode=train', '--max_steps=4')
  assert run.returncode == 0, run.stderr[-3000:]
  run = trainer_testlib.RunTrainer(*base, '--mode=eval')
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.splitlines()[-1].startswith('eval Dev step 4: loss ')
  for mode, hook, what in (('decode', 'CreateDecoder', 'decoder'),
                           ('export', 'CreateExportModule', 'export module')):
    run = trainer_testlib.RunTrainer(*base, f'--mode={mode}')
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        'lingshard.trainer: error: ' + _NoHookMessage(mode, hook, what))
