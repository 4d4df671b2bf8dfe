"""Translation decoding: beam search via the task, SentencePiece
detokenization, sacrebleu BLEU / chrF per language and averaged, the
copy-the-source baseline and per-language hypothesis files.
`TransformerMTModel.CreateDecoder` builds an `MtDecoder`; the trainer runs
it through lingshard/train/decode_loop.py.

Seams with the model and data:
- `task.Decode(theta, src_ids, src_paddings, **decode_kwargs)` returns a
  NestedMap/dict with the best hypothesis `ids` [B, L] and optionally
  `lengths` [B] (mt_model.TransformerMTModel.Decode does); output stops at
  EOS or `lengths`.
- batches carry `src.ids`, `src.paddings`, `tgt.labels`, `tgt.paddings`
  and `lang` [B]; the raw strings `src.strs` / `tgt.strs` (MtInput's
  inference batches) are the source / reference when present (no
  tokenizer round trip), else they are detokenized from ids.
- the target (and, for the copy baseline without `src.strs`, source)
  SentencePiece model files (the input generator's `VocabFiles()`).

Scores: per language corpus BLEU and chrF of the hypotheses and of the
copy-the-source baseline; `average` is the unweighted mean over languages,
`high` / `low` the same over the high- / low-resource languages
(`HighResourceLanguages`).
"""

import collections
import json
import os

import numpy as np
import sacrebleu
import tensorflow as tf

from lingshard import base_input
from lingshard.data import corpus_io
from lingshard.data import vocab
from lingshard.nested_map import NestedMap
from lingshard.train import atomic
from lingshard.train import decode_loop
from lingshard.train import strategies

Record = collections.namedtuple('Record',
                                ['language', 'source', 'hypothesis',
                                 'reference'])


class Detokenizer:
  """ids -> text with a SentencePiece model; stops at EOS, drops pad/BOS.

  Ids past the model's vocabulary (a model whose softmax is padded beyond
  the SentencePiece vocabulary) read as <unk>. A missing model file raises
  corpus_io.CorpusError naming it and the prepare command.
  """

  def __init__(self, model_file):
    if isinstance(model_file, str) and not os.path.isfile(model_file):
      raise corpus_io.MissingFileError('vocabulary', model_file)
    with open(model_file, 'rb') as f:
      self._sp = vocab.LoadModel(f.read(), 'vocabulary', model_file)
    self._eos = self._sp.eos_id()
    self._drop = {i for i in (self._sp.pad_id(), self._sp.bos_id()) if i >= 0}
    self._size = self._sp.get_piece_size()

  def __call__(self, ids):
    out = []
    for i in ids:
      i = int(i)
      if i == self._eos:
        break
      if i not in self._drop:
        out.append(i if 0 <= i < self._size else self._sp.unk_id())
    return self._sp.decode(out)


def BestHypotheses(decoded):
  """(ids [B, L], lengths [B] (default L)) numpy of `task.Decode`'s output."""
  ids = np.asarray(decoded['ids'])
  lengths = decoded.get('lengths')
  if lengths is None:
    return ids, np.full([ids.shape[0]], ids.shape[1], np.int64)
  return ids, np.asarray(lengths)


def _RepeatLastRow(t, rows):
  """`t` [b, ...] with its last row repeated to `rows` >= b rows."""
  return tf.concat([t, tf.repeat(t[-1:], rows - t.shape[0], axis=0)], 0)


def _Texts(tensor):
  return [t.decode('utf-8') for t in np.asarray(tensor).reshape([-1])]


def _Unpadded(ids, paddings):
  return [row[np.asarray(p) < 0.5] for row, p in zip(np.asarray(ids),
                                                      np.asarray(paddings))]


