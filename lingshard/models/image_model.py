"""Image classification: a ResNet-style convnet whose body may be a GPipe
pipeline (Huang et al. 2019 §4.1 trains its image models this way).

    stem   [ConvBnLayer(3x3) + 2x2 max pool per stem_pre_channels],
           ConvBnLayer(3x3, -> C) [+ 2x2 max pool]       outside the pipeline
    body   L resnet.ResidualBlock(C)  [B, H, W, C] -> same shape
           (pipeline_tpl: a PipelinedLayer of K stages, M micro-batches)
    head   global average pool, linear C -> classes       outside

Batch norm uses the statistics of what it sees: the whole batch in the
stem, one micro-batch in a pipelined body (GPipe §2.2); the moving averages
eval/decode/export use are updated by the training step from the whole
mini-batch (layers/batch_norm.py).

Sharding (a task `device_mesh`, e.g. data x stage [2, 2]): every
activation's batch dim is split over the task's `batch_axes` (mesh axis 0
by default): the stem and the head are data-parallel, every weight outside
the pipeline replicated; a pipelined body's stacked weights [K, S, ...]
are split over the stage axis (`pipeline_tpl.stage_mesh_axis`, None = the
mesh's last axis; a 1-D mesh [K] is read as [1, K]: stages only), its
micro-batches over the data axis (`batch_mesh_axis`, None = batch_axes),
activations pass between stages as collective-permutes. On a mesh the
body's convolutions are Conv2DLayer impl 'patches' (layers/conv.py: the
same sum, vectorised over the stacked stage filters).
`tools/spmd_check --model=gpipe.MnistResNetPipelined --mesh=2,2` proves it.

Batch norm under data parallelism (`bn_statistics`): 'per_replica' (the
default) normalises each data replica's shard of the batch (stem) or of
the micro-batch (body) by its own statistics (GPipe §2.2: per
micro-batch; per replica as a TPU replica's batch norm by default; §2.2's
"and over replicas if necessary" is 'cross_replica'): every
BatchNormLayer gets num_groups = the data
shards, the blocks being the shards (micro-batches are blocked per shard,
layers/pipeline_run.py). The grouping is in the math, so the model
computes the same on one device as on the mesh (and the SPMD checker's
single-device reference is the same math). 'cross_replica': statistics
of the whole (micro-)batch, all-reduced over the data axis. Without a
mesh both are the whole (micro-)batch's.

Batches (`image_input`): `image` [B, H, W, Cin] float32, `label` [B] int32.
Metrics: `loss` (label-smoothed cross-entropy), `log_pplx` (the plain
cross-entropy), `accuracy` (top-1) and `acc5` (top-5), weighted by examples.
"""

import tensorflow as tf

from lingshard import sharding
from lingshard.layers import linear
from lingshard.layers import pooling
from lingshard.layers import resnet
from lingshard.layers import softmax
from lingshard.models import base_model
from lingshard.nested_map import NestedMap


BN_STATISTICS = ('per_replica', 'cross_replica')


