"""GPipe's Transformer-L family (Huang et al. 2019, Table 1) and T(96L).

GPipe §3 / Table 1: "Transformer-L" is L Transformer layers of model dim
2048, feed-forward dim 8192 and 32 attention heads, with a 32k vocabulary,
sequence length 1024 and batch 32; the model grows by adding layers, split
into K cells on K accelerators (Pipeline-K):

  config              K      L   paper    count_params  without cross-atten.
  Naive-1 (no GPipe)  -      3   282.2M   298.9M        282.1M
  Pipeline-1          1     13   785.8M   886.3M        785.7M
  Pipeline-8          8    103   5.3B     6.17B         5.32B
  Pipeline-32        32    415   21.0B    24.50B        21.03B
  Pipeline-128      128   1663   83.9B    97.81B        83.87B

(Table 1 is an image in ../shared/papers; its L and counts are those of
the published table.) The paper's counts are L x 50.36M (one self-attention 4 * M^2 and one FFN
2 * M * H, plus biases and norms) plus two 32k x 2048 tables (131M); the text
gives 83.9B for 128 partitions, "298x" the single-accelerator model
(83.9B / 282.2M) and "2.7x" from re-materialisation alone (785.8M /
282.2M). Here Transformer-L is the zoo's encoder-decoder
(`TransformerMTModel`) with ceil(L/2) encoder and floor(L/2) decoder layers,
a source table and a target table shared with the softmax: each decoder
layer also has cross-attention (4 * M^2 = 16.8M), which the paper's count
does not have, so count_params reports the paper's figure plus
floor(L/2) * 16.8M (last column: the count without cross-attention).

Both stacks are pipelined over the same K stages (stage k holds the k-th cell
of the encoder and of the decoder; `pipeline_partition` splits L/2 layers
into K cells, padding the shorter cells: count_params does not count the
padded slots, its per-device bytes do), with re-materialisation, on a
1-D mesh of K devices (the stage axis). M = 32 micro-batches: Table 1
measures the largest model that fits, and micro-batches of one sequence
keep the least activation memory (§2.3); the paper does not give its M.

GShard's T(96L), which GShard trained with GPipe, is `m4.DenseT96L`
(16 stages x 128 data replicas); `gpipe.DenseT96LCircular` is it with the
circular schedule (pipeline_schedule.Circular, R = 3: stage k holds layers
k, k + 16, k + 32 of each stack; bubble 15 / 207 = 7% instead of 15 / 79 =
19%). The Transformer-L family's L/2 layers do not cut into K R equal
chunks (103: 52 / 51 layers on 8 stages), and unequal chunks are padded to
the longest, which costs more than the bubble saves there.
"""

import numpy as np

from lingshard import base_model_params
from lingshard import model_registry
from lingshard.data import image_inputs
from lingshard.layers import pipeline
from lingshard.layers import pipeline_cells
from lingshard.layers import pipeline_schedule
from lingshard.layers.moe import top2
from lingshard.models import amoebanet_model
from lingshard.models import image_model
from lingshard.models import mt_model
from lingshard.params import m4

MODEL_DIM = 2048
HIDDEN_DIM = 8192
NUM_HEADS = 32
VOCAB_SIZE = 32000
SEQ_LEN = 1024
BATCH_SIZE = 32
NUM_MICRO_BATCHES = 32


def PipelineParams(num_stages, num_micro_batches, remat=True, repeats=None):
  """PipelinedLayer params for TransformerMTModel.pipeline_tpl; repeats R:
  the circular schedule with R layer chunks per stage (None: fill-drain)."""
  p = pipeline.PipelinedLayer.Params().Set(
      num_stages=num_stages, num_micro_batches=num_micro_batches,
      remat=remat)
  if repeats is not None:
    p.schedule = pipeline_schedule.Circular.Params().Set(repeats=repeats)
  return p


