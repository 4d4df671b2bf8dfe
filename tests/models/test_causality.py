"""Black-box causality of every registered decoder / LM config.

For each registered config whose task has a decoder (TransformerMTModel)
or is a language model (LMTask), a training-mode forward (teacher forcing,
is_inference False) is run on a batch, then again with the last target
tokens of one sequence changed, several times: the logits of every other
position (that sequence's prefix and the other sequences) must not move,
unless the config's MoE class declares a leak (RoutingLeaks,
layers/moe/causality.py). A declared leak must be observed (some suffix
change moves an earlier logit), so the declaration is true, and the config
must accept it (`allow_noncausal_routing`).

Each config runs as registered (`_AsRegistered`): its task and gate
classes, capacity_factor / expert_capacity, k, second-expert policy, noise
and dropout (keyed per token), remat, pipeline (micro-batch layout, stage
and data axes), mesh axes, batch axes and activation dtype (bfloat16 for
m4.MoE2048E60L) are kept. Shrunk, only to run in seconds on a CPU: model
dims, vocabularies and experts (min(E, max(4, 2k)); hierarchical 2 x 2);
layers to the fewest that keep the structure (MoE every other layer;
pipelined: one body per stage); stages K and micro-batches M to at most 4
and each other mesh axis to at most 2 (a K=128 schedule runs the same code
as K=4, at 32x the cost); routing groups to S = 2T tokens, two rows (the
registered S of 64 to 2048 tokens exceed a test batch; two rows keep groups
spanning sequences, so a cross-sequence leak can show); the batch to 2 rows
per group per micro-batch per data shard. LMs use the full softmax
(sampled training returns no logits). The programs are traced without
XLA (annotations dropped, sharding.Function), so the mesh only shapes the
micro-batch layout and the group split. Weights that start constant (e.g.
noisy top-k's zero-initialised routers, App. A) get random values, so
routing depends on token content.
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard import sharding
from lingshard.layers.moe import causality
from lingshard.layers.moe import expert_choice
from lingshard.layers.moe import hierarchical
from lingshard.layers.moe import top2
from lingshard.models import amoebanet_model
from lingshard.models import image_model
from lingshard.models import lm_model
from lingshard.models import mt_model
from lingshard.models import regression_model
from lingshard.nested_map import NestedMap
from tests.models import mt_testlib

B, T = 2, 8           # A group of B * T = 16 target tokens.
PREFIX = 5            # Row 0's tokens from PREFIX on are changed.
TRIALS = 16           # Suffix changes: each must keep the earlier logits
                      # (undeclared); one must move them (declared leak).
DECODER_TASKS = (mt_model.TransformerMTModel, lm_model.LMTask)
OTHER_TASKS = (regression_model.FeedForwardRegression,
               image_model.ImageClassifier,
               amoebanet_model.AmoebaNetClassifier)


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


_MAX_STAGES = _MAX_MICRO_BATCHES = 4


def _Pipeline(t):
  return t.pipeline_tpl if 'pipeline_tpl' in t else None


def _SmallMesh(t):
  """The task's mesh with K stages kept (at most 4) and each other axis at
  most 2 devices; the stage axis is the mesh's last (mt_model)."""
  if t.device_mesh is None:
    return None
  shape = [min(n, 2) for n in np.shape(t.device_mesh)]
  if _Pipeline(t) is not None:
    shape[-1] = min(t.pipeline_tpl.num_stages, _MAX_STAGES)
  return np.arange(int(np.prod(shape))).reshape(shape)


def _AsRegistered(task):
  """The registered task, shrunk only in size (module docstring)."""
  t = task.Copy()
  t.device_mesh = _SmallMesh(task)
  if t.cls is mt_model.TransformerMTModel:
    t.Set(model_dim=8, hidden_dim=16, num_heads=2, dim_per_head=4,
          src_vocab_size=16, tgt_vocab_size=16)
    per_body = 1 if t.moe_tpl is None else 2  # (dense, MoE) pairs.
    layers = per_body
    if t.pipeline_tpl is not None:
      pp = t.pipeline_tpl
      pp.Set(num_stages=min(pp.num_stages, _MAX_STAGES),
             num_micro_batches=min(pp.num_micro_batches, _MAX_MICRO_BATCHES))
      # One body per stage and chunk (a circular schedule's repeats).
      repeats = pp.schedule.repeats if 'repeats' in pp.schedule else 1
      layers = per_body * pp.num_stages * repeats
    t.Set(num_encoder_layers=min(t.num_encoder_layers, layers),
          num_decoder_layers=min(t.num_decoder_layers, layers))
  else:
    t.Set(model_dim=8, num_cells=0, vocab_size=16, num_sampled=0)
  mp = t.moe_tpl
  if mp is not None:
    mp.hidden_dim = 16
    if mp.cls is hierarchical.HierarchicalMoELayer:
      mp.Set(num_expert_groups=2, num_experts=4, k_primary=min(
          mp.k_primary, 2), k_secondary=min(mp.k_secondary, 2))
    else:
      mp.num_experts = min(mp.num_experts, max(4, 2 * mp.cls.CapacityTopK(mp)))
    if mp.group_size != 1:
      mp.Set(num_groups=None, group_size=2 * T)
    if mp.device_mesh is not None:
      mp.device_mesh = t.device_mesh
  return t


def _BatchSize(t):
  """2 rows per group, per micro-batch and per data shard (or device)."""
  mesh, pp = t.device_mesh, _Pipeline(t)
  shards = 1 if mesh is None else int(np.prod(
      np.shape(mesh)[:-1] if pp is not None else np.shape(mesh)))
  return 2 * shards * (1 if pp is None else pp.num_micro_batches)


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


