"""`LmInput`: batches of an lm_prepare corpus for the LM task (lm_model).

Each line of a split file is one sentence of space-separated words; a word
missing from vocab.txt is <unk>. Batch: NestedMap(ids [B, T] int32 = <s>
w1..wn, labels [B, T] int32 = w1..wn </s>, paddings [B, T] float32, 1.0 =
pad), with T one of `bucket_upper_bounds` (n + 1 <= T).

Training: repeated, shuffled, bucketed by length into the static shapes
[bucket_batch_limits[i], bucket_upper_bounds[i]]; sentences longer than the
largest bound are dropped. Eval (`is_inference`): file order, one pass,
sentences truncated to the largest bound (never dropped), batches of
eval_batch_size (the last may be smaller) padded to the largest bound.
Tokenisation and lookup are in the graph (tf.strings + a static hash
table): the dataset is pure tf.data.
"""

import glob
import os

import tensorflow as tf

from lingshard import base_input
from lingshard.data import lm_prepare
from lingshard.nested_map import NestedMap


def _PrepareHint(path):
  return ('prepare the corpus with: python -m ' +
          ' '.join(lm_prepare.PrepareArgs(os.path.dirname(path))))


def VocabWords(path):
  """The words of a vocab.txt (line i is id i); InputError if missing."""
  if not os.path.isfile(path):
    raise base_input.InputError(f'vocabulary not found: {path}; '
                                f'{_PrepareHint(path)}')
  with open(path, encoding='utf-8') as f:
    words = f.read().splitlines()
  if tuple(words[:4]) != lm_prepare.SPECIALS:
    raise base_input.InputError(
        f'{path} is not an lm_prepare vocabulary (its first lines must be '
        f'{" ".join(lm_prepare.SPECIALS)}); {_PrepareHint(path)}')
  return words


class LmInput(base_input.BaseInputGenerator):
  """Sentences of an lm_prepare split as LM batches (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('file_pattern', '', 'Split file(s), e.g. data/lm_en/train.txt.')
    p.Define('vocab', '', 'vocab.txt of the corpus.')
    p.Define('bucket_upper_bounds', [16, 32, 64], 'Static lengths T '
             '(words + 1), ascending.')
    p.Define('bucket_batch_limits', [64, 32, 16], 'Batch size per bucket.')
    p.Define('is_inference', False, 'Eval: one pass in file order.')
    p.Define('eval_batch_size', 32, 'Eval batch size.')
    p.Define('shuffle_buffer_size', 10000, 'Training shuffle buffer.')
    p.Define('seed', 1234, 'Shuffle seed.')
    p.Define('num_hosts', 1, 'Training: number of input hosts (workers).')
    p.Define('host_index', 0, 'Training: this host\'s index; it reads '
             'every num_hosts-th sentence from host_index on.')
    return p

  @classmethod
  def ParamsForHost(cls, params, num_hosts, host_index):
    """This host's sentences and its share of each bucket's global batch."""
    return base_input.ShardBatchLimits(params, num_hosts, host_index)

  @classmethod
  def ParamsForCorpus(cls, data_dir, split='train'):
    """Params reading `split` of an lm_prepare directory."""
    return cls.Params().Set(
        file_pattern=os.path.join(data_dir, f'{split}.txt'),
        vocab=os.path.join(data_dir, 'vocab.txt'),
        is_inference=split != 'train')

  def VocabSize(self):
    return len(VocabWords(self.params.vocab))

  def SplitName(self, dataset):
    return os.path.splitext(os.path.basename(self.params.file_pattern))[0]

  def _Files(self):
    files = sorted(glob.glob(self.params.file_pattern))
    if not files:
      raise base_input.InputError(
          f'no corpus file matches {self.params.file_pattern}; '
          f'{_PrepareHint(self.params.file_pattern)}')
    return files

  def _Table(self):
    words = VocabWords(self.params.vocab)
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(words), tf.range(len(words), dtype=tf.int64)),
        default_value=lm_prepare.UNK_ID)

  def GetDataset(self):
    """The tf.data.Dataset of NestedMap batches (module docstring)."""
    p = self.params
    files, table = self._Files(), self._Table()
    max_len = p.bucket_upper_bounds[-1]

    def Ids(line):
      words = tf.strings.split(tf.strings.strip(line), ' ')
      return tf.cast(table.lookup(words), tf.int32)

    ds = tf.data.TextLineDataset(files).filter(
        lambda line: tf.strings.length(tf.strings.strip(line)) > 0).map(Ids)
    if p.is_inference:
      ds = ds.map(lambda w: w[:max_len - 1]).padded_batch(
          p.eval_batch_size, padded_shapes=[max_len - 1])
      return ds.map(lambda w: _Batch(w, max_len))
    ds = ds.shard(p.num_hosts, p.host_index).filter(
        lambda w: tf.size(w) < max_len).repeat().shuffle(
        p.shuffle_buffer_size, seed=p.seed)
    bounds = list(p.bucket_upper_bounds)
    ds = ds.bucket_by_sequence_length(
        lambda w: tf.size(w) + 1, [b + 1 for b in bounds[:-1]],
        list(p.bucket_batch_limits), padded_shapes=[None],
        drop_remainder=True)
    bounds_t = tf.constant(bounds, tf.int32)

    def ToBatch(words_bn):
      longest = tf.shape(words_bn)[1] + 1
      length = tf.gather(bounds_t, tf.reduce_sum(
          tf.cast(bounds_t < longest, tf.int32)))
      return _Batch(words_bn, length)

    return ds.map(ToBatch)


def _Batch(words_bn, length):
  """ids / labels / paddings [B, length] of padded words [B, n] (0 = pad)."""
  b = tf.shape(words_bn)[0]
  real = tf.cast(words_bn > 0, tf.int32)
  num = tf.reduce_sum(real, axis=1)
  bos = tf.fill([b, 1], lm_prepare.BOS_ID)
  ids = tf.concat([bos, words_bn], axis=1)
  # </s> right after the last word of each sentence.
  eos = tf.one_hot(num, tf.shape(words_bn)[1] + 1, dtype=tf.int32)
  labels = tf.concat([words_bn, tf.zeros([b, 1], tf.int32)], 1) + (
      eos * lm_prepare.EOS_ID)
  paddings = 1.0 - tf.sequence_mask(num + 1, tf.shape(ids)[1], tf.float32)
  pad_to = length - tf.shape(ids)[1]
  ids, labels, paddings = (tf.pad(t, [[0, 0], [0, pad_to]], constant_values=c)
                           for t, c in ((ids, 0), (labels, 0), (paddings, 1)))
  return NestedMap(ids=tf.ensure_shape(ids, [None, None]), labels=labels,
                   paddings=paddings)