def TransformerL(num_layers, num_stages=None,
                 num_micro_batches=NUM_MICRO_BATCHES):
  """GPipe Transformer-L as TransformerMTModel params (see module doc).

  Args:
    num_layers: L, split ceil(L/2) encoder + floor(L/2) decoder layers.
    num_stages: K cells on a 1-D mesh of K devices; None = no pipeline.
    num_micro_batches: M.
  """
  p = mt_model.TransformerMTModel.Params().Set(
      name='model', src_vocab_size=VOCAB_SIZE, tgt_vocab_size=VOCAB_SIZE,
      model_dim=MODEL_DIM, hidden_dim=HIDDEN_DIM, num_heads=NUM_HEADS,
      dim_per_head=MODEL_DIM // NUM_HEADS,
      num_encoder_layers=(num_layers + 1) // 2,
      num_decoder_layers=num_layers // 2,
      share_tgt_embedding_softmax=True, label_smoothing=0.1)
  if num_stages is not None:
    p.pipeline_tpl = PipelineParams(num_stages, num_micro_batches)
    if num_stages > 1:
      p.device_mesh = np.arange(num_stages)
  return p


class _TransformerL(m4.M4Corpus):
  """Transformer-L of GPipe Table 1: 1024-token sequences, batch 32."""
  NUM_LAYERS = 0
  NUM_STAGES = None

  def _Input(self, split):
    return super()._Input(split).Set(bucket_upper_bounds=[SEQ_LEN],
                                     bucket_batch_limits=[BATCH_SIZE])

  def Task(self):
    return TransformerL(self.NUM_LAYERS, self.NUM_STAGES)


@model_registry.RegisterSingleTaskModel
class TransformerL3(_TransformerL):
  """Naive-1 of GPipe Table 1: Transformer-3, one device, no GPipe."""
  NUM_LAYERS = 3


@model_registry.RegisterSingleTaskModel
class TransformerL13(_TransformerL):
  """Pipeline-1: Transformer-13, one cell, micro-batches + remat."""
  NUM_LAYERS, NUM_STAGES = 13, 1


@model_registry.RegisterSingleTaskModel
class TransformerL103(_TransformerL):
  """Pipeline-8: Transformer-103 over 8 cells."""
  NUM_LAYERS, NUM_STAGES = 103, 8


@model_registry.RegisterSingleTaskModel
class TransformerL415(_TransformerL):
  """Pipeline-32: Transformer-415 over 32 cells."""
  NUM_LAYERS, NUM_STAGES = 415, 32


@model_registry.RegisterSingleTaskModel
class TransformerL1663(_TransformerL):
  """Pipeline-128: Transformer-1663 over 128 cells (83.9B in the paper)."""
  NUM_LAYERS, NUM_STAGES = 1663, 128


# CPU-sized: m4.TinyDense's layers (M = 128, H = 386, 4 heads of 32, the
# shared 4,000-piece table), 4 + 4 of them so that K = 4 cells hold one
# encoder and one decoder layer each; M = 4 micro-batches (every bucket's
# batch, 128 ... 16, divides by M times the data axis), remat on.
TINY_STAGES = 4
TINY_MICRO_BATCHES = 4


@model_registry.RegisterSingleTaskModel
class TinyDensePipelined(m4.TinyCorpus):
  """m4.TinyDense's layers, 4 + 4 deep, pipelined over K = 4 stages.

  Mesh [2, 4]: data x stage (8 devices, as TinyDense); the stage axis is the
  mesh's last (TransformerMTModel.pipeline_tpl), so `spmd_check --mesh=4`
  runs it on a 4-stage axis alone and `--mesh=2,4` as data x stage.
  """

  def Task(self):
    p = m4.Transformer(8, hidden_dim=m4.TINY_DENSE_HIDDEN, num_devices=8,
                       **m4.TINY)
    p.device_mesh = np.arange(8).reshape(2, TINY_STAGES)
    p.mesh_axis_names = None
    p.pipeline_tpl = PipelineParams(TINY_STAGES, TINY_MICRO_BATCHES)
    return m4.TinyTrain(p)


# GShard inside GPipe at CPU size: TinyMoE's layers (M = 128, H = 256, 4
# heads of 32, 8 top-2 experts, the shared table), 4 + 4 of them so that
# each of K = 2 stages holds one (dense, MoE) pair of each stack, on a
# data x expert x stage mesh [2, 2, 2]; M = 4 micro-batches, remat on.
# Groups of 64 tokens: every training bucket (1,024 tokens) gives a
# micro-batch of 64 tokens on each device of a stage's data x expert plane
# (the batch is split over both): one group per device.
TINY_MOE_STAGES = 2
TINY_MOE_GROUP_SIZE = 64
MOE_MESH_AXIS_NAMES = ['data', 'expert', 'stage']


