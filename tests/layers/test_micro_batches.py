"""layers/micro_batches.NumMicroBatches: the one micro-batch count (GPipe
§2.2) and its one-line errors, named as the caller asks."""

import pytest

from lingshard.layers import micro_batches
from lingshard.layers import pipeline


def _Params(**kw):
  return pipeline.PipelinedLayer.Params().Set(name='pipe', **kw)


def test_count_from_either_param():
  assert micro_batches.NumMicroBatches(_Params(num_micro_batches=4), 16) == 4
  assert micro_batches.NumMicroBatches(_Params(micro_batch_size=2), 16) == 8
  assert micro_batches.NumMicroBatches(_Params(num_micro_batches=4), 16,
                                       data_shards=4) == 4


@pytest.mark.parametrize('kw,batch,shards,message', [
    (dict(num_micro_batches=3), 16, 1,
     'pipe: num_micro_batches 3 does not divide the batch 16; use a divisor '
     'of 16'),
    (dict(micro_batch_size=5), 16, 1,
     'pipe: micro_batch_size 5 does not divide the batch 16; use a divisor '
     'of 16'),
    (dict(num_micro_batches=4, batch_mesh_axis='data'), 16, 8,
     'pipe: micro-batches of 4 examples do not split over the 8 data shards '
     'of batch_mesh_axis data; use a batch divisible by 32'),
])
def test_one_line_errors(kw, batch, shards, message):
  with pytest.raises(pipeline.PipelineError) as e:
    micro_batches.NumMicroBatches(_Params(**kw), batch, shards,
                                  error=pipeline.PipelineError)
  assert str(e.value) == message
  with pytest.raises(ValueError) as e:
    micro_batches.NumMicroBatches(_Params(**kw), batch, shards,
                                  name='model/dec/pipeline')
  assert str(e.value) == message.replace('pipe:', 'model/dec/pipeline:')
