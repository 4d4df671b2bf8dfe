"""Decoding machinery: runs a task's decoder over a dataset.

A decoder (`BaseDecoder`, made by the task's `CreateDecoder`, e.g.
`lingshard.models.mt_decoder.MtDecoder`) turns one batch into per-example
records (Lingvo's `Decode` + `PostProcessDecodeOut`) and, at the end,
scores and writes all of them (Lingvo's decoder metrics +
`DecodeFinalize`). This module iterates the dataset, and runs the shards
of the batch decode job (`DecodeShards`, below).
"""

import os
import posixpath
import re
import tempfile

import tensorflow as tf

from lingshard.train import atomic


class BaseDecoder:
  """What the trainer's `--mode=decode` needs from a task's decoder."""

  # The strategies.Replicated the decoder's search runs under (the training
  # job's strategy, mesh and compilation; None: one device).
  replicated = None

  def Place(self, replicated):
    """Runs the search under `replicated`; before the first DecodeBatch."""
    self.replicated = replicated

  def DecodeBatch(self, theta, batch):
    """A list of per-example records of one batch."""
    raise NotImplementedError(f'{type(self).__name__}.DecodeBatch')

  def Finalize(self, records, out_dir, step):
    """Scores `records`, writes outputs under `out_dir`; returns
    (scores, report text)."""
    raise NotImplementedError(f'{type(self).__name__}.Finalize')

  def HypothesisLines(self, records):
    """One text line per record, for the batch decode job's output files:
    the records' `hypothesis` field by default."""
    return [str(r.hypothesis) for r in records]


def DecodeDataset(decoder, theta, dataset, num_batches=0):
  """The records of every batch of `dataset` (or the first `num_batches`)."""
  if num_batches:
    dataset = dataset.take(num_batches)
  records = []
  for batch in dataset:
    records.extend(decoder.DecodeBatch(theta, batch))
  return records


# ------------------------------------------------------ the batch decode job
# `--mode=decode --decode_input=<glob> --decode_output=<dir>`: one output
# file per input shard, `<dir>/<shard name without .tsv>.hyp.txt`, one
# hypothesis per input row. Written whole (atomic.WriteText: a temporary
# sibling renamed into place), so an output that exists with one line per
# row is complete and a rerun skips its shard; an interrupted shard has no
# output (or, copied in by hand, a short one) and is decoded again.
OUTPUT_SUFFIX = '.hyp.txt'
_INPUT_SUFFIX = '.tsv'
# Shard names become output file names: no separators, no '..'.
_SAFE_NAME = re.compile(r'[A-Za-z0-9_@.+=-]+')


class ShardError(ValueError):
  """A bad --decode_input / --decode_output (one line)."""


def OutputName(input_path):
  """`part-0.hyp.txt` for .../part-0.tsv (other names keep their suffix)."""
  name = posixpath.basename(input_path.replace(os.sep, '/'))
  if name.endswith(_INPUT_SUFFIX) and len(name) > len(_INPUT_SUFFIX):
    name = name[:-len(_INPUT_SUFFIX)]
  return name + OUTPUT_SUFFIX


def ShardOutputs(inputs, out_dir):
  """[(input, output)] of every input shard: the output path is `out_dir`
  (the directory the user named) joined with `OutputName(input)` alone.

  Raises:
    ShardError: a shard name that could leave `out_dir` or is not plain
      (letters, digits, `_@.+=-`, no '..'), or two shards of one output.
  """
  pairs, seen = [], {}
  for path in inputs:
    name = OutputName(path)
    if not _SAFE_NAME.fullmatch(name) or '..' in name:
      raise ShardError(f'--decode_input: shard {path!r} cannot name an output '
                       "file: use letters, digits, '_@.+=-' and no '..'")
    if name in seen:
      raise ShardError(f'--decode_input: shards {seen[name]} and {path} would '
                       f'both write {name}; give the shards distinct names')
    seen[name] = path
    pairs.append((path, _Join(out_dir, name)))
  return pairs


def _Join(directory, name):
  if atomic.IsRemote(directory):
    return directory.rstrip('/') + '/' + name
  return os.path.join(directory, name)


def OutputDir(path):
  """The --decode_output directory `path`, `..` and links resolved
  (locally): outputs are named from it alone."""
  return path if atomic.IsRemote(path) else os.path.realpath(path)


def MakeOutputDir(path, out):
  """Creates `out` (OutputDir of the user's `path`); ShardError (one line)
  unless a file can be made there."""
  try:
    if atomic.IsRemote(out):
      tf.io.gfile.makedirs(out)
    else:  # Root passes os.access: try a write.
      os.makedirs(out, exist_ok=True)
      fd, probe = tempfile.mkstemp(dir=out, prefix='.decode-probe-')
      os.close(fd)
      os.remove(probe)  # Made by mkstemp above.
  except atomic.ERRORS as e:
    raise ShardError(f'--decode_output {path}: cannot write there: '
                     f'{atomic.Reason(e)}; choose another --decode_output'
                     ) from None


def WorkerShards(pairs, worker, num_workers):
  """Worker `worker` of `num_workers`' share of `pairs`: every
  num_workers-th from `worker` on (each shard decoded by one worker)."""
  if not 0 <= worker < num_workers:
    raise ShardError(f'worker {worker} is not in [0, {num_workers})')
  return list(pairs[worker::num_workers])


def IsComplete(path, num_rows):
  """True if `path` exists and holds exactly `num_rows` lines, each ended
  by a newline (what DecodeShards writes for a shard of that many rows)."""
  if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
    return False
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  return data.count(b'\n') == num_rows and (not data or data.endswith(b'\n'))


def DecodeShards(pairs, rows, decode, printer=print):
  """Decodes each (input, output) of `pairs` whose output is not complete.

  Args:
    pairs: this worker's (input shard, output path) list (ShardOutputs,
      WorkerShards).
    rows: the row count of each input (read and checked by the caller
      before anything is written).
    decode: input path -> its hypotheses, one str per row, in row order.
    printer: receives one line per shard.

  Returns:
    (decoded, skipped): the input paths of each.

  Raises:
    ShardError: an output cannot be written (the file system's reason);
      the previous file, if any, is kept.
  """
  decoded, skipped = [], []
  for (path, out), n in zip(pairs, rows):
    if IsComplete(out, n):
      skipped.append(path)
      printer(f'skipped {path}: {out} is complete ({n} lines)')
      continue
    hyps = decode(path)
    if len(hyps) != n:
      raise ShardError(f'{path}: decoded {len(hyps)} of its {n} rows')
    try:
      atomic.WriteText(out, ''.join(
          h.replace('\r', ' ').replace('\n', ' ') + '\n' for h in hyps))
    except atomic.ERRORS as e:
      raise ShardError(f'--decode_output: cannot write {out}: '
                       f'{atomic.Reason(e)}; the outputs written before it '
                       'are complete: free space and rerun') from None
    decoded.append(path)
    printer(f'decoded {path} -> {out} ({n} lines)')
  return decoded, skipped
