"""Export: a SavedModel whose `translate` signature maps raw strings to
English strings, SentencePiece included in the graph (tensorflow_text).

  translate(source: string [B], language: string [B]) -> {'translation': [B]}

Inside: source SentencePiece -> ids (+ EOS, and a `<2xx>` tag first for
the en -> xx direction, as lingshard/data/inputs.py does), padded to
[B, T] with paddings; `task.Decode(theta, ids, paddings)` (see decode_loop
for that seam) on chunks of a static batch size (MT decoding needs a static
batch), via tf.map_fn; the best beam is cut at EOS / its length and
detokenized with the target model. The model protos and the weights are
stored in the SavedModel, so a fresh process needs only

  import tensorflow as tf, tensorflow_text  # registers SentencePiece ops
  tf.saved_model.load(path).translate(source=..., language=...)
"""

import os

import tensorflow as tf
import tensorflow_text as tf_text

from lingshard.data import vocab

EOS_ID, PAD_ID, BOS_ID = vocab.EOS_ID, vocab.PAD_ID, vocab.BOS_ID


def _BestBeam(decoded):
  """ids [B, T] and lengths [B] (default T) of `task.Decode`'s output."""
  ids = tf.convert_to_tensor(decoded['ids'])
  lengths = decoded.get('lengths')
  if lengths is None:
    lengths = tf.fill(tf.shape(ids)[:1], tf.shape(ids)[1])
  return ids, lengths


class Translator(tf.Module):
  """The exported module: weights, both tokenizers and `translate`.

  Args:
    task: the inference task (its Decode is traced; it is not saved itself).
    theta: NestedMap of the weights' variables.
    source_model / target_model: serialized SentencePiece model protos.
    max_source_length: source tokens kept, EOS included.
    source_tag: prepend the `<2{language}>` token (the en -> xx direction).
    batch_size: the static batch of each Decode call; inputs are padded
      with empty strings to a multiple of it.
  """

  def __init__(self, task, theta, source_model, target_model,
               max_source_length=256, source_tag=False, batch_size=8,
               decode_kwargs=None):
    super().__init__(name='translator')
    self.weights = list(theta.Flatten())  # Tracked: saved with the model.
    structure = theta
    kwargs = dict(decode_kwargs or {})
    # Closures, not attributes: only weights and tokenizers are trackable
    # state; the task and theta's structure are used while tracing.
    self._decode_fn = lambda weights, ids, paddings: task.Decode(
        structure.Pack(weights), ids, paddings, **kwargs)
    self.source_tokenizer = tf_text.SentencepieceTokenizer(model=source_model)
    self.target_tokenizer = tf_text.SentencepieceTokenizer(model=target_model)
    self._max_len = int(max_source_length)
    self._source_tag = bool(source_tag)
    self._batch = int(batch_size)

  def Encode(self, source, language):
    """ids [B, T] int32 and paddings [B, T] float32 of raw source strings."""
    tokens = self.source_tokenizer.tokenize(source)
    keep = self._max_len - 1 - int(self._source_tag)
    tokens = tokens[:, :keep]
    eos = tf.fill([tf.shape(source)[0], 1], tf.constant(EOS_ID, tokens.dtype))
    parts = [tokens, eos]
    if self._source_tag:
      tag = self.source_tokenizer.string_to_id(
          tf.strings.join(['<2', language, '>']))
      parts.insert(0, tf.cast(tag, tokens.dtype)[:, None])
    tokens = tf.concat(parts, axis=1)
    ids = tf.cast(tokens.to_tensor(default_value=PAD_ID), tf.int32)
    mask = tf.sequence_mask(tokens.row_lengths(), tf.shape(ids)[1])
    return ids, 1.0 - tf.cast(mask, tf.float32)

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name='source'),
      tf.TensorSpec([None], tf.string, name='language')])
  def translate(self, source, language):
    """Raw source strings (+ language codes) -> English strings."""
    n = tf.shape(source)[0]
    b = self._batch
    chunks = (n + b - 1) // b
    fill = tf.fill([chunks * b - n], '')
    ids, paddings = self.Encode(tf.concat([source, fill], 0),
                                tf.concat([language, fill], 0))
    ids_cbt = tf.reshape(ids, [chunks, b, -1])
    paddings_cbt = tf.reshape(paddings, [chunks, b, -1])
    weights = [w.read_value() for w in self.weights]

    def DecodeChunk(args):
      out_ids, lengths = _BestBeam(self._decode_fn(weights, *args))
      return tf.cast(out_ids, tf.int32), tf.cast(lengths, tf.int32)

    out_ids, lengths = tf.map_fn(
        DecodeChunk, (ids_cbt, paddings_cbt), fn_output_signature=(
            tf.TensorSpec([b, None], tf.int32), tf.TensorSpec([b], tf.int32)))
    out_ids = tf.reshape(out_ids, [chunks * b, -1])[:n]
    lengths = tf.reshape(lengths, [-1])[:n]
    positions = tf.range(tf.shape(out_ids)[1])[None, :]
    before_eos = tf.equal(
        tf.cumsum(tf.cast(tf.equal(out_ids, EOS_ID), tf.int32), axis=1), 0)
    keep = (before_eos & (positions < lengths[:, None]) &
            tf.not_equal(out_ids, PAD_ID) & tf.not_equal(out_ids, BOS_ID))
    # Ids past the SentencePiece vocabulary (a padded softmax) read as <unk>.
    out_ids = tf.where(out_ids < self.target_tokenizer.vocab_size(), out_ids,
                       self.target_tokenizer.string_to_id('<unk>'))
    pieces = tf.ragged.boolean_mask(out_ids, keep)
    return {'translation': self.target_tokenizer.detokenize(pieces)}


def Export(task, theta, source_model_file, target_model_file, export_dir,
           **kwargs):
  """Writes the SavedModel to `export_dir`.

  Locally it is written to a temporary sibling and renamed, so a crash never
  leaves a half-written export at `export_dir` (object stores such as GCS
  have no directory rename: there it is written in place).
  """
  def Read(path):
    with tf.io.gfile.GFile(path, 'rb') as f:
      return f.read()

  module = Translator(task, theta, Read(source_model_file),
                      Read(target_model_file), **kwargs)
  if '://' in export_dir:
    tf.saved_model.save(module, export_dir, signatures={
        'translate': module.translate.get_concrete_function()})
    return export_dir
  tmp = export_dir.rstrip('/') + '.tmp'
  if tf.io.gfile.exists(tmp):
    tf.io.gfile.rmtree(tmp)
  tf.saved_model.save(module, tmp, signatures={
      'translate': module.translate.get_concrete_function()})
  if tf.io.gfile.exists(export_dir):
    tf.io.gfile.rmtree(export_dir)
  tf.io.gfile.rename(tmp, export_dir)
  return export_dir


def DefaultExportDir(logdir, step):
  return os.path.join(logdir, 'export', f'{step:08d}')
