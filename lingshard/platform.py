"""The one answer to "which device platform does this program run on?".

`Platform(strategy_kind)` is what the trainer's MoE dispatch and every
other platform-dependent params choice (`BaseLayer.ForPlatform`) read:
'tpu' for a TPUStrategy job; otherwise the host's GPU if it has one, else
its CPU. With no strategy (a layer built directly) a TPU host counts too.
Listing physical devices does not initialise TensorFlow's logical devices,
which a caller may still configure (e.g. virtual CPUs).
"""

import tensorflow as tf

PLATFORMS = ('cpu', 'gpu', 'tpu')


def Platform(strategy_kind=None):
  """'tpu' | 'gpu' | 'cpu' for a --strategy kind (None: this host)."""
  if strategy_kind == 'tpu':
    return 'tpu'
  kinds = ('gpu',) if strategy_kind is not None else ('tpu', 'gpu')
  for kind in kinds:
    if tf.config.list_physical_devices(kind.upper()):
      return kind
  return 'cpu'