@model_registry.RegisterSingleTaskModel
class TinyMoEPipelined(m4.TinyCorpus):
  """m4.TinyMoE's layers, 4 + 4 deep (MoE every other layer), pipelined
  over K = 2 stages on a data x expert x stage mesh [2, 2, 2].

  Each stage runs one dense + one MoE layer per stack on its data x expert
  plane: the batch and the MoE groups split over data and expert, experts
  over the expert axis (4 per device), the dispatch an all-to-all within
  each data shard; stage weights stay on their stage. `spmd_check --mesh=2,2,2` checks it.
  """

  def Task(self):
    p = m4.Transformer(8, hidden_dim=m4.TINY_EXPERT_HIDDEN,
                       num_experts=m4.TINY_EXPERTS, num_devices=8, **m4.TINY)
    p.device_mesh = np.arange(8).reshape(2, 2, TINY_MOE_STAGES)
    p.mesh_axis_names = list(MOE_MESH_AXIS_NAMES)
    # Dense layers are data-parallel over data and expert (GShard: every
    # device of a stage); so is the stage state.
    p.batch_axes = ('data', 'expert')
    p.moe_tpl.Set(num_groups=None, group_size=TINY_MOE_GROUP_SIZE)
    top2.MoELayer.SetExpertSharding(p.moe_tpl, p.device_mesh, 'expert',
                                    p.mesh_axis_names, data_mesh_axis='data')
    p.pipeline_tpl = PipelineParams(TINY_MOE_STAGES, TINY_MICRO_BATCHES)
    p.pipeline_tpl.batch_mesh_axis = ('data', 'expert')
    return m4.TinyTrain(p)


@model_registry.RegisterSingleTaskModel
class DenseT96LCircular(m4.DenseT96L):
  """GShard's T(96L) (m4.DenseT96L: 16 stages x 128 replicas, M = 64) with
  the circular schedule, R = 3 (module doc): one layer per chunk."""

  def Task(self):
    p = super().Task()
    p.pipeline_tpl.schedule = pipeline_schedule.Circular.Params().Set(
        repeats=3)
    return p


# The circular schedule at CPU size, R = 2 chunks per stage: TinyDense's
# 4 + 4 layers on K = 2 stages (stage k holds layers k and k + 2 of each
# stack), a data x stage mesh [4, 2]; M = 4 >= K, every bucket's batch
# (128 ... 16) divides by M x 4.
TINY_CIRCULAR_STAGES = 2
TINY_CIRCULAR_REPEATS = 2


@model_registry.RegisterSingleTaskModel
class TinyDensePipelinedCircular(m4.TinyCorpus):
  """TinyDensePipelined's layers on K = 2 stages, circular schedule R = 2
  (bubble 1 / 9 instead of 1 / 5), mesh [4, 2] data x stage."""

  def Task(self):
    p = m4.Transformer(8, hidden_dim=m4.TINY_DENSE_HIDDEN, num_devices=8,
                       **m4.TINY)
    p.device_mesh = np.arange(8).reshape(4, TINY_CIRCULAR_STAGES)
    p.mesh_axis_names = None
    p.pipeline_tpl = PipelineParams(TINY_CIRCULAR_STAGES, TINY_MICRO_BATCHES,
                                    repeats=TINY_CIRCULAR_REPEATS)
    return m4.TinyTrain(p)


@model_registry.RegisterSingleTaskModel
class TinyMoEPipelinedCircular(TinyMoEPipelined):
  """TinyMoEPipelined with the circular schedule, R = 2: 8 + 8 layers
  (twice as deep: 4 (dense, MoE) bodies per stack, so that each of the
  K = 2 stages holds 2 chunks of one body), the same [2, 2, 2] mesh, M = 4,
  groups and expert sharding.

  random_seed 1: with the default 1234 one near-tied routing decision of
  this 16-layer model comes out differently in the partitioned and the
  one-device program of `spmd_check` (one token's expert in one layer: an
  error of 1e-2 of the largest moe.wi gradient in 260 of its 1M entries),
  for fill-drain exactly as for circular: the depth, not the schedule.
  """

  def Task(self):
    p = super().Task()
    p.random_seed = 1
    p.num_encoder_layers = p.num_decoder_layers = 8
    p.pipeline_tpl.schedule = pipeline_schedule.Circular.Params().Set(
        repeats=TINY_CIRCULAR_REPEATS)
    return p


