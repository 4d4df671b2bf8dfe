"""AmoebaNet(L, D) image classifier (GPipe §4.1; Real et al. 2019).

    stem   3x3 conv (stride `stem_stride`, SAME, no bias) to `stem_filters`
           + BN; `num_stem_cells` reduction cells with D / 2^S, ...,
           D / 2 filters (S = num_stem_cells: the ImageNet stem)
    body   L normal cells in R + 1 groups, a reduction cell before groups
           2 .. R + 1 (before normal cell int(k L / (R + 1)), k = 1..R);
           group k's cells (and the reduction before it) have D 2^k filters
    head   relu, global average pool, linear -> classes

Each cell reads the previous and the previous-but-one cell's outputs
(layers/amoebanet.py). AmoebaNet-D(L, D) / -B(L, D) is GPipe's notation
(Table 1: "L normal cell layers and filter size D"); Real et al.'s
AmoebaNet(N, F) has N normal cells per group: with R = 2 reductions,
L = 3 N and D = F (GPipe's AmoebaNet-B(18, 512) is Real et al.'s N = 6,
F = 512). Shapes are derived at build time (`CellShapes`): an image whose
H or W is odd at a reduction cell is a one-line error naming the cell.

The body is a plain list of cells, or with `pipeline_tpl` GPipe's
pipeline of them (layers/pipeline_cells.CellPipelinedLayer: K stages of
consecutive cells, M micro-batches, remat; stages balanced by the cells'
conv FLOPs unless `stage_splits`); the stem conv + BN and the head run
outside it on the whole batch. Batch norm inside the pipeline uses each
micro-batch's statistics, its moving averages the whole mini-batch's
(GPipe §2.2). The reference model's drop-path, dense dropout and auxiliary
head are not built.

Batches: `image` [B, H, W, Cin] float32, `label` [B] int32. Loss and metrics
are models/image_model.ImageClassifier's (`loss` label-smoothed
cross-entropy, `log_pplx`, `accuracy` top-1, `acc5` top-5).

Sharding (a task `device_mesh`): data parallelism, the batch dim of every
activation over the logical 'batch' axis (the task's `batch_axes`, mesh
axis 0 by default), every weight outside the pipeline replicated
(layers/amoebanet.py). A pipelined body's stacked rows [K, ...] are split
over the stage axis (`pipeline_tpl.stage_mesh_axis`, None = the mesh's
last axis; a 1-D mesh [K] is read as [1, K], base_model.StageMesh), its
micro-batches over `batch_mesh_axis` (None = batch_axes); activations pass
between stages as collective-permutes. Each stage runs its own cells'
plain tf.nn.conv2d on its own row (no stacked filters to vectorise over).
Batch norm normalises by the statistics of the whole (micro-)batch it
sees, all-reduced over the data axis when the batch is split (image_model's
'cross_replica'), so the partitioned step computes the one-device math.
"""

import math

import tensorflow as tf

from lingshard.layers import amoebanet
from lingshard.layers import batch_norm
from lingshard.layers import conv
from lingshard.layers import kinks
from lingshard.layers import linear
from lingshard.layers import pooling
from lingshard.models import base_model
from lingshard.models import image_model
from lingshard.nested_map import NestedMap


