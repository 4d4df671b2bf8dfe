"""GShard's MoE layer on 8 devices, experts split 8 ways (§3.1, §3.2, Alg. 2):
the partitioned train step matches the single-device run, the G->E re-split
is an all-to-all, and expert weights are never gathered."""

import re

import numpy as np
import pytest

from lingshard.layers.moe import top2
from lingshard.spmd import check
from lingshard.spmd import expect

B, T, M, H, E = 8, 4, 12, 16, 8  # G = 8 groups of S = 4 tokens.


def _Check(dispatch_impl):
  p = top2.MoELayer.Params().Set(
      name='moe', input_dim=M, hidden_dim=H, num_experts=E, num_groups=8,
      capacity_factor=2.0, dispatch_impl=dispatch_impl,
      second_expert_policy='random')
  top2.MoELayer.SetExpertSharding(p, np.arange(8))
  rng = np.random.RandomState(0)
  x = rng.normal(size=[B, T, M]).astype(np.float32)
  paddings = np.zeros([B, T], np.float32)
  paddings[1:, -1] = 1.0
  return check.CheckLayerParams(
      p, 8, [x, paddings], fprop_kwargs={'step': np.int64(3)},
      input_split_dims_mapping=[[0, -1, -1], [0, -1]],
      # A model differentiates the outputs and the aux loss, not metrics.
      grad_outputs=['out[0]', 'out[1].aux_loss'])


@pytest.fixture(scope='module', params=['einsum', 'gather'])
def result(request):
  """One partitioned check per dispatch implementation, shared by tests."""
  return _Check(request.param)


def _Arrays(shape_text):
  """'(f32[8,12], f32[])' / '2 x f32[]' -> [[8, 12], []]."""
  m = re.match(r'(\d+) x (.*)', shape_text)
  if m:
    return _Arrays(m.group(2)) * int(m.group(1))
  return [[int(d) for d in dims.split(',') if d]
          for dims in re.findall(r'\[([0-9,]*)\]', shape_text)]


def test_moe_layer_on_8_devices_matches_with_all_to_alls(result):
  r = result
  assert r.ok, r.Report()
  assert expect.Check(['has:all-to-all', 'no-all-gather:wi|wo'],
                      r.collectives) == []
  # Forward dispatch and combine, and the combine's gradient, re-split the
  # [E, G, C, M] buffers between G and E.
  assert r.CollectiveCounts()['all-to-all'] == 3, r.Report()
  for c in r.CollectivesOf('all-to-all'):
    assert c.group_size == 8
  # Expert weights and their gradients stay split on E: no device ever
  # holds another expert's weights.
  for name in ('wi', 'wo'):
    assert r.input_shardings[f'theta.layer.{name}'].startswith(
        '{devices=[8,1,1]'), r.input_shardings
    assert r.output_shardings[f'grads.layer.{name}'].startswith(
        '{devices=[8,1,1]'), r.output_shardings
  assert r.input_shardings['theta.layer.wg'] == '{replicated}'
  # All-reduces carry the gating weights' gradient [M, E] and scalars or
  # per-expert vectors (loss, aux loss, metrics) only.
  reduced = [a for c in r.CollectivesOf('all-reduce') for a in
             _Arrays(c.shape)]
  # (XLA may reduce the gradient transposed, as [E, M].)
  assert [M, E] in reduced or [E, M] in reduced, r.Report()
  assert all(sorted(a) == sorted([M, E]) or int(np.prod(a)) <= E
             for a in reduced), reduced
  # Per device: 1 of 8 experts' weights (+ replicated gating weights).
  weights_bytes = 4 * (2 * E * M * H // 8 + M * E)
  assert r.memory['argument'] < weights_bytes + 4 * 2 * B * T * M


def test_moe_layer_collectives_are_all_to_all_and_all_reduce_only(result):
  """Nothing else: no all-gather anywhere (routing gradients included)."""
  assert expect.Check(['only:all-to-all,all-reduce'],
                      result.collectives) == [], result.Report()


def test_gather_dispatch_with_groups_over_data_and_expert_axes():
  """Groups split over a tuple of mesh axes (data x expert, the pipelined
  configs' layout): the gather dispatch's manual region runs on the merged
  axis; both dispatches match the single-device run and each other."""
  outputs = {}
  for impl in ('einsum', 'gather'):
    p = top2.MoELayer.Params().Set(
        name='moe', input_dim=M, hidden_dim=H, num_experts=E, num_groups=8,
        capacity_factor=2.0, dispatch_impl=impl,
        second_expert_policy='random')
    top2.MoELayer.SetExpertSharding(
        p, np.arange(8).reshape(2, 4), mesh_axis='expert',
        mesh_axis_names=['data', 'expert'], data_mesh_axis='data')
    assert p.activation_split_dims_mapping.gsm[0] == ('data', 'expert')
    rng = np.random.RandomState(0)
    x = rng.normal(size=[B, T, M]).astype(np.float32)
    r = check.CheckLayerParams(
        p, (2, 4), [x, np.zeros([B, T], np.float32)],
        fprop_kwargs={'step': np.int64(3)},
        grad_outputs=['out[0]', 'out[1].aux_loss'])
    assert r.ok, r.Report()
    outputs[impl] = r.outputs
  assert sorted(outputs['einsum']) == sorted(outputs['gather'])
  for name, value in outputs['einsum'].items():
    np.testing.assert_allclose(outputs['gather'][name], value, rtol=1e-5,
                               atol=1e-6, err_msg=name)
