"""Black-box causality of every registered decoder / LM config.

For each registered config whose task has a decoder (TransformerMTModel)
or is a language model (LMTask), shrunk to test size, a training-mode
forward (teacher forcing, is_inference False) is run on a batch, then
again with the last target tokens of one sequence changed: the logits of
every other position (that sequence's prefix and the other sequences) must
not move, unless the config's MoE class declares a leak (RoutingLeaks,
layers/moe/causality.py). A declared leak must be observed (some suffix
change moves an earlier logit), so the declaration is true, and the config
must accept it (`allow_noncausal_routing`).

Shrinking (`_Shrink`) keeps what routing causality depends on: the task
and gate classes, capacity_factor / expert_capacity, k, the second-expert
policy, noise and dropout (both keyed per token, layers/moe/rng.py), and
groups of one token where a config has them. It sets model dims, layers
(2 + 2, MoE every other as the configs), vocabularies and experts
(min(E, max(4, 2k)); hierarchical: 2 x 2) small; makes one routing group
of the whole batch (so the changed suffix shares a group with every
earlier token: any group-level leak can show); drops the mesh (one
device), the pipeline and remat (both compute the unpipelined,
unrematerialised math: tests/models/test_mt_pipeline.py,
tests/layers/test_remat.py) and bfloat16 (exact float32 comparisons); LMs
use the full softmax (sampled training returns no logits). The shrunk
config must declare what the registered one does. Weights that start
constant (e.g. noisy top-k's zero-initialised routers, App. A) get random
values, so routing depends on token content.
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard.layers.moe import expert_choice
from lingshard.layers.moe import hierarchical
from lingshard.models import lm_model
from lingshard.models import mt_model
from lingshard.models import regression_model
from lingshard.nested_map import NestedMap
from tests.models import mt_testlib

B, T = 2, 8           # A group of B * T = 16 target tokens.
PREFIX = 5            # Row 0's tokens from PREFIX on are changed.
TRIALS = 8            # Suffix changes tried to observe a declared leak.
DECODER_TASKS = (mt_model.TransformerMTModel, lm_model.LMTask)
OTHER_TASKS = (regression_model.FeedForwardRegression,)


def _Fresh(p):
  return p.cls.Params()


def _ShrinkMoE(mp):
  fresh = _Fresh(mp)
  mp.Set(device_mesh=None, mesh_axis_names=None, fprop_dtype=None,
         hidden_dim=16)
  mp.weight_split_dims_mapping = fresh.weight_split_dims_mapping.Copy()
  mp.activation_split_dims_mapping = (
      fresh.activation_split_dims_mapping.Copy())
  if mp.cls is hierarchical.HierarchicalMoELayer:
    mp.Set(num_expert_groups=2, num_experts=4, k_primary=min(
        mp.k_primary, 2), k_secondary=min(mp.k_secondary, 2))
  else:
    k = mp.cls.CapacityTopK(mp)
    mp.num_experts = min(mp.num_experts, max(4, 2 * k))
  if mp.group_size != 1:
    mp.Set(num_groups=1, group_size=None)
  return mp


def _Shrink(task):
  t = task.Copy()
  fresh = _Fresh(t)
  for key in ('device_mesh', 'mesh_axis_names', 'fprop_dtype',
              'batch_axes', 'random_seed'):
    t.Set(**{key: fresh.Get(key)})
  if t.cls is mt_model.TransformerMTModel:
    t.Set(model_dim=8, hidden_dim=16, num_heads=2, dim_per_head=4,
          num_encoder_layers=2, num_decoder_layers=2, src_vocab_size=16,
          tgt_vocab_size=16, pipeline_tpl=None, remat='none',
          encoder_moe_layers=None, decoder_moe_layers=None)
  else:
    t.Set(model_dim=8, num_cells=0, vocab_size=16, num_sampled=0)
  if t.moe_tpl is not None:
    _ShrinkMoE(t.moe_tpl)
  return t


def _Leaks(task):
  mp = task.moe_tpl
  return mp is not None and mp.cls.RoutingLeaks(mp) is not None


def _DecoderConfigs():
  """{registry key: task params} of every config with a decoder or an LM."""
  out = {}
  for key in model_registry.ListModels():
    task = model_registry.GetParams(key, 'Train').task
    assert task.cls in DECODER_TASKS + OTHER_TASKS, (
        f'{key}: {task.cls.__name__} is new here: does it decode?')
    if task.cls in DECODER_TASKS:
      out[key] = task
  return out


def _Batch(t, seed=0):
  if t.cls is mt_model.TransformerMTModel:
    return mt_testlib.SyntheticBatch(t, batch_size=B, src_len=T, tgt_len=T,
                                     tgt_lengths=[T, T - 2], seed=seed)
  rng = np.random.RandomState(seed)
  paddings = np.zeros([B, T], np.float32)
  paddings[1, T - 2:] = 1.0
  return NestedMap(ids=tf.constant(rng.randint(4, 16, [B, T]), tf.int32),
                   labels=tf.constant(rng.randint(2, 16, [B, T]), tf.int32),
                   paddings=tf.constant(paddings))


def _WithSuffix(t, batch, seed):
  """`batch` with row 0's target ids from PREFIX on replaced."""
  batch = batch.Transform(lambda x: x)
  side = batch.tgt if t.cls is mt_model.TransformerMTModel else batch
  ids = side.ids.numpy()
  rng = np.random.RandomState(100 + seed)
  ids[0, PREFIX:] = rng.randint(3, 16, T - PREFIX)
  side.ids = tf.constant(ids)
  return batch