class ImageClassifier(base_model.BaseTask):
  """ResNet-style image classifier (module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('image_shape', (28, 28, 1), '(H, W, Cin) of the images.')
    p.Define('num_classes', 10, 'Classes.')
    p.Define('channels', 16, 'C: the stem\'s and the body\'s channels.')
    p.Define('stem_pool', True, 'A 2x2 max pool (stride 2) after the stem.')
    p.Define('stem_pre_channels', [], 'Widths of conv-BN-relu layers, each '
             'followed by a 2x2 max pool, before the stem (H and W halve).')
    p.Define('num_blocks', 2, 'L: residual blocks in the body.')
    p.Define('bn_decay', 0.99, 'Every BatchNormLayer.decay.')
    p.Define('bn_statistics', 'per_replica', 'Training batch norm under '
             'data parallelism: per_replica (each data shard\'s own '
             'statistics) or cross_replica (the whole batch\'s); module '
             'docstring.')
    p.Define('label_smoothing', 0.0, 'eps of the training loss.')
    p.Define('pipeline_tpl', None, 'None: the body is a plain stack; else '
             'pipeline.PipelinedLayer params (K, M, remat; body_tpl and '
             'num_layers are set here).')
    return p

  def __init__(self, params):
    super().__init__(base_model.StageMesh(params))
    p = self.params
    self.CheckPositive('num_classes', 'channels', 'num_blocks')
    self.CheckOneOf('bn_statistics', BN_STATISTICS)
    groups = (sharding.AxisSize(p.device_mesh, p.batch_axes,
                                p.mesh_axis_names)
              if p.bn_statistics == 'per_replica' else 1)
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'{p.name}: label_smoothing must be in [0, 1), got '
                       f'{p.label_smoothing!r}')
    cin = p.image_shape[2]
    pre = []
    for width in p.stem_pre_channels:
      pre.append(resnet.ConvBnLayer.Params().Set(
          filter_shape=(3, 3, cin, width), bn_decay=p.bn_decay,
          bn_groups=groups))
      cin = width
    if pre:
      self.CreateChildren('stem_pre', pre)
    if pre or p.stem_pool:
      self.CreateChild('pool', pooling.PoolingLayer.Params().Set(
          window_shape=(2, 2), window_stride=(2, 2)))
    self.CreateChild('stem', resnet.ConvBnLayer.Params().Set(
        filter_shape=(3, 3, cin, p.channels), bn_decay=p.bn_decay,
        bn_groups=groups))
    block = resnet.ResidualBlock.Params().Set(
        channels=p.channels, bn_decay=p.bn_decay, bn_groups=groups)
    if p.pipeline_tpl is None:
      self.CreateChildren('body', [block.Copy() for _ in
                                   range(p.num_blocks)])
    else:
      pp = p.pipeline_tpl.Copy().Set(num_layers=p.num_blocks)
      if p.device_mesh is not None:
        # tf.nn.conv2d does not vectorise over the stacked stage filters
        # (layers/conv.py impl); on a mesh that would gather them.
        block.conv_impl = 'patches'
      self.CreateChild('body', base_model.PipelineAxes(
          pp.Set(body_tpl=block), p, p.batch_axes))
    self.CreateChild('gap', pooling.GlobalAvgPoolLayer.Params())
    self.CreateChild('logits', linear.LinearLayer.Params().Set(
        input_dim=p.channels, output_dim=p.num_classes))

  def Body(self, theta, x, step=None):
    """The body on [B, H, W, C] (plain or pipelined) -> [B, H, W, C]."""
    if self.params.pipeline_tpl is None:
      for block, block_theta in zip(self.body, theta.body):
        x, _ = block.FProp(block_theta, x)
      return x
    paddings = tf.zeros([x.shape[0]], x.dtype)
    x, _ = self.body.FProp(theta.body, x, paddings, step=step)
    return x

  def ComputePredictions(self, theta, input_batch, step=None, **kwargs):
    """NestedMap(logits [B, classes] float32)."""
    del kwargs  # No routing: examples need no global offsets.
    x = input_batch.image
    for layer, layer_theta in zip(self.children.get('stem_pre', []),
                                  theta.get('stem_pre', [])):
      x = self.pool.FProp(None, layer.FProp(layer_theta, x))
    x = self.stem.FProp(theta.stem, x)
    if self.params.stem_pool:
      x = self.pool.FProp(None, x)
    x = self.Body(theta, x, step=step)
    logits = self.logits.FProp(theta.logits, self.gap.FProp(None, x))
    return NestedMap(logits=tf.cast(logits, tf.float32))

  def ComputeLoss(self, theta, predictions, input_batch):
    """(metrics, per_example NestedMap(xent [B]): the eval loop's loss)."""
    logits = predictions.logits
    labels = tf.cast(input_batch.label, tf.int32)
    ones = tf.ones_like(labels, tf.float32)
    xent = softmax.LabelSmoothedXent(
        logits[:, tf.newaxis], labels[:, tf.newaxis], ones[:, tf.newaxis],
        self.params.label_smoothing)
    n = tf.reduce_sum(ones)
    top1 = tf.cast(tf.math.in_top_k(labels, logits, 1), tf.float32)
    k5 = min(5, self.params.num_classes)
    top5 = tf.cast(tf.math.in_top_k(labels, logits, k5), tf.float32)
    metrics = NestedMap(
        loss=(tf.reduce_mean(xent.xent), n),
        log_pplx=(tf.reduce_mean(xent.nll), n),
        accuracy=(tf.reduce_mean(top1), n), acc5=(tf.reduce_mean(top5), n))
    return metrics, NestedMap(xent=xent.nll[:, 0])
