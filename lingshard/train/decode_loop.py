"""Decoding machinery: runs a task's decoder over a dataset.

A decoder (`BaseDecoder`, made by the task's `CreateDecoder`, e.g.
`lingshard.models.mt_decoder.MtDecoder`) turns one batch into per-example
records (Lingvo's `Decode` + `PostProcessDecodeOut`) and, at the end,
scores and writes all of them (Lingvo's decoder metrics +
`DecodeFinalize`). This module only iterates the dataset.
"""


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


def DecodeDataset(decoder, theta, dataset, num_batches=0):
  """The records of every batch of `dataset` (or the first `num_batches`)."""
  if num_batches:
    dataset = dataset.take(num_batches)
  records = []
  for batch in dataset:
    records.extend(decoder.DecodeBatch(theta, batch))
  return records
