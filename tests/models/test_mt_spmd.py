"""TinyMoE's train step on an 8-device mesh (the SPMD checker, GShard §3.3):
same loss and gradients as one device, MoE dispatch/combine as all-to-alls."""

import pytest

from lingshard import model_registry
from lingshard.layers import base_layer
from tests.models import mt_testlib

check = pytest.importorskip('lingshard.spmd.check')


def test_tiny_moe_on_eight_devices_matches_one_device():
  params = model_registry.GetParams('m4.TinyMoE', 'Train')
  # The program a TPU job runs: 'auto' dispatch is Algorithm 2's einsums
  # (the gather dispatch's partitioning: tests/spmd/test_moe_partitioning),
  # and so is inference's with the experts split over the mesh.
  assert base_layer.ResolveParams(params, platform='tpu') == [
      'task.moe_tpl.dispatch_impl', 'task.moe_tpl.inference_dispatch_impl']
  assert params.task.moe_tpl.inference_dispatch_impl == 'einsum'
  task = params.task.Instantiate()
  assert task.params.device_mesh.shape == (8,)
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=8, src_len=8,
                                    tgt_len=8, seed=3)
  del batch['lang']  # Strings cannot enter an XLA program.
  result = check.CheckTask(task, batch, 8, step=5)
  result.AssertOk()  # Loss and every gradient match the 1-device run.
  num_moe = sum('moe' in layer.children for stack in (task.enc, task.dec)
                for layer in stack.layer)
  assert num_moe == 2
  # Per MoE layer: dispatch and combine, forward and backward.
  assert result.CollectiveCounts()['all-to-all'] == 4 * num_moe
  for c in result.CollectivesOf('all-to-all'):
    assert 'Einsum' in c.op_name, c.Describe()