# GPipe's image half on CPU: a small ResNet on 5,000 real MNIST digits
# (lingshard/data/image_prepare.py; 4,000 train / 1,000 test, no dev split:
# Dev and Test both read the 1,000 held-out digits).
MNIST_BATCH = 64
MNIST_STAGES = 2
MNIST_MICRO_BATCHES = 4
MNIST_BLOCKS = 2
MNIST_STEPS = 800


@model_registry.RegisterSingleTaskModel
class MnistResNet(base_model_params.SingleTaskModelParams):
  """models/image_model.ImageClassifier on 28 x 28 digits: two 3x3
  conv-BN-relu stem layers (16 and 32 channels), each followed by a 2x2 max
  pool, 2 residual blocks at 7 x 7 x 32, global average pool and softmax;
  batch norm's moving averages (updated by the train step) for eval. Adam,
  lr 3e-3 with 100 warmup steps and rsqrt decay, label smoothing 0.1.
  Unpipelined; MnistResNetPipelined is its body as a GPipe pipeline."""

  def Train(self):
    return image_inputs.ImageInput.Params().Set(
        split='train', batch_size=MNIST_BATCH)

  def Dev(self):
    return image_inputs.ImageInput.Params().Set(
        split='test', batch_size=100, is_inference=True)

  def Task(self):
    p = image_model.ImageClassifier.Params().Set(
        name='model', image_shape=(28, 28, 1), num_classes=10,
        stem_pre_channels=[16], channels=32, num_blocks=MNIST_BLOCKS,
        bn_decay=0.9, label_smoothing=0.1)
    p.train.Set(optimizer='adam', learning_rate=3e-3, lr_schedule='rsqrt',
                warmup_steps=100, max_steps=MNIST_STEPS,
                save_interval_steps=200, eval_interval_steps=200)
    return p


@model_registry.RegisterSingleTaskModel
class MnistResNetPipelined(MnistResNet):
  """MnistResNet with its residual blocks on K = 2 stages, M = 4
  micro-batches of 16 digits, re-materialised (GPipe §2): batch norm in the
  body uses each micro-batch's statistics, its moving averages the whole
  mini-batch's (§2.2); the stem and the head run outside the pipeline.
  No mesh (one device); `spmd_check --mesh=2,2` runs it on data x stage,
  each data replica's batch norm on its own shard (image_model
  bn_statistics)."""

  def Task(self):
    p = super().Task()
    p.pipeline_tpl = PipelineParams(MNIST_STAGES, MNIST_MICRO_BATCHES)
    return p


# AmoebaNet (GPipe §4.1, Tables 1-2; genotypes of Real et al. 2019,
# layers/amoebanet.py), unpipelined (data parallel) and pipelined (the
# *Pipelined keys: layers/pipeline_cells.CellPipelinedLayer, stages that
# change activation shape and read two earlier cells).
# GPipe's AmoebaNet-X(L, D): L normal cells (3 groups of L/3, 2 reduction
# cells between them), filter size D, the ImageNet stem (a stride-2 conv
# and 2 reduction cells). count_params of models/amoebanet_model.py (no
# auxiliary head; parameters do not depend on the image size; Table 1's
# (L, D) and counts are those of the published table, an image in
# ../shared/papers whose text gives 82M, 318M and 1.8B):
#
#   model                   paper               count_params
#   AmoebaNet-B(18, 512)    557M (§4.1)         558,009,288 (+0.18%)
#   AmoebaNet-D(18, 208)    82M (Table 1)        81,386,626
#   AmoebaNet-D(18, 416)    318M (Table 1)      318,039,978
#   AmoebaNet-D(18, 544)    542M (Table 1)      540,847,810
#   AmoebaNet-D(36, 544)    1.05B (Table 1)   1,054,527,970
#   AmoebaNet-D(72, 512)    1.8B (Table 1)    1,844,868,552
#   AmoebaNet-D(18, 256)    - (Table 2)         122,217,688
#
# ImageNet 2012 is not available here (data/image_inputs.
# UnavailableImageInput): these configs serve count_params and config_check;
# training them is a one-line input error naming
# gpipe.MnistAmoebaNet, their CPU-sized sibling on the prepared MNIST digits.
AMOEBA_BATCH = 128  # GPipe Table 1: "mini-batch size 128" at 224 x 224.
AMOEBA_STEM_CELLS = 2
AMOEBA_REDUCTION_CELLS = 2


