"""Decoding machinery: runs a task's decoder over a dataset.

A decoder (`BaseDecoder`, made by the task's `CreateDecoder`, e.g.
`lingshard.models.mt_decoder.MtDecoder`) turns one batch into per-example
records (Lingvo's `Decode` + `PostProcessDecodeOut`) and, at the end,
scores and writes all of them (Lingvo's decoder metrics +
`DecodeFinalize`). This module only iterates the dataset; the trainer
places the decoder under the training job's strategy and mesh first
(`Place`), and the decoder compiles its search with `Replicated()`.
"""

from lingshard.train import strategies


class BaseDecoder:
  """What the trainer's `--mode=decode` needs from a task's decoder."""

  _replicated = None

  def Place(self, replicated):
    """Runs the decoder's search under `replicated` (strategies.Replicated:
    the training job's strategy, mesh and compilation); before the first
    DecodeBatch."""
    self._replicated = replicated

  def Replicated(self):
    """Where the search runs (Place; default: one device)."""
    if self._replicated is None:
      self._replicated = strategies.Replicated()
    return self._replicated

  def DecodeBatch(self, theta, batch):
    """A list of per-example records of one batch."""
    raise NotImplementedError(f'{type(self).__name__}.DecodeBatch')

  def Finalize(self, records, out_dir, step):
    """Scores `records`, writes outputs under `out_dir`; returns
    (scores, report text)."""
    raise NotImplementedError(f'{type(self).__name__}.Finalize')


def DecodeDataset(decoder, theta, dataset, num_batches=0):
  """The records of every batch of `dataset` (or the first `num_batches`)."""
  if num_batches:
    dataset = dataset.take(num_batches)
  records = []
  for batch in dataset:
    records.extend(decoder.DecodeBatch(theta, batch))
  return records
