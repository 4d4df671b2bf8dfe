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

Batches (`image_input`): `image` [B, H, W, Cin] float32, `label` [B] int32.
Metrics: `loss` (label-smoothed cross-entropy), `log_pplx` (the plain
cross-entropy), `accuracy` (top-1) and `acc5` (top-5), weighted by examples.
"""

import tensorflow as tf

from lingshard.layers import linear
from lingshard.layers import pooling
from lingshard.layers import resnet
from lingshard.layers import softmax
from lingshard.models import base_model
from lingshard.nested_map import NestedMap


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
    p.Define('label_smoothing', 0.0, 'eps of the training loss.')
    p.Define('pipeline_tpl', None, 'None: the body is a plain stack; else '
             'pipeline.PipelinedLayer params (K, M, remat; body_tpl and '
             'num_layers are set here).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CheckPositive('num_classes', 'channels', 'num_blocks')
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(f'{p.name}: label_smoothing must be in [0, 1), got '
                       f'{p.label_smoothing!r}')
    cin = p.image_shape[2]
    pre = []
    for width in p.stem_pre_channels:
      pre.append(resnet.ConvBnLayer.Params().Set(
          filter_shape=(3, 3, cin, width), bn_decay=p.bn_decay))
      cin = width
    if pre:
      self.CreateChildren('stem_pre', pre)
    if pre or p.stem_pool:
      self.CreateChild('pool', pooling.PoolingLayer.Params().Set(
          window_shape=(2, 2), window_stride=(2, 2)))
    self.CreateChild('stem', resnet.ConvBnLayer.Params().Set(
        filter_shape=(3, 3, cin, p.channels), bn_decay=p.bn_decay))
    block = resnet.ResidualBlock.Params().Set(channels=p.channels,
                                              bn_decay=p.bn_decay)
    if p.pipeline_tpl is None:
      self.CreateChildren('body', [block.Copy() for _ in
                                   range(p.num_blocks)])
    else:
      self.CreateChild('body', p.pipeline_tpl.Copy().Set(
          body_tpl=block, num_layers=p.num_blocks))
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