def CellPlan(p):
  """[(reduction, filters)] of every cell in order (stem cells first)."""
  d, s, r, num = p.filters, p.num_stem_cells, p.num_reduction_cells, \
      p.num_normal_cells
  plan = [(True, d // 2**(s - i)) for i in range(s)]
  where = [int(k / (r + 1) * num) for k in range(1, r + 1)]
  filters = d
  for i in range(num):
    if i in where:
      filters *= 2
      plan.append((True, filters))
    plan.append((False, filters))
  return plan


def StemShape(p):
  """(H, W, C) of the stem conv's output (SAME padding)."""
  h, w, _ = p.image_shape
  s = p.stem_stride
  return (math.ceil(h / s), math.ceil(w / s), p.stem_filters)


def CellShapes(p):
  """[(input_shape, prev_shape, output_shape)] of every cell."""
  prev, x, out = None, StemShape(p), []
  for reduction, filters in CellPlan(p):
    y = amoebanet.CellOutputShape(p.genotype, reduction, filters, x)
    out.append((x, prev, y))
    prev, x = x, y
  return out


class AmoebaNetClassifier(base_model.BaseTask):
  """AmoebaNet(L, D) classifier (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('image_shape', (224, 224, 3), '(H, W, Cin) of the images.')
    p.Define('num_classes', 1000, 'Classes.')
    p.Define('genotype', 'D', 'amoebanet.GENOTYPES key: B or D.')
    p.Define('num_normal_cells', 18, 'L: normal cells (all groups).')
    p.Define('filters', 256, 'D: the first group\'s filters.')
    p.Define('num_reduction_cells', 2, 'R: reduction cells between groups.')
    p.Define('num_stem_cells', 2, 'S: reduction cells in the stem.')
    p.Define('stem_filters', 32, 'Output channels of the stem conv.')
    p.Define('stem_stride', 2, 'Stride of the stem conv.')
    p.Define('bn_decay', 0.99, 'Every BatchNormLayer.decay.')
    p.Define('label_smoothing', 0.0, 'eps of the training loss.')
    p.Define('pipeline_tpl', None, 'None: the cells are a plain list; else '
             'pipeline_cells.CellPipelinedLayer params (num_stages, '
             'num_micro_batches, remat, stage_splits; cell_tpls and '
             'input_shape are set here).')
    return p

  def __init__(self, params):
    super().__init__(base_model.StageMesh(params))
    p = self.params
    self.CheckPositive('num_classes', 'num_normal_cells', 'filters',
                       'stem_filters', 'stem_stride')
    self.CheckOneOf('genotype', tuple(sorted(amoebanet.GENOTYPES)))
    if p.num_reduction_cells < 0 or p.num_stem_cells < 0:
      raise ValueError(f'{p.name}: num_reduction_cells and num_stem_cells '
                       f'must be >= 0, got {p.num_reduction_cells} and '
                       f'{p.num_stem_cells}')
    if p.num_reduction_cells > p.num_normal_cells - 1:
      raise ValueError(f'{p.name}: num_reduction_cells must be < '
                       f'num_normal_cells ({p.num_normal_cells}), got '
                       f'{p.num_reduction_cells}')
    if p.filters % 2**(p.num_stem_cells + 1):
      raise ValueError(f'{p.name}: filters must be a multiple of '
                       f'2^(num_stem_cells + 1) = '
                       f'{2**(p.num_stem_cells + 1)} (even stem cell '
                       f'filters), got {p.filters}')
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'{p.name}: label_smoothing must be in [0, 1), got '
                       f'{p.label_smoothing!r}')
    cin = p.image_shape[2]
    self.CreateChild('stem', conv.Conv2DLayer.Params().Set(
        filter_shape=(3, 3, cin, p.stem_filters),
        filter_stride=(p.stem_stride, p.stem_stride), has_bias=False))
    self.CreateChild('stem_bn', batch_norm.BatchNormLayer.Params().Set(
        input_dim=p.stem_filters, decay=p.bn_decay))
    cells = []
    for (reduction, filters), (x, prev, _) in zip(CellPlan(p),
                                                  CellShapes(p)):
      cells.append(amoebanet.AmoebaCell.Params().Set(
          genotype=p.genotype, reduction=reduction, filters=filters,
          input_shape=x, prev_shape=prev, bn_decay=p.bn_decay))
    if p.pipeline_tpl is None:
      self.CreateChildren('cells', cells)
    else:
      pp = p.pipeline_tpl.Copy().Set(cell_tpls=cells,
                                     input_shape=StemShape(p))
      self.CreateChild('body', base_model.PipelineAxes(pp, p, p.batch_axes))
    self.CreateChild('gap', pooling.GlobalAvgPoolLayer.Params())
    self.CreateChild('logits', linear.LinearLayer.Params().Set(
        input_dim=CellShapes(p)[-1][2][2], output_dim=p.num_classes))

  def ComputePredictions(self, theta, input_batch, step=None, **kwargs):
    """NestedMap(logits [B, classes] float32)."""
    del kwargs  # No routing: examples need no global offsets.
    x = self.stem.FProp(theta.stem, input_batch.image)
    x = self.stem_bn.FProp(theta.stem_bn, x)
    if self.params.pipeline_tpl is not None:
      x = self.body.FProp(theta.body, x, step=step)
    else:
      prev = None
      for cell, cell_theta in zip(self.cells, theta.cells):
        prev, x = x, cell.FProp(cell_theta, x, prev)
    logits = self.logits.FProp(theta.logits,
                               self.gap.FProp(None, kinks.Relu(x)))
    return NestedMap(logits=tf.cast(logits, tf.float32))

  # The image classifier's loss and metrics: it reads only the params
  # num_classes and label_smoothing, which this task defines alike.
  ComputeLoss = image_model.ImageClassifier.ComputeLoss
