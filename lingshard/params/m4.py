"""M4 translation models: GShard's MoE Transformers (Table 1) and baselines.

GShard §4 / App. A.2: a Transformer encoder-decoder with M = 1024,
H = 8192 (FFN and expert hidden dim), 16 attention heads of key/value dim
128, dropout 0.1 on inputs, residuals and attention; MoE layers (top-2
gating, §2.2) replace every other FFN in encoder and decoder; SentencePiece
vocabularies of 64k (source, 102 languages) and 32k (target, English);
Adafactor with learning rate 1.0 and rsqrt decay after 10k steps; float32
weights and activations; one device per expert on a 1-D mesh.

What "L" counts (§4.3, Table 1): "12 (the original Transformer depth,
consisting of 6 encoder and 6 decoder layers), 36 and 60 layers" — L is
encoder + decoder Transformer layers, split evenly, and every other layer's
FFN is an MoE layer, so a model has L/2 MoE layers: Table 1's "experts
total" column is E * L/2 (2048 * 18 = 36864 for MoE(2048E, 36L)).
`python -m lingshard.tools.count_params --model=m4.<Class>` prints the
resulting counts; the expert weights, E * L/2 * 2 * M * H, dominate:

  config          experts      total        paper   total/paper
  MoE(128E, 12L)   12.88B     13.27B        12.5B      +6.1%
  MoE(128E, 36L)   38.65B     39.54B          37B      +6.9%
  MoE(512E, 12L)   51.54B     51.93B          50B      +3.9%
  MoE(512E, 36L)  154.62B    155.51B         150B      +3.7%
  MoE(2048E, 12L) 206.16B    206.55B         200B      +3.3%
  MoE(2048E, 36L) 618.48B    619.40B         600B      +3.2%
  MoE(2048E, 60L)  1.031T     1.032T           1T      +3.2%

The paper's column is about E * L/2 * 16.28M in every row (1T / 61440
experts; 37B for 37.5B), i.e. it tracks the experts total; the full counts of the 128-expert
models, whose dense part (attention, dense FFNs, embeddings: 0.38B at 12L,
0.89B at 36L) is about 3% of the weights, land 6-7% above it. No reading
of "L" does better: the expert weights of MoE(128E, 36L) alone are 38.65B.

The data: `DATA_DIR` (a `lingshard.data.prepare` output directory) read by
`lingshard.data.inputs.MtInput` (a config's `DATA_DIR` attribute; the
`*Large` configs read `prepare --corpus=large`'s); point a run elsewhere with
`--params_override=input.file_pattern=...;input.src_vocab=...;...`.
"""

import numpy as np
import tensorflow as tf

from lingshard import model_registry
from lingshard.base_model_params import SingleTaskModelParams
from lingshard.data import inputs
from lingshard.data import prepare
from lingshard.data import splits
from lingshard.data import vocab
from lingshard.layers import pipeline
from lingshard.models import mt_model
from lingshard.layers.moe import noisy_top_k
from lingshard.layers.moe import top2

# Where `lingshard.data.prepare` writes the corpus (and with --corpus=large).
DATA_DIR = prepare.DEFAULT_OUT
LARGE_DATA_DIR = prepare.LARGE_OUT
MESH_AXIS_NAMES = ['x']  # One axis: batch/groups and experts (GShard §3.2).


