"""How many micro-batches a GPipe layer splits a batch into (GPipe §2.2):
the one definition, read by the pipeline's schedule, the stack's MoE group
check (transformer.py) and config_check.

A pipeline's params give either `num_micro_batches` (M) or
`micro_batch_size` (M = batch / micro_batch_size); each micro-batch is then
split over the pipeline's D data shards (`batch_mesh_axis`, whose size is
`sharding.AxisSize`), so M x D must divide the batch.
"""


def NumMicroBatches(pipeline_params, batch, data_shards=1, error=ValueError,
                    name=None):
  """M for a batch of `batch` rows; raises `error` (the caller's one-line
  error class) naming the pipeline (`name`, default its params' name) and
  the param when the batch does not split."""
  p = pipeline_params
  name = p.name if name is None else name
  if p.num_micro_batches is not None:
    if batch % p.num_micro_batches:
      raise error(f'{name}: num_micro_batches {p.num_micro_batches} does '
                  f'not divide the batch {batch}; use a divisor of {batch}')
    m = p.num_micro_batches
  else:
    if batch % p.micro_batch_size:
      raise error(f'{name}: micro_batch_size {p.micro_batch_size} does '
                  f'not divide the batch {batch}; use a divisor of {batch}')
    m = batch // p.micro_batch_size
  if (batch // m) % data_shards:
    raise error(f'{name}: micro-batches of {batch // m} examples do not '
                f'split over the {data_shards} data shards of '
                f'batch_mesh_axis {p.batch_mesh_axis}; use a batch '
                f'divisible by {m * data_shards}')
  return m