def _Batch(t, rows=B, seed=0):
  """`rows` sequences of T tokens; odd rows end in 2 paddings."""
  if t.cls is mt_model.TransformerMTModel:
    batch = mt_testlib.SyntheticBatch(
        t, batch_size=rows, src_len=T, tgt_len=T,
        tgt_lengths=[T - 2 * (r % 2) for r in range(rows)], seed=seed)
    del batch['lang']
    return batch
  rng = np.random.RandomState(seed)
  paddings = np.zeros([rows, T], np.float32)
  paddings[1::2, T - 2:] = 1.0
  return NestedMap(ids=tf.constant(rng.randint(4, 16, [rows, T]), tf.int32),
                   labels=tf.constant(rng.randint(2, 16, [rows, T]),
                                      tf.int32),
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


def _Probe(t, rows=B):
  """(largest move of an earlier logit, of a changed one) per trial."""
  task = t.Instantiate()
  theta = _Theta(task)
  step = tf.constant(3, tf.int64)
  logits = sharding.Function(
      lambda th, b: tf.cast(task.ComputePredictions(th, b, step=step).logits,
                            tf.float32), xla_compiled=False)
  batch = _Batch(t, rows)
  base = logits(theta, batch).numpy()
  earlier = np.ones(base.shape[:2], bool)
  earlier[0, PREFIX:] = False
  for trial in range(TRIALS):
    got = logits(theta, _WithSuffix(t, batch, trial)).numpy()
    diff = np.abs(got - base).max(-1)
    yield diff[earlier].max(), diff[~earlier].max()


# Read by the trainer (train.*) and by Decode (decode.*), never by the
# teacher-forced ComputePredictions the probe runs.
_NOT_IN_LOGITS = ('train.', 'decode.')


def _Unique(configs):
  """{shrunk params text: (keys, shrunk params)}: configs equal when shrunk
  up to _NOT_IN_LOGITS (e.g. the Tiny variants) run once."""
  out = {}
  for key, task in configs.items():
    t = _AsRegistered(task)
    assert _Leaks(t) == _Leaks(task), key
    text = '\n'.join(line for line in t.ToText().splitlines()
                     if not line.startswith(_NOT_IN_LOGITS))
    keys, _ = out.setdefault(text, ([], t))
    keys.append(key)
  return out


def _CheckCausality(keys, t, declared, rows=B):
  """Undeclared: no trial moves an earlier logit. Declared: one does."""
  for earlier, changed in _Probe(t, rows):
    assert changed > 1e-4, keys     # The suffix change reaches the logits.
    if declared and earlier > 1e-4:
      return                        # The declared leak, observed.
    if not declared:
      assert earlier <= 1e-5, (keys, earlier)
  assert not declared, f'{keys}: declared leak not observed'


def test_registered_decoders_are_causal_unless_they_declare_and_accept():
  configs = _DecoderConfigs()
  assert any(_Leaks(t) for t in configs.values())
  for text, (keys, t) in _Unique(configs).items():
    del text
    declared = _Leaks(t)
    for key in keys:
      assert configs[key].allow_noncausal_routing == declared, key
    _CheckCausality(keys, t, declared, rows=_BatchSize(t))


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


_CAPACITY_LEAK = (
    'its capacity can drop tokens (C < S): expert slots are filled per '
    'group, so a later token (first choices queue before second choices, '
    "GShard Algorithm 1) or another sequence in the group can take an "
    "earlier token's slot")


@pytest.mark.parametrize('settings,leaks', [
    # C = ceil(cf * k * S / E) against S (GShard §2.2).
    (dict(group_size=16, capacity_factor=1.0), True),      # C = 8 < 16.
    (dict(group_size=16, capacity_factor=2.0), False),     # C = 16.
    (dict(group_size=2, capacity_factor=0.1), True),       # C = 1 (floor 1).
    (dict(group_size=16, expert_capacity=15), True),
    (dict(group_size=16, expert_capacity=16), False),
    (dict(num_groups=1, expert_capacity=64), True),        # S unknown.
    (dict(num_groups=1, capacity_factor=1.0), True),       # cf * k < E.
    (dict(num_groups=1, capacity_factor=2.0), False),      # cf * k = E.
    (dict(num_groups=1, capacity_factor=None), False),     # Dropless.
    (dict(group_size=1, capacity_factor=0.1), False),      # One token.
])
def test_token_choice_leak_is_exactly_a_capacity_below_the_group(
    settings, leaks):
  p = top2.MoELayer.Params().Set(**{'num_experts': 4, 'num_groups': None,
                                     **settings})
  want = _CAPACITY_LEAK if leaks else None
  assert causality.TokenChoiceLeak(p, 2) == want
  assert top2.MoELayer.RoutingLeaks(p) == want


def test_capacity_dropping_top2_decoder_is_refused_in_one_line():
  moe = top2.MoELayer.Params().Set(num_experts=4, num_groups=1,
                                   capacity_factor=1.0)
  with pytest.raises(ValueError) as e:
    mt_testlib.TinyParams(moe_tpl=moe).Instantiate()
  assert str(e.value) == (
      f'dec/layer_001/moe: MoELayer routing is not causal in training '
      f'({_CAPACITY_LEAK}); a decoder must not see later tokens: set '
      'allow_noncausal_routing=True to accept it')
  # Accepted when asked, and the leak is real: a suffix moves the prefix.
  allowed = mt_testlib.TinyParams(moe_tpl=moe.Copy(),
                                  allow_noncausal_routing=True)
  _CheckCausality(['top-2, C < S'], _Shrink(allowed), declared=True)
  # C = S (cf * k = E): causal, accepted without the flag.
  dropless = mt_testlib.TinyParams(moe_tpl=moe.Copy().Set(capacity_factor=2.0))
  _CheckCausality(['top-2, C = S'], _Shrink(dropless), declared=False)
