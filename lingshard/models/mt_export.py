"""The translation export module: a SavedModel whose `translate`
signature maps raw strings to English strings, SentencePiece included in
the graph (tensorflow_text). `TransformerMTModel.CreateExportModule`
builds it; lingshard/train/export.py writes it.

  translate(source: string [B], language: string [B]) -> {'translation': [B]}

Inside: invalid UTF-8 in a source is replaced by U+FFFD (as Python's
`errors='replace'`); source SentencePiece -> ids (+ EOS, and a `<2xx>` tag
first for the en -> xx direction, as lingshard/data/inputs.py does),
padded to the static [B, max_source_length] with paddings (MoE layers need
static shapes); `task.Decode(theta, ids, paddings)` (see mt_decoder for
that seam) on chunks of a static batch size (MT decoding needs a static
batch), via tf.map_fn; the best beam is cut at EOS / its length and
detokenized with the target model. A source with no pieces (empty or
blank) translates to ''; an empty batch gives an empty batch; source and
language of different lengths raise InvalidArgumentError, whose message
has the line `assertion failed: [translate: source has 3 strings and
language 2; pass one language per source]` (MISMATCH). The
model protos and the weights are stored in the SavedModel, so a fresh
process needs only

  import tensorflow as tf, tensorflow_text  # registers SentencePiece ops
  tf.saved_model.load(path).translate(source=..., language=...)
"""

import tensorflow as tf
import tensorflow_text as tf_text

from lingshard import sharding
from lingshard.data import vocab
from lingshard.train import export

EOS_ID, PAD_ID, BOS_ID = vocab.EOS_ID, vocab.PAD_ID, vocab.BOS_ID
MISMATCH = ('translate: source has {} strings and language {}; pass one '
            'language per source')


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
    max_source_length: source tokens kept, EOS included; every Decode call
      sees sources padded to this static length.
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
    """ids [B, T] int32, paddings [B, T] float32 (T = max_source_length)
    and the number of source pieces [B] of raw source strings."""
    tokens = self.source_tokenizer.tokenize(source)
    keep = self._max_len - 1 - int(self._source_tag)
    tokens = tokens[:, :keep]
    num_pieces = tokens.row_lengths()
    eos = tf.fill([tf.shape(source)[0], 1], tf.constant(EOS_ID, tokens.dtype))
    parts = [tokens, eos]
    if self._source_tag:
      tag = self.source_tokenizer.string_to_id(
          tf.strings.join(['<2', language, '>']))
      parts.insert(0, tf.cast(tag, tokens.dtype)[:, None])
    tokens = tf.concat(parts, axis=1)
    ids = tf.cast(tokens.to_tensor(default_value=PAD_ID,
                                   shape=[None, self._max_len]), tf.int32)
    mask = tf.sequence_mask(tokens.row_lengths(), self._max_len)
    return ids, 1.0 - tf.cast(mask, tf.float32), num_pieces

  # Served op by op (a SavedModel signature): traced without sharding ops.
  @sharding.Function(xla_compiled=False, input_signature=[
      tf.TensorSpec([None], tf.string, name='source'),
      tf.TensorSpec([None], tf.string, name='language')])
  def translate(self, source, language):
    """Raw source strings (+ language codes) -> English strings."""
    n = tf.size(source)
    check = tf.debugging.Assert(tf.equal(n, tf.size(language)), [
        tf.strings.format(MISMATCH, (n, tf.size(language)))])
    with tf.control_dependencies([check]):
      source = tf.strings.unicode_transcode(
          source, 'UTF-8', 'UTF-8', errors='replace', replacement_char=0xFFFD)
    b = self._batch
    chunks = tf.maximum((n + b - 1) // b, 1)  # >= 1: reshapes of [0, ?] fail.
    fill = tf.fill([chunks * b - n], '')
    ids, paddings, num_pieces = self.Encode(tf.concat([source, fill], 0),
                                            tf.concat([language, fill], 0))
    ids_cbt = tf.reshape(ids, [chunks, b, self._max_len])
    paddings_cbt = tf.reshape(paddings, [chunks, b, self._max_len])
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
    text = self.target_tokenizer.detokenize(pieces)
    return {'translation': tf.where(num_pieces[:n] > 0, text, '')}

  def Signatures(self):
    """{'translate': the concrete function}: the SavedModel's signatures."""
    return {'translate': self.translate.get_concrete_function()}


def _ReadBytes(path):
  with tf.io.gfile.GFile(path, 'rb') as f:
    return f.read()


def NewTranslator(task, theta, source_model_file, target_model_file,
                  **kwargs):
  """A Translator reading the SentencePiece model files; kwargs:
  Translator's."""
  return Translator(task, theta, _ReadBytes(source_model_file),
                    _ReadBytes(target_model_file), **kwargs)


def TranslatorForInput(task, theta, input_generator):
  """The Translator of `task` for an MtInput: its vocabulary files, its
  largest bucket as max_source_length and the `<2xx>` tag for en2xx."""
  p = input_generator.params
  source_file, target_file = input_generator.VocabFiles()
  return NewTranslator(task, theta, source_file, target_file,
                       max_source_length=p.bucket_upper_bounds[-1],
                       source_tag=p.direction == 'en2xx')


def Export(task, theta, source_model_file, target_model_file, export_dir,
           overwrite=False, logdir=None, metadata=None, **kwargs):
  """Writes the Translator of `task` with `export.Export`; returns the
  path. kwargs: Translator's."""
  module = NewTranslator(task, theta, source_model_file, target_model_file,
                         **kwargs)
  return export.Export(module, export_dir, overwrite=overwrite,
                       logdir=logdir, metadata=metadata)