def _Theta(task):
  """The task's weights; those that start constant made random."""
  rng = np.random.RandomState(0)

  def Fill(v):
    v = v.numpy()
    if v.size > 1 and np.all(v == v.flat[0]):
      v = v + rng.normal(size=v.shape)
    return tf.constant(v, tf.float32)

  return task.theta.Transform(Fill)


def _Probe(t):
  """(largest move of an earlier logit, of a changed one) per trial."""
  task = t.Instantiate()
  theta = _Theta(task)
  step = tf.constant(3, tf.int64)
  batch = _Batch(t)
  base = task.ComputePredictions(theta, batch, step=step).logits.numpy()
  earlier = np.ones(base.shape[:2], bool)
  earlier[0, PREFIX:] = False
  for trial in range(TRIALS):
    got = task.ComputePredictions(theta, _WithSuffix(t, batch, trial),
                                  step=step).logits.numpy()
    diff = np.abs(got - base).max(-1)
    yield diff[earlier].max(), diff[~earlier].max()


def _Unique(configs):
  """{shrunk params text: (keys, shrunk params)}: equal shrunk configs
  (e.g. the GShard sizes) run once."""
  out = {}
  for key, task in configs.items():
    t = _Shrink(task)
    assert _Leaks(t) == _Leaks(task), key
    keys, _ = out.setdefault(t.ToText(), ([], t))
    keys.append(key)
  return out


def _CheckCausality(keys, t, declared):
  for earlier, changed in _Probe(t):
    assert changed > 1e-4, keys     # The suffix change reaches the logits.
    if declared and earlier > 1e-4:
      return                        # The declared leak, observed.
    if not declared:
      assert earlier <= 1e-5, (keys, earlier)
      return
  assert not declared, f'{keys}: declared leak not observed'


def test_registered_decoders_are_causal_unless_they_declare_and_accept():
  configs = _DecoderConfigs()
  assert any(_Leaks(t) for t in configs.values())
  for text, (keys, t) in _Unique(configs).items():
    del text
    declared = _Leaks(t)
    for key in keys:
      assert configs[key].allow_noncausal_routing == declared, key
    _CheckCausality(keys, t, declared)


def _ExpertChoice(**kw):
  return expert_choice.ExpertChoiceMoELayer.Params().Set(
      num_experts=4, num_groups=1, capacity_factor=1.0, **kw)


def test_expert_choice_decoder_is_refused_in_one_line():
  p = mt_testlib.TinyParams(moe_tpl=_ExpertChoice())
  with pytest.raises(ValueError) as e:
    p.Instantiate()
  assert str(e.value) == (
      'dec/layer_001/moe: ExpertChoiceMoELayer routing is not causal in '
      'training (each expert picks its top-C tokens of the group, so later '
      "tokens change earlier tokens' experts); a decoder must not see later "
      'tokens: set allow_noncausal_routing=True to accept it')
  lm = lm_model.LMTask.Params().Set(name='lm', vocab_size=16, model_dim=8,
                                    moe_tpl=_ExpertChoice(hidden_dim=16))
  with pytest.raises(ValueError, match=r'^lm/moe: ExpertChoiceMoELayer '
                     r'routing is not causal in training \(.*\); a language '
                     r'model must not see later tokens: set '
                     r'allow_noncausal_routing=True to accept it$'):
    lm.Instantiate()


def test_expert_choice_leak_is_observed_and_encoder_only_is_causal():
  allowed = _Shrink(mt_testlib.TinyParams(moe_tpl=_ExpertChoice(),
                                          allow_noncausal_routing=True))
  _CheckCausality(['expert choice decoder'], allowed, declared=True)
  encoder_only = _Shrink(mt_testlib.TinyParams(moe_tpl=_ExpertChoice()))
  encoder_only.decoder_moe_layers = []
  encoder_only.Instantiate()  # Accepted: the decoder has no MoE layer.
  _CheckCausality(['expert choice encoder'], encoder_only, declared=False)


def test_readme_lists_the_registered_configs_that_leak_by_design():
  readme = os.path.join(os.path.dirname(__file__), '..', '..', 'README.md')
  with open(readme, encoding='utf-8') as f:
    text = f.read()
  para = re.search(r'Registered configs that leak by design[^\n]*\n'
                   r'((?:[ ]+[^\n]*\n)*)', text)
  assert para, 'README: no "Registered configs that leak by design" list'
  listed = set(re.findall(r'`(\w+\.\w+)`', para.group(0)))
  leaking = {k for k, t in _DecoderConfigs().items() if _Leaks(t)}
  assert listed == leaking
