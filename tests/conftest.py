"""Process-wide test set-up.

XLA reads XLA_FLAGS once per process; the SPMD tests need 8 virtual host
devices, so the whole test process gets them before anything imports TF/jax.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
_FLAG = '--xla_force_host_platform_device_count=8'
if _FLAG.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' +
                             _FLAG).strip()