def Transformer(num_layers, model_dim=1024, hidden_dim=8192, num_heads=16,
                dim_per_head=128, num_experts=None, num_devices=None,
                src_vocab_size=64000, tgt_vocab_size=32000, dropout=0.1):
  """TransformerMTModel params; MoE every other layer if num_experts.

  Args:
    num_layers: encoder + decoder layers (GShard's L), split evenly.
    model_dim, hidden_dim, num_heads, dim_per_head: M, H, heads, kv dim.
    num_experts: E per MoE layer; None = dense Transformer.
    num_devices: size of the 1-D device mesh (default E; None and no
      experts = no mesh). Batch (and MoE groups) split over it, experts
      too.
    src_vocab_size, tgt_vocab_size: vocabularies.
    dropout: input, residual and attention dropout (App. A.2).
  """
  if num_layers % 2:
    raise ValueError(f'num_layers (encoder + decoder) must be even, got '
                     f'{num_layers}')
  p = mt_model.TransformerMTModel.Params().Set(
      name='model', src_vocab_size=src_vocab_size,
      tgt_vocab_size=tgt_vocab_size, model_dim=model_dim,
      hidden_dim=hidden_dim, num_heads=num_heads, dim_per_head=dim_per_head,
      num_encoder_layers=num_layers // 2, num_decoder_layers=num_layers // 2,
      input_dropout_prob=dropout, residual_dropout_prob=dropout,
      atten_dropout_prob=dropout, label_smoothing=0.1)
  devices = num_devices or num_experts
  if devices:
    p.device_mesh = np.arange(devices)
    p.mesh_axis_names = list(MESH_AXIS_NAMES)
  if num_experts:
    mp = top2.MoELayer.Params().Set(
        num_experts=num_experts, num_groups=devices, capacity_factor=1.0,
        second_expert_policy='random', dispatch_impl='auto',
        **{'aux_loss_weights.group_aux': 0.01})
    # Groups split over the mesh, experts (weights and buffers) too. The
    # dispatch is the measured-fastest of two equal ones for the platform
    # the trainer runs on (moe/base.py AutoDispatchImpl: gather on CPU/GPU, GShard's
    # Algorithm 2 einsums on TPU).
    p.moe_tpl = top2.MoELayer.SetExpertSharding(mp, p.device_mesh)
    # GShard trains its decoder this way: with C < S, a later target
    # token's first choice can take an earlier token's second-choice slot
    # (Algorithm 1), a leak of the future into training routing. Accepted:
    # it is the paper's model, and decoding, eval and export route each
    # token alone (MoEBase.ForInference: groups of one token, no drops), so
    # what is decoded and scored is causal.
    p.allow_noncausal_routing = True
  # App. A.2: Adafactor (factored, beta1 = 0), lr 1.0, rsqrt decay from 10k.
  p.train.Set(optimizer='adafactor', learning_rate=1.0,
              lr_schedule='rsqrt_decay', warmup_steps=10000,
              max_steps=1000000)
  return p


class M4Corpus(SingleTaskModelParams):
  """Inputs: the prepared multilingual corpus in DATA_DIR (xx -> en)."""

  DATA_DIR = DATA_DIR  # The prepare output directory read.
  SHARED_VOCAB = False  # True: spm_shared.model on both sides.

  def _Input(self, split):
    return inputs.MtInput.ParamsForCorpus(self.DATA_DIR, split,
                                          shared_vocab=self.SHARED_VOCAB)

  def Train(self):
    return self._Input(splits.TRAIN)

  def Dev(self):
    return self._Input(splits.DEV_UNSEEN)

  def Test(self):
    return self._Input(splits.TEST_UNSEEN)


# GShard Table 3, "Batch sz. (Tokens)": 4M per step for the 2048-core
# models and T(96L), 1M for the 512- and 128-core models. Three length
# buckets of that many target tokens each (static shapes: one XLA program
# per bucket on TPU).
PAPER_BUCKET_UPPER_BOUNDS = [32, 64, 128]
PAPER_TOKENS = {2048: 4 * 2**20, 512: 2**20, 128: 2**20}  # By cores.
# Groups of S = 2048 tokens in every config (GShard §2.2's group size): 2048
# groups at 4M tokens (one per core), 512 at 1M (one per core on 512, 4 per
# core on 128), so a group's [S, E, C] dispatch tensors (2 S^2 elements) are
# the same in every config instead of growing with tokens per core.
PAPER_GROUP_SIZE = 2048


