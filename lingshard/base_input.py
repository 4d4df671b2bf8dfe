"""The input-generator base class and the error of an input pipeline.

`BaseInputGenerator` is what the trainer knows about any input: its
params, `GetDataset()`, the name of the split it reads (`SplitName`), its
vocabulary files (`VocabFiles`) and its per-language example counts
(`LanguageCounts`). Subclasses (`lingshard.data.inputs.MtInput`,
`lingshard.models.regression_model.RegressionInput`) override what they
have.

Input generators raise `InputError` (or a subclass such as
`lingshard.data.corpus_io.CorpusError`) when data is read, never when
params are built; the trainer and the tools catch it and print its one-line
message.
"""

import numpy as np
import tensorflow as tf

from lingshard import hyperparams
from lingshard import input_error
from lingshard.nested_map import NestedMap

InputError = input_error.InputError


class BaseInputGenerator:
  """An input generator: `Params()`, `params`, `GetDataset()` and the
  descriptions below (defaults for inputs without splits, vocabularies or
  languages)."""

  @classmethod
  def Params(cls):
    return hyperparams.InstantiableParams(cls)

  def __init__(self, params):
    self.params = params.Copy()

  @classmethod
  def ParamsForHost(cls, params, num_hosts, host_index):
    """Params of host `host_index`'s input pipeline of `num_hosts`: its
    own share of the examples, batches of global batch / num_hosts.
    The trainer calls it with its `tf.distribute.InputContext`, so no two
    hosts of a multi-host job read the same examples. Here: one host only;
    inputs that shard override it."""
    if num_hosts != 1:
      raise InputError(f'{cls.__name__} cannot shard its examples over '
                       f'{num_hosts} hosts (it defines no ParamsForHost)')
    del host_index
    return params.Copy()

  def GetDataset(self):
    """A tf.data.Dataset of NestedMap batches."""
    raise NotImplementedError(f'{type(self).__name__}.GetDataset')

  def BatchSpec(self, bucket=-1):
    """NestedMap of tf.TensorSpec: the numeric batch (no string leaves) of
    training bucket `bucket`, from the params alone (reads no data), e.g.
    to compile a step before any data exists (spmd compile_only)."""
    raise InputError(f'{type(self).__name__} defines no BatchSpec: it '
                     'cannot describe its batches without reading data')

  def SplitName(self, dataset):
    """The name of the split read, for output directory names: here
    `dataset` ('Train' | 'Dev' | 'Test') in lower case."""
    return dataset.lower()

  def VocabFiles(self):
    """(source, target) vocabulary model files, or None without any."""
    return None

  def LanguageCounts(self):
    """{language: examples} of the whole input, or None without languages."""
    return None


def ShardBatchLimits(params, num_hosts, host_index):
  """Copy of bucketed input params (`bucket_batch_limits` global, and
  `num_hosts`, `host_index`) for one host: every limit divided by
  num_hosts, which must divide it."""
  for limit in params.bucket_batch_limits:
    if limit % num_hosts:
      raise InputError(f'bucket_batch_limits={list(params.bucket_batch_limits)}'
                       f' (the global batch) must be divisible by the '
                       f'{num_hosts} input hosts')
  return params.Copy().Set(
      num_hosts=num_hosts, host_index=host_index,
      bucket_batch_limits=[b // num_hosts for b in params.bucket_batch_limits])


def NumericBatch(batch):
  """`batch` (a NestedMap) without its string leaves (e.g. MtInput's
  `lang`, `src.strs`): compiled steps and XLA programs take numbers only,
  and losses never read strings. Leaves may be tensors or numpy arrays;
  every path that feeds a batch to a compiled step filters it here once."""

  def IsString(x):
    if isinstance(x, tf.Tensor):
      return x.dtype == tf.string
    return isinstance(x, (str, bytes)) or (
        isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in 'OSU')

  def Keep(x):
    if isinstance(x, dict):
      return NestedMap({k: Keep(v) for k, v in x.items()
                        if not IsString(v)})
    if isinstance(x, (list, tuple)):
      return type(x)(Keep(v) for v in x if not IsString(v))
    return x

  return Keep(batch if isinstance(batch, NestedMap) else NestedMap(batch))