def AmoebaNet(genotype, num_normal_cells, filters, image_shape, num_devices,
              num_classes=1000):
  """AmoebaNetClassifier params with Real et al.'s ImageNet settings (label
  smoothing 0.1, BN decay 0.9997) on a 1-D data-parallel mesh."""
  p = amoebanet_model.AmoebaNetClassifier.Params().Set(
      name='model', genotype=genotype, num_normal_cells=num_normal_cells,
      filters=filters, image_shape=image_shape, num_classes=num_classes,
      num_stem_cells=AMOEBA_STEM_CELLS,
      num_reduction_cells=AMOEBA_REDUCTION_CELLS, bn_decay=0.9997,
      label_smoothing=0.1)
  p.device_mesh = np.arange(num_devices)
  p.mesh_axis_names = ['data']
  return p


class _ImageNetAmoebaNet(base_model_params.SingleTaskModelParams):
  """An AmoebaNet on ImageNet 2012 (absent here: UnavailableImageInput)."""
  GENOTYPE, NUM_NORMAL_CELLS, FILTERS = 'D', 18, 256
  IMAGE_SHAPE = (224, 224, 3)
  NUM_DEVICES = 8

  def _Input(self, split, is_inference=False):
    return image_inputs.UnavailableImageInput.Params().Set(
        dataset='ImageNet 2012', image_shape=self.IMAGE_SHAPE, split=split,
        batch_size=AMOEBA_BATCH, is_inference=is_inference,
        instead='gpipe.MnistAmoebaNet')

  def Train(self):
    return self._Input('train')

  def Dev(self):
    return self._Input('test', is_inference=True)

  def Task(self):
    return AmoebaNet(self.GENOTYPE, self.NUM_NORMAL_CELLS, self.FILTERS,
                     self.IMAGE_SHAPE, self.NUM_DEVICES)


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_256(_ImageNetAmoebaNet):  # noqa: N801
  """GPipe Table 2's AmoebaNet-D(18, 256) (122.2M parameters by
  count_params; the paper does not state it) at 224 x 224, batch 128, data
  parallel over 8 devices (Table 2's largest K). The pipelined version
  awaits the shape-changing pipeline."""


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512(_ImageNetAmoebaNet):  # noqa: N801
  """GPipe §4.1's headline AmoebaNet-B(18, 512): 557M parameters in the
  paper (558.0M by count_params), 480 x 480 ImageNet images (§4.1), 1000
  classes; batch 128 (Table 1's; §4.1 does not state it), data parallel
  over 4 devices (the paper's 4 partitions, as data replicas until the
  shape-changing pipeline exists)."""
  GENOTYPE, NUM_NORMAL_CELLS, FILTERS = 'B', 18, 512
  IMAGE_SHAPE = (480, 480, 3)
  NUM_DEVICES = 4


MNIST_AMOEBA_FILTERS = 16
MNIST_AMOEBA_STEPS = 1600