def PaperBatch(tokens):
  """bucket_batch_limits of `tokens` target tokens per bucket."""
  return [tokens // t for t in PAPER_BUCKET_UPPER_BOUNDS]


class PaperScale(M4Corpus):
  """The paper's training batch (Table 3) on the prepared corpus."""

  def Cores(self):
    """TPU v3 cores the paper trained the config on (Table 3)."""
    return 2048

  def Train(self):
    return super().Train().Set(
        bucket_upper_bounds=list(PAPER_BUCKET_UPPER_BOUNDS),
        bucket_batch_limits=PaperBatch(PAPER_TOKENS[self.Cores()]))

  # Decoding and eval on the training mesh (GShard App. A.1): one sentence
  # per core, the batch split over every core. The default 16 sentences
  # cannot split over 128+ cores; more per core grows the dropless
  # one-token-group dispatch of the encoder pass (all of a batch's source
  # tokens are slots of each core's expert: [1, B*T, 1, H] hidden).
  def Dev(self):
    return super().Dev().Set(eval_batch_size=self.Cores())

  def Test(self):
    return super().Test().Set(eval_batch_size=self.Cores())


class _GShardMoE(PaperScale):
  """MoE(E, L) of GShard Table 1 on E cores (one expert per core).

  Re-materialisation (`remat`, GShard §5.1): 'layer' recomputes each
  layer's forward in the backward pass. GShard's 36- and 60-layer models
  need it, and so, by XLA's accounting here, does every config with more
  than 2,048 tokens per core: MoE(128E, 12L) trains 1M tokens on 128 cores
  (8,192 per core), 21.6 GiB per core without remat
  (scripts/bench_paper_scale.py, which measures every config).
  """
  NUM_EXPERTS = 0
  NUM_LAYERS = 0

  def Cores(self):
    return self.NUM_EXPERTS  # One expert per core (GShard §3).

  def Remat(self):
    tokens_per_core = PAPER_TOKENS[self.Cores()] // self.Cores()
    return ('layer' if self.NUM_LAYERS >= 36 or tokens_per_core > 2048 else
            'none')

  def Task(self):
    p = Transformer(self.NUM_LAYERS, num_experts=self.NUM_EXPERTS)
    p.moe_tpl.num_groups = PAPER_TOKENS[self.NUM_EXPERTS] // PAPER_GROUP_SIZE
    p.remat = self.Remat()
    return p


@model_registry.RegisterSingleTaskModel
class MoE128E12L(_GShardMoE):
  """GShard MoE(128E, 12L): 12.5B weights, 128 devices (Table 1 row 6)."""
  NUM_EXPERTS, NUM_LAYERS = 128, 12


@model_registry.RegisterSingleTaskModel
class MoE128E36L(_GShardMoE):
  """GShard MoE(128E, 36L): 37B weights, 128 devices (Table 1 row 5)."""
  NUM_EXPERTS, NUM_LAYERS = 128, 36


@model_registry.RegisterSingleTaskModel
class MoE512E12L(_GShardMoE):
  """GShard MoE(512E, 12L): 50B weights, 512 devices (Table 1 row 4)."""
  NUM_EXPERTS, NUM_LAYERS = 512, 12


@model_registry.RegisterSingleTaskModel
class MoE512E36L(_GShardMoE):
  """GShard MoE(512E, 36L): 150B weights, 512 devices (Table 1 row 3)."""
  NUM_EXPERTS, NUM_LAYERS = 512, 36


@model_registry.RegisterSingleTaskModel
class MoE2048E12L(_GShardMoE):
  """GShard MoE(2048E, 12L): 200B weights, 2048 devices (Table 1 row 2)."""
  NUM_EXPERTS, NUM_LAYERS = 2048, 12


@model_registry.RegisterSingleTaskModel
class MoE2048E36L(_GShardMoE):
  """GShard MoE(2048E, 36L): 600B weights, 2048 devices (Table 1 row 1)."""
  NUM_EXPERTS, NUM_LAYERS = 2048, 36


# MoE(2048E, 36L) inside GPipe (an option; GShard trained it unpipelined):
# each stack's 18 layers are 9 (dense, MoE) pairs over K = 2 stages of
# 1,024 devices (5 + 4 pairs: one padded slot), experts split over each
# stage's devices (2 per device), M = 8 micro-batches (GPipe §2.3: M >= 4K),
# groups of 512 tokens: every bucket's micro-batch is 512 tokens per device.
MOE_PIPELINE_STAGES = 2
MOE_PIPELINE_MICRO_BATCHES = 8
MOE_PIPELINE_GROUP_SIZE = 512


@model_registry.RegisterSingleTaskModel
class MoE2048E36LPipelined(MoE2048E36L):
  """MoE(2048E, 36L) as a 2-stage GPipe pipeline on a [1024, 2] mesh.

  Mesh axes ('x', 'stage'): within a stage, batch, MoE groups and experts
  split over 'x' as in the unpipelined config (GShard §3.2); stages hold
  their own layers (never gathered), re-materialised per stage.
  """

  def Task(self):
    p = super().Task()
    p.device_mesh = np.arange(2048).reshape(-1, MOE_PIPELINE_STAGES)
    p.mesh_axis_names = MESH_AXIS_NAMES + ['stage']
    p.remat = 'none'  # The pipeline remats per stage.
    p.moe_tpl.Set(num_groups=None, group_size=MOE_PIPELINE_GROUP_SIZE)
    top2.MoELayer.SetExpertSharding(p.moe_tpl, p.device_mesh, 'x',
                                    p.mesh_axis_names)
    p.pipeline_tpl = pipeline.PipelinedLayer.Params().Set(
        num_stages=MOE_PIPELINE_STAGES,
        num_micro_batches=MOE_PIPELINE_MICRO_BATCHES, remat=True)
    return p


@model_registry.RegisterSingleTaskModel
class MoE2048E60L(_GShardMoE):
  """GShard MoE(2048E, 60L): 1T weights, 2048 devices (Table 1, last row).

  The paper trained it with bfloat16 activations (§4.1): float32 weights
  (cast per use), bfloat16 matmuls and activations; gating softmax, aux
  loss and the loss stay float32 (Algorithm 1; layers/moe/top2.py, softmax.py).
  """
  NUM_EXPERTS, NUM_LAYERS = 2048, 60

  def Task(self):
    p = super().Task()
    p.fprop_dtype = tf.bfloat16
    return p


T96L_STAGES = 16
T96L_MICRO_BATCHES = 4 * T96L_STAGES


@model_registry.RegisterSingleTaskModel
class DenseT96L(PaperScale):
  """GShard's deep dense baseline T(96L): 2.3B weights (Figure 6).

  48 encoder + 48 decoder layers, M = 1024, H = 8192, 16 heads of key/value
  dim 64 (16 * 64 = M, the Transformer default: with GShard's MoE setting
  of 128 the model would have 2.8B weights, not the reported 2.3B).

  Pipelined as GShard trained it, "GPipe on 2048 TPU v3 cores" (GShard §4,
  Figure 6, Table 3). The paper does not give K; we use K = 16 cells (3
  encoder + 3 decoder layers each) times 128 data-parallel replicas: a
  [128, 16] data x stage mesh of 2048 devices, M = 64 = 4K micro-batches
  (GPipe §2.3: the bubble is negligible for M >= 4K), remat on. The same
  network unpipelined is these params with `task.pipeline_tpl = None`.
  """

  def Task(self):
    p = Transformer(96, dim_per_head=64, num_devices=2048)
    p.device_mesh = np.arange(2048).reshape(2048 // T96L_STAGES, T96L_STAGES)
    p.mesh_axis_names = ['data', 'stage']
    p.pipeline_tpl = pipeline.PipelinedLayer.Params().Set(
        num_stages=T96L_STAGES, num_micro_batches=T96L_MICRO_BATCHES,
        remat=True)
    return p


# CPU-sized models: the same code at laptop scale. Both have 2 encoder + 2
# decoder layers, M = 128, and the corpus's shared vocabulary with one
# table for source, target and softmax: pieces common to both sides
# (names, code, numbers, placeholders) are then copied easily, which is
# what lets minutes of training generalise to unseen English strings.
TINY = dict(model_dim=128, num_heads=4, dim_per_head=32,
            src_vocab_size=vocab.DEFAULT_SHARED_VOCAB_SIZE,
            tgt_vocab_size=vocab.DEFAULT_SHARED_VOCAB_SIZE)
TINY_EXPERTS = 8
TINY_EXPERT_HIDDEN = 256
# Same matmul FLOPs per token as TinyMoE: each stack of TinyMoE has one
# dense FFN (2MH) and one top-2 MoE layer (gating ME + 2 * 2MH), i.e.
# 6MH + ME; two dense FFNs of hidden H' give 4MH', so H' = 1.5H + E/4.
TINY_DENSE_HIDDEN = TINY_EXPERT_HIDDEN * 3 // 2 + TINY_EXPERTS // 4


class TinyCorpus(M4Corpus):
  """The prepared corpus with the shared vocabulary (the Tiny configs)."""
  SHARED_VOCAB = True


def TinyTrain(p):
  """The Tiny configs' training settings on TransformerMTModel params `p`."""
  # A high peak learning rate and no dropout: the demo trains for a few
  # epochs of the small corpus, too few for dropout to help, and dropout's
  # random bits slow each XLA CPU step.
  p.Set(input_dropout_prob=0.0, residual_dropout_prob=0.0,
        atten_dropout_prob=0.0, share_src_tgt_embedding=True,
        share_tgt_embedding_softmax=True)
  p.train.Set(optimizer='adam', learning_rate=2e-3, lr_schedule='rsqrt',
              warmup_steps=200, max_steps=20000,
              clip_gradient_norm_to_value=1.0)
  p.decode.max_decode_len = 48
  return p


@model_registry.RegisterSingleTaskModel
class TinyMoE(TinyCorpus):
  """CPU-sized MoE Transformer: 8 experts, mesh of 8 devices.

  2 + 2 layers (the second of each stack MoE), M = 128, H = 256, 4 heads
  of 32, one shared 4,000-piece vocabulary and table. 2,090,752 weights
  (1,048,576 in experts); 2,600,960 forward matmul FLOPs per (source +
  target) token, nominal top-2 (count_params; the capacity factor adds
  padded slots on top).
  """

  def Task(self):
    p = Transformer(4, hidden_dim=TINY_EXPERT_HIDDEN, num_experts=TINY_EXPERTS,
                    **TINY)
    return TinyTrain(p)


@model_registry.RegisterSingleTaskModel
class TinyDense(TinyCorpus):
  """Dense twin of TinyMoE with the same matmul FLOPs per token.

  2 + 2 layers, M = 128, H = 386 (= 1.5 * 256 + 8/4, see TINY_DENSE_HIDDEN),
  4 heads of 32, batch split over 8 devices. 1,305,608 weights;
  2,600,960 forward matmul FLOPs per (source + target) token, as TinyMoE.
  """

  def Task(self):
    p = Transformer(4, hidden_dim=TINY_DENSE_HIDDEN, num_devices=8, **TINY)
    return TinyTrain(p)


# The same two models on the large corpus (prepare --corpus=large: ~5x the
# English strings, a shared vocabulary of the same 4,000 pieces).
@model_registry.RegisterSingleTaskModel
class TinyMoELarge(TinyMoE):
  """TinyMoE on the large corpus in LARGE_DATA_DIR."""
  DATA_DIR = LARGE_DATA_DIR


@model_registry.RegisterSingleTaskModel
class TinyDenseLarge(TinyDense):
  """TinyDense on the large corpus in LARGE_DATA_DIR."""
  DATA_DIR = LARGE_DATA_DIR


# Sparse upcycling (Komatsuzaki et al. 2023, Figure 1): an MoE layer's
# experts start as copies of the dense FFN it replaces (its fc_in / fc_out
# weights and biases, tiled over E by train/init_rules.py), the router (wg)
# fresh, every other weight copied by name.
UPCYCLE_RULES = (
    [(r'(.*)/moe/wi', '%s/ffn/fc_in/w'), (r'(.*)/moe/bi', '%s/ffn/fc_in/b'),
     (r'(.*)/moe/wo', '%s/ffn/fc_out/w'), (r'(.*)/moe/bo', '%s/ffn/fc_out/b'),
     (r'(.*)', '%s')],
    [r'.*/moe/wg'])


@model_registry.RegisterSingleTaskModel
class TinyMoEUpcycled(TinyCorpus):
  """TinyMoE initialised from a dense run by sparse upcycling.

  TinyMoE's shape (8 experts of hidden 256) with expert biases, so each
  expert is exactly the dense FFN (relu(x wi + bi) wo + bo); the router is
  fresh and every other weight is the dense run's. The dense run is
  m4.TinyDense with the expert hidden (`task.hidden_dim=256`); point this
  config at its logdir (its latest checkpoint) or a checkpoint prefix:

    --model=m4.TinyMoEUpcycled --init_from_checkpoint=<dense logdir>

  The trainer refuses to start without it (in one line) unless --logdir
  already holds this run's own checkpoint (a resumed run restores that).
  """

  def Task(self):
    p = TinyMoE().Task()
    p.moe_tpl.use_bias = True
    p.train.init_from_checkpoint_rules = {'': UPCYCLE_RULES}
    p.train.init_from_checkpoint_require_all = True
    return p


# Variants of TinyMoE for the evidence page (python -m lingshard.experiments): the
# same experts (hidden 256, top-2) in every arm, so matmul FLOPs per token
# differ from TinyMoE's only by the gate's M * E; 8 groups of a batch's
# tokens in every arm (one group size, one capacity rule).
TINY_GROUPS = 8


def TinyMoEVariant(num_experts, num_layers=4):
  """TinyMoE's params with `num_experts` experts and `num_layers` (encoder
  + decoder) layers; experts split over a mesh of min(E, 8) devices."""
  p = Transformer(num_layers, hidden_dim=TINY_EXPERT_HIDDEN,
                  num_experts=num_experts,
                  num_devices=min(num_experts, TINY_GROUPS), **TINY)
  p.moe_tpl.num_groups = TINY_GROUPS
  return TinyTrain(p)


@model_registry.RegisterSingleTaskModel
class TinyMoE4E(TinyCorpus):
  """TinyMoE with 4 experts (mesh of 4 devices, 8 groups)."""

  def Task(self):
    return TinyMoEVariant(4)


@model_registry.RegisterSingleTaskModel
class TinyMoE16E(TinyCorpus):
  """TinyMoE with 16 experts (2 per device of its 8-device mesh)."""

  def Task(self):
    return TinyMoEVariant(16)


@model_registry.RegisterSingleTaskModel
class TinyMoE32E(TinyCorpus):
  """TinyMoE with 32 experts (4 per device of its 8-device mesh)."""

  def Task(self):
    return TinyMoEVariant(32)


@model_registry.RegisterSingleTaskModel
class TinyMoE12L(TinyCorpus):
  """TinyMoE 6 + 6 layers deep (3 MoE layers per stack, 8 experts):
  GShard §4.4's depth comparison at laptop scale."""

  def Task(self):
    return TinyMoEVariant(TINY_EXPERTS, num_layers=12)


@model_registry.RegisterSingleTaskModel
class TinyMoEShared(TinyCorpus):
  """TinyMoE with DeepSeekMoE's shared expert (§3.2) and a Switch router.

  Each MoE layer: 1 shared expert (hidden 256, every token) + 8 routed
  experts, top-1 (noisy top-k gate, gate_softmax='all', Switch
  Transformer §2.1; Shazeer's noise and importance/load losses), so a
  token runs 2 expert FFNs as in TinyMoE's top-2; capacity factor 1.0
  (C = S/E: 1 routed + 1 shared slot per token, TinyMoE's 2S/E slots per
  expert for 2 choices). 2,223,872 weights (1,048,576 routed and 131,072
  shared expert weights, 4,096 gating: Wg and Wnoise); 2,605,056 forward
  matmul FLOPs per (source + target) token (count_params): TinyMoE's
  2,600,960 plus 2 x the second gating matrix Wnoise [M, E] of each of
  its 2 MoE layers.
  """

  def Task(self):
    p = Transformer(4, hidden_dim=TINY_EXPERT_HIDDEN, num_experts=TINY_EXPERTS,
                    **TINY)
    top2_p = p.moe_tpl
    mp = noisy_top_k.NoisyTopKMoELayer.Params().Set(
        num_experts=TINY_EXPERTS, num_groups=top2_p.num_groups,
        capacity_factor=top2_p.capacity_factor,
        eval_capacity_factor=top2_p.eval_capacity_factor,
        dispatch_impl=top2_p.dispatch_impl, num_experts_per_token=1,
        gate_softmax='all', num_shared_experts=1)
    p.moe_tpl = noisy_top_k.NoisyTopKMoELayer.SetExpertSharding(
        mp, p.device_mesh)
    return TinyTrain(p)
