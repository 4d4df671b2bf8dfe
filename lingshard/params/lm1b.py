"""Shazeer et al. 2017, App. C.1: the 8-million-ops-per-timestep LMs.

Every model: word embedding 512 -> LSTM -> (MoE | more LSTM | nothing) ->
LSTM -> softmax, dropout + residual on every layer but the softmax. Experts
are ReLU FFNs 512 -> 1024 -> 512 without biases ("1M parameters"); flat
layers use noisy top-4 gating, hierarchical ones top-2 at each level with
first-level branching 16; w_importance = w_load = 0.1. Parameter counts
excluding embedding and softmax (Table 7, millions):

  model           paper   here (count_params)
  4xLSTM-512        8.4   8.40
  LSTM-2048-512     9.4   9.45
  MoE-4             8.4   8.40
  MoE-32           37.8   37.79
  MoE-256         272.9   272.9
  MoE-256-h       272.9   272.9
  MoE-1024-h     1079.0   1079.0
  MoE-4096-h     4303.4   4303.4

(tests/models/test_lm1b_params.py checks each within 5%.) Registered:
`lm1b.TinyMoE` and its FLOP-matched baseline `lm1b.TinyLSTM` on the corpus
of `python -m lingshard.data.lm_prepare --out data/lm_en`, and the same
models on the larger corpus (~3.2M train words) of `python -m
lingshard.data.lm_prepare --sources=large --out data/lm_en_large`:
`lm1b.TinyMoELarge`, `lm1b.TinyLSTMLarge` (each config's embedding and
softmax are sized by its own corpus's vocab.txt).
"""

import os

import numpy as np

from lingshard import model_registry
from lingshard.base_model_params import SingleTaskModelParams
from lingshard.data import lm_inputs
from lingshard.data import lm_prepare
from lingshard.layers.moe import hierarchical as hierarchical_moe
from lingshard.layers.moe import noisy_top_k
from lingshard.models import lm_model

MODEL_DIM = 512
EXPERT_HIDDEN = 1024
W_IMPORTANCE = W_LOAD = 0.1
FLAT_K = 4
FIRST_LEVEL_BRANCHING = 16
# Table 7's vocabulary (1B Word Benchmark: 793,471 words).
VOCAB_SIZE = 793471
# App. C.1 trains the softmax "using importance sampling similarly to ...
# (Jozefowicz et al., 2016)", whose models sample 8192 words per batch.
NUM_SAMPLED = 8192

# name -> (num_experts, hierarchical); None = no MoE layer.
MOE_MODELS = {
    'MoE-4': (4, False), 'MoE-32': (32, False), 'MoE-256': (256, False),
    'MoE-256-h': (256, True), 'MoE-1024-h': (1024, True),
    'MoE-4096-h': (4096, True),
}
# Table 7's counts excluding embedding and softmax, millions.
PAPER_COUNTS = {
    '4xLSTM-512': 8.4, 'LSTM-2048-512': 9.4, 'MoE-4': 8.4, 'MoE-32': 37.8,
    'MoE-256': 272.9, 'MoE-256-h': 272.9, 'MoE-1024-h': 1079.0,
    'MoE-4096-h': 4303.4,
}


def MoEParams(num_experts, hierarchical, model_dim=MODEL_DIM,
              hidden_dim=EXPERT_HIDDEN, first_level=FIRST_LEVEL_BRANCHING):
  """The App. C.1 MoE layer (sigmoid output, w = 0.1, dropless)."""
  if hierarchical:
    p = hierarchical_moe.HierarchicalMoELayer.Params().Set(
        num_expert_groups=first_level, k_primary=2, k_secondary=2)
  else:
    p = noisy_top_k.NoisyTopKMoELayer.Params().Set(
        num_experts_per_token=FLAT_K)
  return p.Set(input_dim=model_dim, hidden_dim=hidden_dim,
               num_experts=num_experts, output_activation='sigmoid',
               num_groups=1, **{'aux_loss_weights.importance': W_IMPORTANCE,
                                'aux_loss_weights.load': W_LOAD})


def Model(name, vocab_size=VOCAB_SIZE, model_dim=MODEL_DIM,
          dropout_prob=0.1):
  """LMTask params of the App. C.1 model `name` (a PAPER_COUNTS key)."""
  p = lm_model.LMTask.Params().Set(
      name='lm', vocab_size=vocab_size, model_dim=model_dim,
      dropout_prob=dropout_prob,
      num_sampled=NUM_SAMPLED if vocab_size > NUM_SAMPLED else 0)
  if name == '4xLSTM-512':
    # "We replace the MoE layer with two additional 512-unit LSTM layers."
    return p.Set(num_lstm_before=2, num_lstm_after=2)
  if name == 'LSTM-2048-512':
    # One 2048-cell LSTM projected to 512 (LSTMP), no MoE.
    return p.Set(num_cells=4 * model_dim, num_lstm_before=1,
                 num_lstm_after=0)
  if name not in MOE_MODELS:
    raise ValueError(f'unknown App. C model {name!r}; one of '
                     f'{", ".join(PAPER_COUNTS)}')
  num_experts, hierarchical = MOE_MODELS[name]
  return p.Set(moe_tpl=MoEParams(num_experts, hierarchical, model_dim))


# ---------------------------------------------------------------- registered
# The English corpus of lingshard.data.lm_prepare (the 1B Word Benchmark is
# not available offline); its word vocabulary sizes the embedding/softmax.
DATA_DIR = 'data/lm_en'
# lm_prepare --sources=large: the stdlib, 47 pinned venv distributions and
# 12 pinned PyPI wheels.
LARGE_DATA_DIR = os.path.join('data', lm_prepare.LARGE_NAME)


