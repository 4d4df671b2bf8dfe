"""MoE layers' answers to BaseLayer's training hooks (base_layer.py).

The pipeline, the config check and the warm start ask every layer these
questions; an MoE layer (`MoEBase`) answers with the rules below, so none
of those callers imports `layers/moe/`.
"""


def ForPipeline(p, owner):
  """MoE params `p` fit for a GPipe body of the stack `owner`: groups by
  size (a micro-batch's groups are then the unpipelined model's,
  pipeline_run.MicroBatchRows), no expert dropout, the einsum dispatch (an explicit 'gather' is
  refused)."""
  if p.group_size is None:
    raise ValueError(f'{owner}: a pipelined MoE stack needs '
                     'moe_tpl.group_size (tokens per group); num_groups '
                     f'{p.num_groups} would count a micro-batch\'s groups')
  if p.dropout_rate:
    raise ValueError(f'{owner}: a pipelined MoE stack needs '
                     f'moe_tpl.dropout_rate 0, got {p.dropout_rate} '
                     '(expert dropout is keyed by buffer slot, not by '
                     'token)')
  if p.dispatch_impl == 'gather':
    raise ValueError(f"{owner}: a pipelined MoE stack needs "
                     "moe_tpl.dispatch_impl 'einsum' or 'auto', got 'gather' "
                     '(its manual partitioning cannot be vectorised over '
                     'stages)')
  return p.Copy().Set(dispatch_impl='einsum')  # 'auto' in a pipeline.


def CheckMesh(layer, axis_size):
  """Groups and experts split over mesh axes whose sizes divide them."""
  p = layer.params
  if p.device_mesh is None:
    return
  gsm = p.activation_split_dims_mapping.gsm
  if p.num_groups is not None and gsm and gsm[0] not in (None, -1):
    n, label = axis_size(gsm[0])
    if p.num_groups % n:
      raise ValueError(
          f'{layer.path}: num_groups={p.num_groups} must be a multiple of '
          f'{label} (groups are split over it)')
  wi = p.weight_split_dims_mapping.wi
  if wi and wi[0] not in (None, -1):
    n, label = axis_size(wi[0])
    if p.num_experts % n:
      raise ValueError(
          f'{layer.path}: num_experts={p.num_experts} must be divisible by '
          f'{label} (experts are split over it)')


def CheckTokens(layer, tokens, where):
  """One MoE layer vs the `tokens` of a replica's (micro-)batch."""
  p = layer.params
  if p.num_groups is not None and tokens % p.num_groups:
    raise ValueError(
        f'{layer.path}: num_groups={p.num_groups} must divide the {tokens} '
        f'tokens of {where} (GShard §2.2: G equal groups)')
  if p.group_size is not None and tokens % p.group_size:
    raise ValueError(
        f'{layer.path}: group_size={p.group_size} must divide the {tokens} '
        f'tokens of {where}')
