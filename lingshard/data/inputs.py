"""tf.data input generator for the prepared translation corpus.

`MtInput` reads a `lang<TAB>source<TAB>target` TSV (corpus_io), tokenizes
in-graph with `tensorflow_text.SentencepieceTokenizer` and yields NestedMap
batches:

  src.ids      [B, L] int32   source pieces then EOS (en2xx: `<2xx>` first)
  src.paddings [B, L] float32 1.0 at padding
  tgt.ids      [B, L] int32   BOS then target pieces (decoder input)
  tgt.labels   [B, L] int32   target pieces then EOS (ids shifted by one)
  tgt.paddings [B, L] float32
  tgt.weights  [B, L] float32 1 - paddings
  lang         [B]    string  the example's language code (xx)
  (eval only) src.strs / tgt.strs [B] string: the raw TSV texts, the
  references to score against.

Directions: 'xx2en' (default) reads TSV source -> target and adds no tag:
the target is always English, and the source language is left for the
encoder to recognise, as in M4's many-to-one models. 'en2xx' reads target
-> source and puts the `<2xx>` tag (a symbol of spm_en.model) first in the
source, telling the decoder which language to produce.

Training (is_inference=False): each host keeps every num_hosts-th example
of each language, shuffles within language from a seed, repeats, and draws
languages with temperature sampling p_l ~ (n_l/N)^(1/T) (N over the whole
corpus, so all hosts agree). Examples longer than the largest bucket are
dropped; the rest are padded to the smallest bucket bound that fits and
batched with that bucket's batch size, so every batch has one of the
static shapes [bucket_batch_limits[i], bucket_upper_bounds[i]]. GetDataset
counts the dropped examples once, eagerly (CountTooLong), and raises
base_input.InputError if every example would be dropped (the repeated
stream would otherwise never yield a batch).

Missing data (corpus or vocabulary files) raises corpus_io.CorpusError
when data is first read (Rows, GetDataset), never at construction.

Eval (is_inference=True): file order, one pass, no sampling or shuffling;
sequences longer than the largest bucket are truncated (never dropped, so
scores cover every example); batches of eval_batch_size (the last may be
smaller) padded to the smallest bucket bound that fits.
"""

import glob
import hashlib
import os

from absl import logging
import tensorflow as tf
import tensorflow_text as tf_text

from lingshard import base_input
from lingshard.data import corpus_io
from lingshard.data import sampling
from lingshard.data import vocab
from lingshard.nested_map import NestedMap

DIRECTIONS = ('xx2en', 'en2xx')


def _DerivedSeed(*parts):
  """A stable 31-bit seed from strings/ints (never Python's hash())."""
  key = '\x1f'.join(str(p) for p in parts).encode('utf-8')
  return int.from_bytes(hashlib.sha256(key).digest()[:4], 'big') >> 1


def _ReadModel(path, what):
  if not path:
    raise corpus_io.CorpusError(
        f'{what} is not set; set it to a SentencePiece model file')
  if not os.path.isfile(path):
    raise corpus_io.MissingFileError(what, path)
  with open(path, 'rb') as f:
    return f.read()


