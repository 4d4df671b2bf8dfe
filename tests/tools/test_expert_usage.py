"""expert_usage: per-expert counts by language and token of a trained MoE
model, against a plain per-token reference loop, and the CLI on a real
2-step m4.TinyMoE checkpoint."""

import collections
import json
import os

from absl import flags
import numpy as np
import pytest
import tensorflow as tf

from lingshard import trainer
from lingshard.layers.moe import expert_choice
from lingshard.layers.moe import noisy_top_k
from lingshard.models import lm_model
from lingshard.nested_map import NestedMap
from lingshard.tools import expert_usage
from tests.models import mt_testlib
from tests.trainer import trainer_testlib

E = 4
LANGS = ['de', 'ja', 'de', 'fr']


def _LayerNorm(x, scale, bias, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def _Reference(inputs_btm, wg_me, real_bt, ids_bt, langs, k):
  """{'first' | 'all': {'lang' | 'token': Counter((key, expert))}} by a
  per-token loop: the top-k of the gate logits x . wg of each real token."""
  out = {kind: {'lang': collections.Counter(),
                'token': collections.Counter()} for kind in ('first', 'all')}
  b_len, t_len = real_bt.shape
  for b in range(b_len):
    for t in range(t_len):
      if not real_bt[b, t]:
        continue
      logits = inputs_btm[b, t].astype(np.float64) @ wg_me
      order = np.argsort(-logits, kind='stable')
      # A well-posed test: no near-tie at the top k + 1.
      assert np.min(-np.diff(logits[order[:k + 1]])) > 1e-3
      for kind, experts in (('first', order[:1]), ('all', order[:k])):
        for e in experts:
          out[kind]['lang'][(langs[b], int(e))] += 1
          out[kind]['token'][(str(ids_bt[b, t]), int(e))] += 1
  return out


def _AsCounter(table):
  return collections.Counter({(key, e): c for key, row in table.items()
                              for e, c in enumerate(row) if c})


def _CheckLayer(layer, ref, num_real, k):
  assert layer['real_tokens'] == num_real
  assert layer['dropped_choices'] == 0
  for kind in ('first', 'all'):
    counts = layer[kind]
    assert _AsCounter(counts['lang']) == ref[kind]['lang']
    assert _AsCounter(counts['token']) == ref[kind]['token']
    per_expert = collections.Counter()
    for (_, e), c in ref[kind]['lang'].items():
      per_expert[e] += c
    assert counts['expert'] == [per_expert[e] for e in range(E)]
    assert sum(counts['expert']) == num_real * (1 if kind == 'first' else k)


def test_mt_counts_equal_a_per_token_loop():
  """Both stacks' MoE layers (GShard top-2, inference: groups of one
  token); attention outputs zeroed, so an MoE layer's input is
  LN(emb * sqrt(M) + position) of its own token: routing is a known
  function of the embeddings and router weights the test sets."""
  p = mt_testlib.TinyParams(use_moe=True, num_encoder_layers=1,
                            num_decoder_layers=1, encoder_moe_layers=[0],
                            decoder_moe_layers=[0])
  task = p.cls.InferenceParams(p).Instantiate()
  theta = task.theta.Transform(lambda v: v.numpy())
  rng = np.random.default_rng(0)
  m = p.model_dim
  for side in ('src', 'tgt'):
    emb = theta[f'{side}_emb'].emb
    theta[f'{side}_emb'].emb = rng.normal(size=emb.shape).astype(np.float32)
  for stack in ('enc', 'dec'):
    layer = theta[stack].layer[0]
    for atten in ('self_atten', 'cross_atten'):
      if atten in layer:
        layer[atten].wo = np.zeros_like(layer[atten].wo)
    layer.moe.wg = rng.normal(scale=3.0, size=[m, E]).astype(np.float32)
  batch = mt_testlib.SyntheticBatch(p, batch_size=4, src_len=7, tgt_len=6,
                                    src_lengths=[7, 3, 5, 2],
                                    tgt_lengths=[6, 4, 2, 5])
  batch.lang = tf.constant(LANGS)
  usage = expert_usage.CountUsage(task, theta.Transform(tf.constant),
                                  [batch, batch])
  assert usage['examples'] == 8 and usage['batches'] == 2
  assert list(usage['layers']) == ['enc/layer_000/moe', 'dec/layer_000/moe']
  for stack, side in (('enc', 'src'), ('dec', 'tgt')):
    ids = batch[side].ids.numpy()
    real = batch[side].paddings.numpy() == 0
    x = (theta[f'{side}_emb'].emb[ids] * np.sqrt(m) +
         task.pos_emb.FProp(None, seq_length=ids.shape[1]).numpy()[None])
    ln = theta[stack].layer[0].ffn_ln
    inputs = _LayerNorm(x, ln.scale, ln.bias, 1e-6)
    ref = _Reference(inputs, theta[stack].layer[0].moe.wg, real, ids, LANGS,
                     2)
    for kind in ref.values():  # The same batch twice.
      for table in kind.values():
        table.update(dict(table))
    layer = usage['layers'][f'{stack}/layer_000/moe']
    assert layer['tokens'] == side and layer['gate'] == 'MoELayer'
    _CheckLayer(layer, ref, 2 * int(real.sum()), 2)
    assert sorted(layer['all']['lang']) == ['de', 'fr', 'ja']


def test_lm_groups_across_rows_map_back_to_tokens():
  """An LM whose MoE (noisy top-2, 3 groups of 4 of the 2 x 6 tokens: a
  group spans two rows) sees the embedding itself (LSTM weights 0 output
  0, added by the residual); no `lang`: every token counts under 'all'."""
  moe = noisy_top_k.NoisyTopKMoELayer.Params().Set(
      num_experts=E, num_experts_per_token=2, hidden_dim=8, num_groups=3,
      capacity_factor=None, eval_capacity_factor=None,
      output_activation='sigmoid')
  p = lm_model.LMTask.Params().Set(name='lm', vocab_size=11, model_dim=8,
                                   moe_tpl=moe)
  task = p.cls.InferenceParams(p).Instantiate()
  theta = task.theta.Transform(lambda v: v.numpy())
  rng = np.random.default_rng(1)
  for lstm in theta.lstm_before + theta.lstm_after:
    for name in lstm:
      lstm[name] = np.zeros_like(lstm[name])
  theta.emb.emb = rng.normal(size=theta.emb.emb.shape).astype(np.float32)
  theta.moe.wg = rng.normal(scale=3.0, size=[8, E]).astype(np.float32)
  ids = np.array([[1, 5, 7, 3, 0, 0], [1, 9, 4, 6, 10, 2]], np.int32)
  pad = (ids == 0).astype(np.float32)
  batch = NestedMap(ids=tf.constant(ids), labels=tf.constant(ids),
                    paddings=tf.constant(pad))
  usage = expert_usage.CountUsage(task, theta.Transform(tf.constant),
                                  [batch])
  layer = usage['layers']['moe']
  assert layer['tokens'] == 'ids' and layer['gate'] == 'NoisyTopKMoELayer'
  ref = _Reference(theta.emb.emb[ids], theta.moe.wg, pad == 0, ids,
                   ['all', 'all'], 2)
  _CheckLayer(layer, ref, int((pad == 0).sum()), 2)
  text = expert_usage.FormatTable(usage, min_count=1).split('\n')
  assert text[0].startswith('moe (NoisyTopKMoELayer, 4 experts, top-2; '
                            'input tokens): 10 real tokens, 20 dispatched')
  # One language: a line per expert (shares, then tokens).
  assert len(text) == 3 + E
  assert text[2].split() == ['expert', 'first', 'all', 'top', 'tokens', 'by',
                             'lift', '(count)']


def test_expert_choice_has_no_first_choice():
  """Expert choice (K = E, choice k is expert k): no first choice, so
  `first` is None and the table uses every dispatched choice."""
  moe = expert_choice.ExpertChoiceMoELayer.Params().Set(
      num_experts=E, hidden_dim=8, num_groups=1)
  p = lm_model.LMTask.Params().Set(name='lm', vocab_size=11, model_dim=8,
                                   moe_tpl=moe, allow_noncausal_routing=True)
  task = p.cls.InferenceParams(p).Instantiate()
  ids = np.array([[1, 5, 7, 3, 0, 0], [1, 9, 4, 6, 10, 2]], np.int32)
  pad = (ids == 0).astype(np.float32)
  batch = NestedMap(ids=tf.constant(ids), labels=tf.constant(ids),
                    paddings=tf.constant(pad))
  usage = expert_usage.CountUsage(task, task.theta, [batch])
  layer = usage['layers']['moe']
  assert layer['first'] is None and layer['choices_per_token'] is None
  # Each expert picks C = cf x S / E = 2 x 12 / 4 = 6 of the group's 10
  # real tokens.
  assert layer['all']['expert'] == [6] * E and layer['real_tokens'] == 10
  assert '0' not in layer['all']['token']  # Padding is never picked.
  text = expert_usage.FormatTable(usage).split('\n')
  assert text[0].startswith('moe (ExpertChoiceMoELayer, 4 experts; input '
                            'tokens): 10 real tokens, 24 dispatched')
  assert text[1].startswith('  by all choice: I(expert; token) = ')
  assert text[3].split()[:3] == ['0', '-', '25.0%']


def _ToolFlags(*args):
  fv = flags.FlagValues()
  expert_usage.DefineFlags(fv)
  fv(['expert_usage'] + list(args))
  return fv


SMALL = ['task.num_encoder_layers=1', 'task.num_decoder_layers=1',
         'task.encoder_moe_layers=[0]', 'task.decoder_moe_layers=[0]',
         'task.model_dim=32', 'task.hidden_dim=32', 'task.num_heads=2',
         'task.dim_per_head=16']


@pytest.fixture(name='run', scope='module')
def RunFixture(prepared_dir, tmp_path_factory):
  """(logdir, --params_override, --eval_params_override) of m4.TinyMoE
  (shrunk) trained 2 steps by the trainer on the prepared corpus."""
  logdir = str(tmp_path_factory.mktemp('moe_run'))
  override = ';'.join(trainer_testlib.CorpusOverrides(prepared_dir, 16, 8) +
                      SMALL)
  trainer.Execute(trainer_testlib.ParseFlags(
      '--model=m4.TinyMoE', f'--logdir={logdir}', '--max_steps=2',
      f'--params_override={override}'), printer=lambda _: None)
  dev = f"input.file_pattern='{prepared_dir}/dev_unseen_en.tsv'"
  return logdir, override, dev


def test_cli_on_a_trained_checkpoint(run, tmp_path):
  logdir, override, dev = run
  out = str(tmp_path / 'usage.json')
  lines = []
  usage = expert_usage.Main(_ToolFlags(
      '--model=m4.TinyMoE', f'--logdir={logdir}', '--max_batches=2',
      f'--params_override={override}', f'--eval_params_override={dev}',
      f'--json={out}'), printer=lines.append)
  with open(out, encoding='utf-8') as f:
    assert json.load(f) == usage
  assert usage['step'] == 2 and usage['split'] == 'dev_unseen_en'
  # The same two batches, read by the trainer's dev input.
  params, _ = trainer.BuildParams(trainer_testlib.ParseFlags(
      '--model=m4.TinyMoE', f'--params_override={override}',
      f'--eval_params_override={dev}'), 'Dev', for_eval=True)
  batches = list(params.input.Instantiate().GetDataset().take(2))
  langs = {x.decode() for b in batches for x in b.lang.numpy()}
  assert len(langs) > 1  # A row of languages per expert in the table.
  assert usage['examples'] == sum(len(b.lang) for b in batches)
  for name, side in (('enc/layer_000/moe', 'src'), ('dec/layer_000/moe',
                                                    'tgt')):
    layer = usage['layers'][name]
    real = int(sum((b[side].paddings.numpy() == 0).sum() for b in batches))
    assert layer['real_tokens'] == real and layer['dropped_choices'] == 0
    assert layer['choices_per_token'] == 2 and layer['num_experts'] == 8
    for kind, k in (('first', 1), ('all', 2)):
      counts = layer[kind]
      assert sum(counts['expert']) == real * k
      assert set(counts['lang']) == langs
      for table in ('lang', 'token'):
        assert np.sum(list(counts[table].values()), axis=0).tolist() == (
            counts['expert'])
    assert set(usage['pieces'][side]) == set(layer['all']['token'])
  text = lines[0].split('\n')
  assert text[0] == (f'm4.TinyMoE step 2, split dev_unseen_en: '
                     f'{usage["examples"]} examples in 2 batches')
  # Per layer: a header, the information line, column titles, 2 lines
  # per expert.
  assert len(text) == 1 + 2 * (3 + 2 * 8)
  enc, dec = text[1], text[1 + 3 + 16]
  assert enc.startswith('enc/layer_000/moe (MoELayer, 8 experts, top-2; '
                        'source tokens): ')
  assert dec.startswith('dec/layer_000/moe (MoELayer, 8 experts, top-2; '
                        'target (decoder input) tokens): ')
  assert text[2].startswith('  by first choice: I(expert; language) = ')
  assert text[3].split() == ['expert', 'first', 'all', 'top', 'languages',
                             '/', 'tokens', 'by', 'lift', '(count)']
  rows = [text[4 + 2 * e].split() for e in range(8)]
  assert [r[0] for r in rows] == [str(e) for e in range(8)]
  shares = [float(r[2].rstrip('%')) for r in rows]
  assert abs(sum(shares) - 100.0) < 0.5
  assert lines[1] == f'wrote {out}'


def _Error(*args):
  with pytest.raises(SystemExit) as e:
    expert_usage.Main(_ToolFlags(*args), printer=lambda _: None)
  return e.value.code


def test_errors_are_one_line(tmp_path):
  assert _Error('--model=m4.TinyDense', f'--logdir={tmp_path}') == (
      'expert_usage: error: m4.TinyDense has no MoE layer')
  assert _Error('--model=m4.TinyMoE', f'--logdir={tmp_path}') == (
      'expert_usage: error: no checkpoint in '
      f'{os.path.join(tmp_path, "train")}; train first')
  assert _Error('--model=gpipe.TinyMoEPipelined', f'--logdir={tmp_path}') == (
      'expert_usage: error: model/dec/pipeline runs MoE layers inside a '
      'GPipe pipeline, whose routing cannot be recorded '
      '(layers/moe/record.py); use the same model without pipeline_tpl')
  assert _Error('--model=m4.TinyMoE') == (
      'expert_usage: error: --logdir is required: the training run to read')
