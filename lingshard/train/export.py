"""Export: a SavedModel whose `translate` signature maps raw strings to
English strings, SentencePiece included in the graph (tensorflow_text).

  translate(source: string [B], language: string [B]) -> {'translation': [B]}

Inside: invalid UTF-8 in a source is replaced by U+FFFD (as Python's
`errors='replace'`); source SentencePiece -> ids (+ EOS, and a `<2xx>` tag
first for the en -> xx direction, as lingshard/data/inputs.py does),
padded to the static [B, max_source_length] with paddings (MoE layers need
static shapes); `task.Decode(theta, ids, paddings)` (see decode_loop for
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

The export directory also holds MARKER (JSON: model, step, ...), which
identifies it as ours: `Export` replaces such a directory (or an empty or
missing one) but refuses any other non-empty directory unless
`overwrite`, and never the working, home or root directory or one that
holds the logdir. Locally the SavedModel is built in a fresh temporary
sibling (tempfile.mkdtemp) and renamed into place; a replaced directory
is first moved into another fresh sibling, deleted only once the new
export is in place.
"""

import json
import os
import shutil
import tempfile

import tensorflow as tf
import tensorflow_text as tf_text

from lingshard.data import vocab

EOS_ID, PAD_ID, BOS_ID = vocab.EOS_ID, vocab.PAD_ID, vocab.BOS_ID
MARKER = 'lingshard_export.json'
SAVED_MODEL = 'saved_model.pb'
MISMATCH = ('translate: source has {} strings and language {}; pass one '
            'language per source')


class ExportDirError(ValueError):
  """An export destination that Export refuses to replace."""


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

  @tf.function(input_signature=[
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


# ------------------------------------------------------------ destination
def IsExport(path):
  """Whether directory `path` holds an export of ours (MARKER + SavedModel)."""
  return (tf.io.gfile.exists(os.path.join(path, MARKER)) and
          tf.io.gfile.exists(os.path.join(path, SAVED_MODEL)))


def _Contains(parent, child):
  """Whether `child` is `parent` or inside it (both real, absolute)."""
  return os.path.commonpath([parent, child]) == parent


def _CheckProtected(flag_value, path, logdir):
  """ExportDirError if replacing `path` would delete a directory we must
  keep: root, the working or home directory, the logdir, or an ancestor."""
  real = os.path.realpath(path)
  kept = [('the root directory', os.path.realpath(os.sep)),
          ('the working directory', os.path.realpath(os.getcwd())),
          ('the home directory', os.path.realpath(os.path.expanduser('~')))]
  if logdir and '://' not in logdir:
    kept.append(('the logdir', os.path.realpath(logdir)))
  for what, kept_path in kept:
    if real == kept_path:
      raise ExportDirError(f'--export_dir {flag_value} would delete {what}; '
                           'pass a new or empty directory')
  for what, kept_path in kept[1:]:
    if _Contains(real, kept_path):
      raise ExportDirError(f'--export_dir {flag_value} would delete {what} '
                           f'{kept_path} inside it; pass a new or empty '
                           'directory')


def _CheckReplaceable(flag_value, path, overwrite):
  """ExportDirError unless `path` is missing, empty, ours or `overwrite`."""
  if not tf.io.gfile.exists(path):
    return
  if not tf.io.gfile.isdir(path):
    raise ExportDirError(f'--export_dir {flag_value} is a file; pass a '
                         'directory path')
  if overwrite or not tf.io.gfile.listdir(path) or IsExport(path):
    return
  raise ExportDirError(f'--export_dir {flag_value} is not empty and is not '
                       'a lingshard export; pass --export_overwrite to '
                       'replace it')


def CheckExportDir(export_dir, overwrite=False, logdir=None):
  """The path Export would write (`~` expanded locally); ExportDirError if
  Export must refuse it (see Export's args)."""
  if '://' in export_dir:
    _CheckReplaceable(export_dir, export_dir, overwrite)
    return export_dir
  path = os.path.expanduser(export_dir)
  _CheckProtected(export_dir, path, logdir)
  _CheckReplaceable(export_dir, path, overwrite)
  return path


def _Save(module, directory, metadata):
  tf.saved_model.save(module, directory, signatures={
      'translate': module.translate.get_concrete_function()})
  with tf.io.gfile.GFile(os.path.join(directory, MARKER), 'w') as f:
    f.write(json.dumps(dict(metadata or {}), sort_keys=True) + '\n')


def _SaveLocal(module, export_dir, metadata):
  """Builds in a fresh sibling, then renames it into place (see module doc).

  Only directories made here by tempfile.mkdtemp are deleted: the build
  directory if saving fails, and the one the replaced `export_dir` was
  moved into, once the new export is in place.
  """
  parent, name = os.path.split(os.path.abspath(export_dir))
  os.makedirs(parent, exist_ok=True)
  build = tempfile.mkdtemp(dir=parent, prefix=f'.{name}.export-')
  try:
    _Save(module, build, metadata)
  except BaseException:
    shutil.rmtree(build, ignore_errors=True)  # Made by mkdtemp above.
    raise
  os.chmod(build, 0o755)  # mkdtemp makes it 0o700.
  if not os.path.lexists(export_dir):
    os.rename(build, export_dir)
    return
  aside = tempfile.mkdtemp(dir=parent, prefix=f'.{name}.replaced-')
  os.rename(export_dir, os.path.join(aside, name))
  try:
    os.rename(build, export_dir)
  except BaseException:
    os.rename(os.path.join(aside, name), export_dir)
    os.rmdir(aside)
    shutil.rmtree(build, ignore_errors=True)  # Made by mkdtemp above.
    raise
  shutil.rmtree(aside)  # Made by mkdtemp above; holds the replaced copy.


def Export(task, theta, source_model_file, target_model_file, export_dir,
           overwrite=False, logdir=None, metadata=None, **kwargs):
  """Writes the SavedModel and MARKER to `export_dir`; returns its path.

  Args:
    task, theta: see Translator.
    source_model_file / target_model_file: SentencePiece model files.
    export_dir: destination; `~` is expanded. Missing, empty or a previous
      export (IsExport): replaced; any other directory: ExportDirError
      unless `overwrite`. Never the root, working or home directory, the
      logdir or a directory containing one of them.
    overwrite: replace a non-empty directory that is not an export.
    logdir: the run's logdir (kept, see above).
    metadata: JSON-able dict written to MARKER (e.g. model, step).
    **kwargs: Translator's.

  Locally the export is built in a temporary sibling and renamed, so a
  crash never leaves a half-written export at `export_dir`; object stores
  such as GCS have no directory rename: there it is written in place.
  """
  export_dir = CheckExportDir(export_dir, overwrite, logdir)

  def Read(path):
    with tf.io.gfile.GFile(path, 'rb') as f:
      return f.read()

  module = Translator(task, theta, Read(source_model_file),
                      Read(target_model_file), **kwargs)
  if '://' in export_dir:
    _Save(module, export_dir, metadata)
  else:
    _SaveLocal(module, export_dir, metadata)
  return export_dir


def DefaultExportDir(logdir, step):
  return os.path.join(logdir, 'export', f'{step:08d}')
