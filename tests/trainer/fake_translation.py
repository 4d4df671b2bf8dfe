"""A tiny translation setting for the eval / decode / export tests: a TSV
corpus of two "languages", a word-level SentencePiece model shared by both
sides, and a fake task whose Decode maps source pieces through a weight
table (identity by default).

- `same`: the target is the source (a perfect copy scores BLEU 100);
- `rev`: the target is the source's words reversed.
"""

import os

import tensorflow as tf

from lingshard.data import inputs
from lingshard.data import vocab
from lingshard.layers import base_layer
from lingshard.models import base_model
from lingshard.nested_map import NestedMap
from lingshard.weight_init import WeightInit

SENTENCES = [
    'the cat sat on the mat', 'a dog ran in the park', 'we like green tea',
    'open the file now', 'save your work often', 'the sun is warm today',
    'read the book again', 'close all the windows', 'my friend has a red car',
    'delete this item', 'add a new user', 'the page was not found',
]


def WriteCorpus(directory):
  """(tsv path, spm model path) of the two-language corpus."""
  os.makedirs(directory, exist_ok=True)
  rows = [('same', s, s) for s in SENTENCES] + [
      ('rev', s, ' '.join(reversed(s.split()))) for s in SENTENCES]
  tsv = os.path.join(directory, 'dev.tsv')
  with open(tsv, 'w', encoding='utf-8') as f:
    f.writelines('\t'.join(r) + '\n' for r in rows)
  model = vocab.TrainModel(SENTENCES, vocab.TrainerOptions(
      vocab_size=60, character_coverage=1.0, byte_fallback=False,
      model_type='word'))
  spm_path = os.path.join(directory, 'words.model')
  with open(spm_path, 'wb') as f:
    f.write(model)
  return tsv, spm_path


def InputParams(tsv, spm_path, batch_size=5):
  p = inputs.MtInput.Params().Set(file_pattern=tsv, src_vocab=spm_path,
                                  tgt_vocab=spm_path, is_inference=True,
                                  eval_batch_size=batch_size)
  return p


class FakeTranslator(base_model.BaseTask):
  """Decode: target id = table[source id]. Loss: a fixed per-token NLL of
  scale * ((label % 7) + 1) / 7, so per-language values are predictable."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 60, 'Vocabulary size.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('table', base_layer.WeightParams(
        [self.params.vocab_size], init=WeightInit.Constant(0.0)))
    self.CreateVariable('scale', base_layer.WeightParams(
        [], init=WeightInit.Constant(1.0)))

  def ComputePredictions(self, theta, input_batch, **kwargs):
    del theta, kwargs
    return NestedMap(labels=input_batch.tgt.labels)

  def ComputeLoss(self, theta, predictions, input_batch):
    w = input_batch.tgt.weights
    per_token = theta.scale * tf.cast(predictions.labels % 7 + 1,
                                      tf.float32) / 7.0
    nll = tf.reduce_sum(per_token * w, axis=1)
    tokens = tf.reduce_sum(w, axis=1)
    total = tf.reduce_sum(tokens)
    loss = tf.reduce_sum(nll) / total
    metrics = NestedMap(loss=(loss, total), log_pplx=(loss, total))
    return metrics, NestedMap(nll=nll, num_tokens=tokens)

  def Decode(self, theta, src_ids, src_paddings):
    table = tf.cast(tf.round(theta.table), tf.int32)
    keep = tf.cast(1.0 - src_paddings, tf.int32)
    ids = tf.gather(table, src_ids) * keep
    return NestedMap(ids=ids, lengths=tf.reduce_sum(keep, axis=1),
                     scores=tf.zeros(tf.shape(ids)[:1]))


def NewTask(vocab_size=60):
  """A FakeTranslator with an identity table."""
  task = FakeTranslator.Params().Set(name='fake',
                                     vocab_size=vocab_size).Instantiate()
  task.vars.table.assign(tf.range(vocab_size, dtype=tf.float32))
  return task