class LmCorpus(SingleTaskModelParams):
  """Inputs: the lm_prepare corpus in the class's DATA_DIR."""
  DATA_DIR = DATA_DIR

  def Train(self):
    return lm_inputs.LmInput.ParamsForCorpus(self.DATA_DIR, 'train')

  def Dev(self):
    return lm_inputs.LmInput.ParamsForCorpus(self.DATA_DIR, 'dev')

  def Test(self):
    return lm_inputs.LmInput.ParamsForCorpus(self.DATA_DIR, 'test')

  def _VocabSize(self):
    """The corpus vocabulary's size; 0 (params only) before prepare."""
    path = self.Train().vocab
    return len(lm_inputs.VocabWords(path)) if os.path.isfile(path) else 0


def _Train(p, warmup_steps=1000, max_steps=27000):
  """App. C.1 training: Adam, the learning rate increased linearly for the
  first 1000 steps, then proportional to 1/sqrt(step); 10 epochs = 27,000
  steps."""
  p.train.Set(optimizer='adam', learning_rate=2e-3, lr_schedule='rsqrt',
              warmup_steps=warmup_steps, max_steps=max_steps,
              clip_gradient_norm_to_value=1.0)
  return p


class _AppC(LmCorpus):
  """An App. C.1 model at paper scale (Table 7's 793,471-word vocabulary)."""
  NAME = ''

  def Task(self):
    return _Train(Model(self.NAME))


def _Register(class_name, name):
  cls = type(class_name, (_AppC,), {'NAME': name, '__doc__':
                                    f'App. C.1 {name} (Table 7).'})
  cls.__module__ = __name__
  globals()[class_name] = model_registry.RegisterSingleTaskModel(cls)


for _cls, _name in (('LSTM4x512', '4xLSTM-512'),
                    ('LSTM2048x512', 'LSTM-2048-512'), ('MoE4', 'MoE-4'),
                    ('MoE32', 'MoE-32'), ('MoE256', 'MoE-256'),
                    ('MoE256H', 'MoE-256-h'), ('MoE1024H', 'MoE-1024-h'),
                    ('MoE4096H', 'MoE-4096-h')):
  _Register(_cls, _name)


# CPU-sized (model dim 128, App. C's structure): TinyMoE has 16 experts of
# 128 -> 256 -> 128 with noisy top-4 gating, so its MoE layer multiplies
# each word by 4 x 65,536 = 262,144 expert weights, as many as the two
# LSTM-128 layers that replace it in the FLOP-matched baseline TinyLSTM
# (App. C: 4xLSTM-512 vs MoE-4..MoE-256 at 8.4M ops/timestep).
TINY_DIM = 128
TINY_DEVICES = 8
# Static buffers need a capacity: dropless (C = S) would run every expert
# on every token, E / k = 4x the FLOPs of the layer. Training uses C =
# 1.25 k S / E (the balancing losses keep drops rare; dropped words pass
# through the residual); evaluation is dropless, so a word's perplexity
# never depends on its batch.
TINY_CAPACITY_FACTOR = 1.25


def TinyMoEParams():
  """TinyMoE's MoE layer: experts and groups split over an 8-device mesh
  (GShard §3.2 layout: dispatch is an all-to-all)."""
  mp = MoEParams(16, False, TINY_DIM, hidden_dim=2 * TINY_DIM).Set(
      num_groups=TINY_DEVICES, capacity_factor=TINY_CAPACITY_FACTOR,
      eval_capacity_factor=None)
  return noisy_top_k.NoisyTopKMoELayer.SetExpertSharding(
      mp, np.arange(TINY_DEVICES))


@model_registry.RegisterSingleTaskModel
class TinyMoE(LmCorpus):
  """CPU-sized MoE LM: LSTM-128, MoE (16 experts, top-4), LSTM-128."""

  def Task(self):
    p = lm_model.LMTask.Params().Set(
        name='lm', vocab_size=self._VocabSize() or 10004,
        model_dim=TINY_DIM, dropout_prob=0.1, moe_tpl=TinyMoEParams())
    # The capacity factor (GShard-style bounded buffers) lets a later
    # word's choices take an earlier word's slot in training. Accepted:
    # evaluation is dropless (eval_capacity_factor None, no noise), so
    # the perplexity it reports is causal.
    p.allow_noncausal_routing = True
    p.device_mesh = np.arange(TINY_DEVICES)
    return _Train(p, warmup_steps=200, max_steps=20000)


@model_registry.RegisterSingleTaskModel
class TinyLSTM(LmCorpus):
  """TinyMoE's FLOP-matched baseline: 4 x LSTM-128 (the MoE replaced by
  two LSTM layers)."""

  def Task(self):
    p = lm_model.LMTask.Params().Set(
        name='lm', vocab_size=self._VocabSize() or 10004,
        model_dim=TINY_DIM, dropout_prob=0.1, num_lstm_before=2,
        num_lstm_after=2)
    return _Train(p, warmup_steps=200, max_steps=20000)


@model_registry.RegisterSingleTaskModel
class TinyMoELarge(TinyMoE):
  """TinyMoE on the larger corpus in LARGE_DATA_DIR (lm_prepare
  --sources=large)."""
  DATA_DIR = LARGE_DATA_DIR


@model_registry.RegisterSingleTaskModel
class TinyLSTMLarge(TinyLSTM):
  """TinyLSTM on the larger corpus in LARGE_DATA_DIR (lm_prepare
  --sources=large)."""
  DATA_DIR = LARGE_DATA_DIR