@model_registry.RegisterSingleTaskModel
class MnistAmoebaNet(MnistResNet):
  """AmoebaNet-D at CPU size on the 28 x 28 MNIST digits (MnistResNet's
  input and training settings, 1,600 steps): a stride-1 stem conv (16
  channels), one stem reduction cell (14 x 14), L = 2 normal cells of
  D = 16 filters in 2 groups with one reduction cell between them
  (7 x 7 x 128 at the head). Unpipelined.

  Measured with the demo (MnistAmoebaNetPipelined, 2 cores): D = 8 and
  800 steps reached 94.8% test top-1 (5.9 steps/s); D = 16 and 1,600
  steps (3.2 steps/s, 10.7 of the demo's 12 minutes) 97.6%."""

  def Task(self):
    p = super().Task()
    train = p.train
    p = amoebanet_model.AmoebaNetClassifier.Params().Set(
        name='model', image_shape=(28, 28, 1), num_classes=10, genotype='D',
        num_normal_cells=2, filters=MNIST_AMOEBA_FILTERS,
        num_reduction_cells=1, num_stem_cells=1,
        stem_filters=MNIST_AMOEBA_FILTERS, stem_stride=1, bn_decay=0.9,
        label_smoothing=0.1)
    p.train = train.Set(max_steps=MNIST_AMOEBA_STEPS)
    return p


def CellPipelineParams(num_stages, num_micro_batches, remat=True):
  """CellPipelinedLayer params for AmoebaNetClassifier.pipeline_tpl (the
  cells and their input shape are set by the classifier; stages balanced
  by the cells' conv FLOPs)."""
  return pipeline_cells.CellPipelinedLayer.Params().Set(
      num_stages=num_stages, num_micro_batches=num_micro_batches,
      remat=remat)


class _ImageNetAmoebaNetPipelined(_ImageNetAmoebaNet):
  """An ImageNet AmoebaNet as a GPipe pipeline on a data x stage mesh."""
  NUM_STAGES, NUM_DATA = 4, 2
  NUM_MICRO_BATCHES = 8

  def Task(self):
    p = super().Task()
    p.device_mesh = np.arange(self.NUM_DATA * self.NUM_STAGES).reshape(
        self.NUM_DATA, self.NUM_STAGES)
    p.mesh_axis_names = ['data', 'stage']
    p.pipeline_tpl = CellPipelineParams(self.NUM_STAGES,
                                        self.NUM_MICRO_BATCHES)
    return p


@model_registry.RegisterSingleTaskModel
class AmoebaNetD_18_256Pipelined(_ImageNetAmoebaNetPipelined):  # noqa: N801
  """AmoebaNetD_18_256 as GPipe Table 2 runs it: K = 4 stages (Table 2's
  middle K; its 8-accelerator column is K = 8), M = 8 micro-batches of the
  128 images (Table 2's M = 8 column), remat, on a data x stage mesh
  [2, 4] (8 devices, as the unpipelined config): each micro-batch of 16
  split over 2 data replicas. The 22 cells (2 stem reduction cells, 18
  normal, 2 reduction) are split by their conv FLOPs."""


@model_registry.RegisterSingleTaskModel
class AmoebaNetB_18_512Pipelined(_ImageNetAmoebaNetPipelined):  # noqa: N801
  """AmoebaNetB_18_512 as GPipe §4.1 trained it: "on 4 partitions" = K = 4
  stages, no data parallelism (mesh [1, 4], data x stage), M = 8
  micro-batches of the 128 images (§4.1 does not give M; Table 2's
  largest), remat; cells split by their conv FLOPs. count_params counts
  each cell's own weights (558,009,288, as unpipelined)."""
  GENOTYPE, NUM_NORMAL_CELLS, FILTERS = 'B', 18, 512
  IMAGE_SHAPE = (480, 480, 3)
  NUM_DEVICES = 4
  NUM_STAGES, NUM_DATA = 4, 1


MNIST_AMOEBA_STAGES = 2
MNIST_AMOEBA_MICRO_BATCHES = 4


@model_registry.RegisterSingleTaskModel
class MnistAmoebaNetPipelined(MnistAmoebaNet):
  """MnistAmoebaNet with its cells as a GPipe pipeline: K = 2 stages
  (split by the cells' conv FLOPs), M = 4 micro-batches, re-materialised;
  the stem conv + BN and the head run outside the pipeline. Batch norm in
  the cells uses each micro-batch's statistics, its moving averages the
  whole mini-batch's (GPipe §2.2). No mesh (one device); `spmd_check
  --mesh=2,2` runs it on data x stage (README)."""

  def Task(self):
    p = super().Task()
    p.pipeline_tpl = CellPipelineParams(MNIST_AMOEBA_STAGES,
                                        MNIST_AMOEBA_MICRO_BATCHES)
    return p