class MtInput(base_input.BaseInputGenerator):
  """Translation batches from a prepared TSV corpus; see the module doc."""

  @classmethod
  def Params(cls):
    """Default params; set file_pattern, src_vocab and tgt_vocab at least."""
    p = super().Params()
    p.Define('name', 'mt_input', 'Name of this input generator.')
    p.Define('file_pattern', None,
             'TSV file (lang<TAB>source<TAB>target), or a glob of several '
             '(read in sorted order).')
    p.Define('src_vocab', None, 'SentencePiece model of the source side '
             '(spm_multi.model for xx2en, spm_en.model for en2xx).')
    p.Define('tgt_vocab', None, 'SentencePiece model of the target side.')
    p.Define('direction', 'xx2en', "'xx2en' or 'en2xx' (see module doc).")
    p.Define('languages', None,
             'None for all, or a list of language codes to keep.')
    p.Define('bucket_upper_bounds', [8, 16, 32, 64],
             'Static sequence lengths (tokens incl. BOS/EOS/tag), ascending. '
             'The last is the maximum length.')
    p.Define('bucket_batch_limits', [128, 64, 32, 16],
             'Batch size of each bucket (training).')
    p.Define('temperature', 5.0, 'Language sampling temperature T > 0; '
             '1 = proportional, 5 = M4; None = T=inf (uniform).')
    p.Define('shuffle', True, 'Training: shuffle within each language.')
    p.Define('shuffle_buffer_size', 2048,
             'Training: shuffle buffer per language.')
    p.Define('repeat', True, 'Training: repeat each language forever. If '
             'False, languages drop out of sampling as they run out.')
    p.Define('seed', 1234, 'Seed of shuffling and sampling.')
    p.Define('num_hosts', 1, 'Number of input hosts (workers).')
    p.Define('host_index', 0, 'Index of this host in [0, num_hosts).')
    p.Define('is_inference', False, 'Eval reader: file order, one pass, no '
             'sampling; long sequences truncated instead of dropped.')
    p.Define('eval_batch_size', None,
             'Eval batch size; None = the last bucket_batch_limits entry.')
    return p

  @classmethod
  def ParamsForCorpus(cls, data_dir, split='train', direction='xx2en',
                      noph=False, shared_vocab=False):
    """Params reading `split` of a prepare.py output directory.

    Fills file_pattern, both vocabularies for `direction` (the shared
    model on both sides if `shared_vocab`) and is_inference (True for any
    split but 'train').
    """
    p = cls.Params()
    vocab_dir = os.path.join(data_dir, vocab.VOCAB_DIR)
    p.file_pattern = corpus_io.SplitPath(data_dir, split, noph=noph)
    p.direction = direction
    if shared_vocab:
      p.src_vocab = p.tgt_vocab = os.path.join(vocab_dir, vocab.SHARED_MODEL)
    else:
      multi = os.path.join(vocab_dir, vocab.MULTI_MODEL)
      en = os.path.join(vocab_dir, vocab.EN_MODEL)
      p.src_vocab, p.tgt_vocab = ((multi, en) if direction == 'xx2en' else
                                  (en, multi))
    p.is_inference = split != 'train'
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.direction not in DIRECTIONS:
      raise ValueError(f'direction must be one of {DIRECTIONS}, got '
                       f'{p.direction!r}')
    bounds, limits = list(p.bucket_upper_bounds), list(p.bucket_batch_limits)
    if not bounds or len(bounds) != len(limits):
      raise ValueError('bucket_upper_bounds and bucket_batch_limits must be '
                       'non-empty and of equal length')
    if bounds != sorted(set(bounds)) or bounds[0] < 2 or min(limits) < 1:
      raise ValueError(f'bucket bounds must ascend from >= 2 and batch '
                       f'limits be >= 1: {bounds}, {limits}')
    if not 0 <= p.host_index < p.num_hosts:
      raise ValueError(f'host_index {p.host_index} not in [0, '
                       f'{p.num_hosts})')
    self._rows = None
    self._vocabs = None
    self._too_long = None

  def _Vocabs(self):
    """Loads the vocabularies once, when data is first read.

    Returns:
      NestedMap of src_sp / tgt_sp (sentencepiece processors) and src_tok /
      tgt_tok (in-graph tensorflow_text tokenizers).

    Raises:
      corpus_io.CorpusError: a vocabulary is not set, its file is missing
        or is not a SentencePiece model.
    """
    if self._vocabs is None:
      p = self.params
      src_model = _ReadModel(p.src_vocab, 'src_vocab')
      tgt_model = _ReadModel(p.tgt_vocab, 'tgt_vocab')
      src_sp = vocab.LoadModel(src_model, 'src_vocab', p.src_vocab)
      tgt_sp = vocab.LoadModel(tgt_model, 'tgt_vocab', p.tgt_vocab)
      # Eagerly, even when first called while tf.data traces a map
      # function: a tokenizer made inside that trace holds a graph tensor,
      # and the next GetDataset (train_and_eval's second evaluation)
      # could not capture it.
      with tf.init_scope():
        self._vocabs = NestedMap(
            src_sp=src_sp, tgt_sp=tgt_sp,
            src_tok=tf_text.SentencepieceTokenizer(src_model,
                                                   out_type=tf.int32),
            tgt_tok=tf_text.SentencepieceTokenizer(tgt_model,
                                                   out_type=tf.int32))
    return self._vocabs

  # ------------------------------------------------------------ reading
  def Rows(self):
    """Validated (lang, source, target) rows of all files, in file order.

    Raises:
      corpus_io.CorpusError: no file matches, a file is empty or a line is
        malformed, or no row is left after the `languages` filter.
    """
    if self._rows is None:
      p = self.params
      if not p.file_pattern:
        raise corpus_io.CorpusError(
            'file_pattern is not set; set it to a corpus TSV file or glob')
      paths = sorted(glob.glob(p.file_pattern))
      if not paths:
        raise corpus_io.CorpusError(
            f'no corpus file matches {p.file_pattern}; '
            f'{corpus_io.PrepareHint(p.file_pattern)}')
      rows = []
      for path in paths:
        rows.extend(corpus_io.ReadTsv(path))
      if p.languages is not None:
        keep = set(p.languages)
        rows = [r for r in rows if r[0] in keep]
        if not rows:
          raise corpus_io.CorpusError(
              f'no rows of languages {sorted(keep)} in {p.file_pattern}')
      self._rows = rows
    return self._rows

  @classmethod
  def ParamsForHost(cls, params, num_hosts, host_index):
    """This host's rows (every num_hosts-th of each language) and its share
    of each bucket's global batch."""
    return base_input.ShardBatchLimits(params, num_hosts, host_index)

  def SplitName(self, dataset):
    """`dev_unseen_en` for a file_pattern .../dev_unseen_en.tsv
    (`dev_unseen_en_noph` for .../dev_unseen_en.noph.tsv); for a glob,
    `dataset` in lower case."""
    pattern = self.params.file_pattern
    if isinstance(pattern, str) and '*' not in pattern:
      return os.path.basename(pattern).split('.')[0] + (
          '_noph' if '.noph.' in pattern else '')
    return dataset.lower()

  def VocabFiles(self):
    """(src_vocab, tgt_vocab): the SentencePiece model files."""
    return self.params.src_vocab, self.params.tgt_vocab

  def LanguageCounts(self):
    """{lang: rows in the whole corpus (all hosts)}, languages sorted."""
    return corpus_io.LanguageCounts(self.Rows())

  def SamplingProbs(self):
    """{lang: training sampling probability} for params.temperature."""
    return sampling.TemperatureProbs(self.LanguageCounts(),
                                     self.params.temperature)

  def _TagId(self, lang):
    tag = vocab.LangTag(lang)
    src_sp = self._Vocabs().src_sp
    tag_id = src_sp.piece_to_id(tag)
    if tag_id == src_sp.unk_id():
      raise ValueError(f'{tag} is not a symbol of src_vocab '
                       f'{self.params.src_vocab}')
    return tag_id

  def _Columns(self, rows):
    """(lang, src text, tgt text, tag id) lists in the model's direction."""
    if self.params.direction == 'xx2en':
      return ([r[0] for r in rows], [r[1] for r in rows],
              [r[2] for r in rows], [-1] * len(rows))
    tags = {lang: self._TagId(lang) for lang in sorted({r[0] for r in rows})}
    return ([r[0] for r in rows], [r[2] for r in rows],
            [r[1] for r in rows], [tags[r[0]] for r in rows])

  def _ColumnSlices(self, rows):
    """Dataset of `_Columns(rows)`, one element per row. The columns become
    tensors first: from_tensor_slices on Python lists walks them element by
    element (building data/ui_m4's training input: 2.45 s -> 1.75 s)."""
    lang, src, tgt, tag = self._Columns(rows)
    return tf.data.Dataset.from_tensor_slices((
        tf.constant(lang, tf.string), tf.constant(src, tf.string),
        tf.constant(tgt, tf.string), tf.constant(tag, tf.int32)))

  def _HostShard(self, rows):
    """Every num_hosts-th row, starting at host_index."""
    p = self.params
    return rows[p.host_index::p.num_hosts]

  def _TrainingRows(self):
    """{lang: this host's training rows}, languages sorted."""
    p = self.params
    groups = {}
    for row in self.Rows():
      groups.setdefault(row[0], []).append(row)
    # A language smaller than num_hosts still gives every host an example,
    # so that each host can sample it with the common probability.
    return {lang: (self._HostShard(groups[lang]) or
                   [groups[lang][p.host_index % len(groups[lang])]])
            for lang in sorted(groups)}

  def _Lengths(self, rows):
    """Featurized lengths max(|src.ids|, |tgt.ids|) of rows (_Featurize's
    EOS, BOS and en2xx tag included), with the Python tokenizers."""
    v = self._Vocabs()
    _, src, tgt, _ = self._Columns(rows)
    extra = 2 if self.params.direction == 'en2xx' else 1
    return [max(len(s) + extra, len(t) + 1) for s, t in zip(
        v.src_sp.encode(src), v.tgt_sp.encode(tgt))]

  def CountTooLong(self):
    """(too long, total): this host's training examples longer than the
    largest bucket bound, which training drops, and all of them.

    Counted once, eagerly, with the pipeline's SentencePiece models (the
    Python API tokenizes exactly as tensorflow_text does in the graph).
    """
    if self._too_long is None:
      bound = self.params.bucket_upper_bounds[-1]
      lengths = [n for rows in self._TrainingRows().values()
                 for n in self._Lengths(rows)]
      self._too_long = (sum(n > bound for n in lengths), len(lengths))
    return self._too_long

  def _CheckSomeExamplesFit(self):
    """Raises if training would drop every example (and so never yield a
    batch); logs how many it drops otherwise."""
    p = self.params
    too_long, total = self.CountTooLong()
    where = p.file_pattern if p.num_hosts == 1 else (
        f'{p.file_pattern} (host {p.host_index} of {p.num_hosts})')
    bound = p.bucket_upper_bounds[-1]
    if too_long == total:
      raise base_input.InputError(
          f'all {total} examples of {where} are longer than the largest '
          f'bucket bound {bound} (source or target tokens incl. EOS); raise '
          f'input.bucket_upper_bounds')
    if too_long:
      logging.info('%s: %d of %d examples are longer than the largest bucket '
                   'bound %d and are dropped', where, too_long, total, bound)

  def SampledExamples(self):
    """Training stream of (lang, src text, tgt text, tag id) before
    tokenization: per-language shuffle + repeat + temperature sampling."""
    p = self.params
    groups = self._TrainingRows()
    probs = self.SamplingProbs()
    datasets, weights = [], []
    for lang, rows in groups.items():
      ds = self._ColumnSlices(rows)
      if p.shuffle:
        ds = ds.shuffle(min(len(rows), p.shuffle_buffer_size),
                        seed=_DerivedSeed(p.seed, lang, p.host_index),
                        reshuffle_each_iteration=True)
      if p.repeat:
        ds = ds.repeat()
      datasets.append(ds)
      weights.append(probs[lang])
    if len(datasets) == 1:
      return datasets[0]
    return tf.data.Dataset.sample_from_datasets(
        datasets, weights=weights, seed=_DerivedSeed(p.seed, p.host_index),
        stop_on_empty_dataset=False)

  # ------------------------------------------------------- featurizing
  def _Featurize(self, lang, src, tgt, tag):
    """Tokenizes one example; returns a flat dict of unpadded features."""
    v = self._Vocabs()
    src_ids = v.src_tok.tokenize(src)
    tgt_ids = v.tgt_tok.tokenize(tgt)
    eos = tf.constant([vocab.EOS_ID], tf.int32)
    bos = tf.constant([vocab.BOS_ID], tf.int32)
    if self.params.direction == 'en2xx':
      src_ids = tf.concat([tf.reshape(tag, [1]), src_ids], 0)
    src_ids = tf.concat([src_ids, eos], 0)
    return {'lang': lang, 'src_strs': src, 'tgt_strs': tgt,
            'src_ids': src_ids,
            'tgt_ids': tf.concat([bos, tgt_ids], 0),
            'tgt_labels': tf.concat([tgt_ids, eos], 0)}

  def _Length(self, ex):
    return tf.maximum(tf.size(ex['src_ids']), tf.size(ex['tgt_ids']))

  def _Truncate(self, ex):
    """Eval: cuts sequences to the largest bucket, keeping the final EOS."""
    max_len = self.params.bucket_upper_bounds[-1]
    ex = dict(ex)
    src = ex['src_ids']
    ex['src_ids'] = tf.cond(
        tf.size(src) > max_len,
        lambda: tf.concat([src[:max_len - 1], src[-1:]], 0), lambda: src)
    ex['tgt_ids'] = ex['tgt_ids'][:max_len]
    ex['tgt_labels'] = ex['tgt_labels'][:max_len]
    return ex

  def _PaddedShapes(self, length):
    seq = tf.reshape(tf.cast(length, tf.int64), [1])
    return {'lang': [], 'src_strs': [], 'tgt_strs': [], 'src_ids': seq,
            'tgt_ids': seq, 'tgt_labels': seq}

  def _ToBatch(self, ex, length):
    """Pads a batch of dicts to `length` and packs it into a NestedMap."""
    def Pad(x):
      return tf.pad(x, [[0, 0], [0, length - tf.shape(x)[1]]])

    def Paddings(x):
      # Token ids are never PAD_ID, so padding is exactly where ids == 0.
      return tf.cast(tf.equal(x, vocab.PAD_ID), tf.float32)

    src_ids, tgt_ids = Pad(ex['src_ids']), Pad(ex['tgt_ids'])
    tgt_paddings = Paddings(tgt_ids)
    batch = NestedMap(
        src=NestedMap(ids=src_ids, paddings=Paddings(src_ids)),
        tgt=NestedMap(ids=tgt_ids, labels=Pad(ex['tgt_labels']),
                      paddings=tgt_paddings, weights=1.0 - tgt_paddings),
        lang=ex['lang'])
    if self.params.is_inference:
      batch.src.strs = ex['src_strs']
      batch.tgt.strs = ex['tgt_strs']
    return batch

  def BatchSpec(self, bucket=-1):
    """The numeric batch of training bucket `bucket` (base_input): B =
    its batch limit, T = its upper bound; what _ToBatch makes."""
    p = self.params
    try:
      b, t = p.bucket_batch_limits[bucket], p.bucket_upper_bounds[bucket]
    except IndexError:
      raise base_input.InputError(
          f'bucket {bucket} out of range: {len(p.bucket_upper_bounds)} '
          f'buckets {list(p.bucket_upper_bounds)}') from None
    ids = tf.TensorSpec([b, t], tf.int32)
    floats = tf.TensorSpec([b, t], tf.float32)
    return NestedMap(src=NestedMap(ids=ids, paddings=floats),
                     tgt=NestedMap(ids=ids, labels=ids, paddings=floats,
                                   weights=floats))

  # ------------------------------------------------------------ datasets
  def _TrainBatches(self, ds):
    p = self.params
    bounds = tf.constant(p.bucket_upper_bounds, tf.int32)
    limits = tf.constant(p.bucket_batch_limits, tf.int64)
    ds = ds.filter(lambda ex: self._Length(ex) <= p.bucket_upper_bounds[-1])

    def Key(ex):
      # Index of the smallest bucket whose bound fits the example.
      return tf.cast(tf.reduce_sum(
          tf.cast(bounds < self._Length(ex), tf.int32)), tf.int64)

    def Reduce(key, window):
      length = tf.gather(bounds, key)
      return window.padded_batch(
          tf.gather(limits, key), padded_shapes=self._PaddedShapes(length),
          drop_remainder=True).map(lambda b: (b, length))

    ds = ds.group_by_window(Key, Reduce,
                            window_size_func=lambda key: tf.gather(limits, key))
    return ds.map(self._ToBatch)

  def EvalBatchSize(self):
    """The rows of every eval batch but the last (which may have fewer)."""
    p = self.params
    return p.eval_batch_size or p.bucket_batch_limits[-1]

  def _EvalBatches(self, ds):
    p = self.params
    bounds = tf.constant(p.bucket_upper_bounds, tf.int32)
    ds = ds.map(self._Truncate).padded_batch(self.EvalBatchSize())

    def Bucketed(ex):
      longest = tf.maximum(tf.shape(ex['src_ids'])[1],
                           tf.shape(ex['tgt_ids'])[1])
      length = tf.gather(bounds, tf.reduce_sum(
          tf.cast(bounds < longest, tf.int32)))
      return self._ToBatch(ex, length)

    return ds.map(Bucketed)

  def GetDataset(self):
    """The tf.data.Dataset of NestedMap batches (see the module doc)."""
    p = self.params
    if p.is_inference:
      rows = self._HostShard(self.Rows())
      if not rows:
        raise corpus_io.CorpusError(
            f'host {p.host_index} of {p.num_hosts} has no rows of '
            f'{p.file_pattern}')
      ds = self._ColumnSlices(rows)
    else:
      self._CheckSomeExamplesFit()
      ds = self.SampledExamples()
    # The vocabularies load here, after the corpus is found (its error comes
    # first), not in _Featurize's trace: autograph would try, and warn that
    # it fails, to convert the file checks of loading.
    self._Vocabs()
    ds = ds.map(self._Featurize, num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    ds = self._EvalBatches(ds) if p.is_inference else self._TrainBatches(ds)
    return ds.prefetch(tf.data.AUTOTUNE)