class MtDecoder(decode_loop.BaseDecoder):
  """Decodes batches with a task into Records and scores them.

  Args:
    task: has `Decode(theta, src_ids, src_paddings, **decode_kwargs)`.
    target_detokenizer / source_detokenizer: Detokenizer (or any ids -> str
      callable); the source one is needed only without `src.strs`.
    decode_kwargs: passed to `task.Decode`.
    The search is XLA-compiled when the task's `params.decode.jit` is set.
    high_resource: languages scored as `high` (the rest as `low`); None
      scores no high / low groups.
    batch_size: the input's batch size, or None. A smaller batch (an eval
      input's last) is decoded with its last row repeated up to it and the
      copies' outputs dropped, so the search is traced and compiled once
      per bucket shape, not again for the last batch. Rows decode
      independently (inference MoE routes each token alone:
      TransformerMTModel.InferenceParams), so the real rows' hypotheses are
      unchanged.
  """

  def __init__(self, task, target_detokenizer, source_detokenizer=None,
               decode_kwargs=None, high_resource=None, batch_size=None):
    self.task = task
    self._batch_size = batch_size
    self._tgt = target_detokenizer
    self._src = source_detokenizer
    self._high = high_resource
    self._decode_kwargs = dict(decode_kwargs or {})
    p = task.params
    self._jit = 'decode' in p and 'jit' in p.decode and p.decode.jit
    self._decode = None  # Compiled where the decoder is placed (Place).

  def _Decode(self, theta, src):
    return self.task.Decode(self.task.ShardTheta(theta), src.ids,
                            src.paddings, **self._decode_kwargs)

  def DecodeBatch(self, theta, batch):
    """Records of one batch."""
    rows = int(batch.src.ids.shape[0])
    src_ids, src_paddings = batch.src.ids, batch.src.paddings
    if self._batch_size and rows < self._batch_size:
      src_ids, src_paddings = (_RepeatLastRow(t, self._batch_size)
                               for t in (src_ids, src_paddings))
    if self._decode is None:
      self._decode = (self.replicated or strategies.Replicated()).Function(
          self._Decode, jit=self._jit)
    blocks = [BestHypotheses(out) for out in self._decode(
        theta, NestedMap(ids=src_ids, paddings=src_paddings))]
    ids, lengths = (np.concatenate(x) for x in zip(*blocks))
    ids, lengths = ids[:rows], lengths[:rows]
    hyps = [self._tgt(row[:n]) for row, n in zip(ids, lengths)]
    if 'strs' in batch.tgt:
      refs = _Texts(batch.tgt.strs)
    else:
      refs = [self._tgt(r) for r in _Unpadded(batch.tgt.labels,
                                              batch.tgt.paddings)]
    if 'strs' in batch.src:
      srcs = _Texts(batch.src.strs)
    elif self._src is not None:
      srcs = [self._src(r) for r in _Unpadded(batch.src.ids,
                                              batch.src.paddings)]
    else:
      srcs = [''] * len(hyps)
    langs = (_Texts(batch.lang) if 'lang' in batch else
             ['all'] * len(hyps))
    return [Record(*r) for r in zip(langs, srcs, hyps, refs)]

  def DecodeDataset(self, theta, dataset, num_batches=0):
    """Records of every batch (or the first `num_batches`)."""
    return decode_loop.DecodeDataset(self, theta, dataset, num_batches)

  def Finalize(self, records, out_dir, step):
    """Scores (ScoreByLanguage), writes them and the hypotheses to
    `out_dir` (WriteOutputs); returns (scores, report text)."""
    scores = ScoreByLanguage(records, self._high)
    WriteOutputs(out_dir, records, scores, step)
    return scores, '\n'.join([
        FormatExamples(records), FormatScores(scores),
        f'hypotheses and scores written to {out_dir}'])


def CorpusScores(hypotheses, references):
  """{'bleu', 'chrf'} of sacrebleu's corpus scores (default tokenizers)."""
  return {'bleu': sacrebleu.corpus_bleu(hypotheses, [references]).score,
          'chrf': sacrebleu.corpus_chrf(hypotheses, [references]).score}


def HighResourceLanguages(train_counts):
  """Languages with at least the median number of training pairs."""
  if not train_counts:
    return set()
  median = float(np.median(list(train_counts.values())))
  return {lang for lang, n in train_counts.items() if n >= median}


def _Mean(rows, key):
  return float(np.mean([r[key] for r in rows])) if rows else float('nan')


def _ModelAndCopy(records):
  """Corpus BLEU/chrF of the hypotheses and of copying the sources."""
  refs = [r.reference for r in records]
  model = CorpusScores([r.hypothesis for r in records], refs)
  copy = CorpusScores([r.source for r in records], refs)
  return {'bleu': model['bleu'], 'chrf': model['chrf'],
          'copy_bleu': copy['bleu'], 'copy_chrf': copy['chrf'],
          'n': len(records)}


def ScoreByLanguage(records, high_resource=None):
  """Per-language and averaged BLEU/chrF of records and of copying sources.

  Returns {'languages': {lang: {bleu, chrf, copy_bleu, copy_chrf, n}},
  'average' / 'high' / 'low': the same keys averaged over languages,
  'pooled': corpus scores of all records together}.
  """
  by_lang = collections.defaultdict(list)
  for r in records:
    by_lang[r.language].append(r)
  languages = {lang: _ModelAndCopy(by_lang[lang]) for lang in sorted(by_lang)}
  out = {'languages': languages}
  groups = {'average': list(languages)}
  if high_resource is not None:
    groups['high'] = [g for g in languages if g in high_resource]
    groups['low'] = [g for g in languages if g not in high_resource]
  for group, langs in groups.items():
    rows = [languages[g] for g in langs]
    out[group] = {k: _Mean(rows, k) for k in ('bleu', 'chrf', 'copy_bleu',
                                              'copy_chrf')}
    out[group]['languages'] = len(rows)
    out[group]['n'] = int(sum(r['n'] for r in rows))
  out['pooled'] = dict(_ModelAndCopy(records), languages=len(languages))
  return out


def FormatScores(scores):
  """A text table: one row per language, then the averages."""
  head = f'{"lang":<12}{"n":>6}{"BLEU":>8}{"chrF":>8}{"copyBLEU":>10}' + (
      f'{"copychrF":>10}')
  lines = [head]
  rows = list(scores['languages'].items()) + [
      (f'[{g}]', scores[g]) for g in ('average', 'high', 'low', 'pooled')
      if g in scores]
  for name, s in rows:
    lines.append(f'{name:<12}{s["n"]:>6}{s["bleu"]:>8.2f}{s["chrf"]:>8.2f}'
                 f'{s["copy_bleu"]:>10.2f}{s["copy_chrf"]:>10.2f}')
  return '\n'.join(lines) + '\n'


def FormatExamples(records, n=5):
  """The first record of up to `n` languages: source, hypothesis, reference."""
  seen, lines = set(), []
  for r in records:
    if r.language not in seen and len(seen) < n:
      seen.add(r.language)
      lines += [f'[{r.language}] {r.source}', f'  hyp: {r.hypothesis}',
                f'  ref: {r.reference}']
  return '\n'.join(lines) + ('\n' if lines else '')


def WriteOutputs(out_dir, records, scores, step=None):
  """`<lang>.{src,hyp,ref}.txt` (line-aligned), scores.json, scores.txt.

  The directory is built beside `out_dir` and replaces it whole
  (atomic.ReplaceDir: a previous decode's files, of languages no longer
  decoded too, are gone; a failed write leaves `out_dir` as it was).

  Raises:
    base_input.InputError: a language is not corpus_io.IsSafeName (the
      file would be named outside `out_dir`); nothing is written then.
    atomic.ERRORS: the file system refused a write (e.g. a full disk).
  """
  by_lang = collections.defaultdict(list)
  for r in records:
    by_lang[r.language].append(r)
  for lang in sorted(by_lang):
    if not corpus_io.IsSafeName(lang):
      raise base_input.InputError(
          f'cannot write decode output for language {lang!r} in {out_dir}: '
          f'language codes must use {corpus_io.SAFE_NAME_RULE}')

  def Build(directory):
    for lang, rs in sorted(by_lang.items()):
      for field, ext in (('source', 'src'), ('hypothesis', 'hyp'),
                         ('reference', 'ref')):
        path = os.path.join(directory, f'{lang}.{ext}.txt')
        with tf.io.gfile.GFile(path, 'w') as f:
          f.write(''.join(getattr(r, field).replace('\n', ' ') + '\n'
                          for r in rs))
    with tf.io.gfile.GFile(os.path.join(directory, 'scores.json'), 'w') as f:
      f.write(json.dumps(dict(scores, step=step), indent=1, sort_keys=True))
    with tf.io.gfile.GFile(os.path.join(directory, 'scores.txt'), 'w') as f:
      f.write(FormatScores(scores))

  atomic.ReplaceDir(out_dir, Build, tag='decode')


def ForTask(task, input_generator, train_input_generator=None):
  """The MtDecoder of `task` on `input_generator` (an MtInput): its
  vocabulary files detokenize; the training input's language counts give
  the high-resource languages."""
  source_file, target_file = input_generator.VocabFiles()
  counts = (train_input_generator.LanguageCounts() if train_input_generator
            is not None else None)
  return MtDecoder(task, Detokenizer(target_file), Detokenizer(source_file),
                   high_resource=(HighResourceLanguages(counts)
                                  if counts is not None else None),
                   batch_size=input_generator.EvalBatchSize())
