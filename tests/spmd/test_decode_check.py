"""`spmd_check --mode=decode`: m4.TinyMoE's real decoding program (search
loop, incremental decoder and cache) partitioned over 8 virtual devices
gives the one-device program's hypotheses and scores; a partitioning error
in it is caught; compile_only reports its memory; bad input is one line."""

import os

import numpy as np
import pytest
import tensorflow as tf

from lingshard import model_registry
from lingshard import sharding
from lingshard.layers import base_layer
from lingshard.spmd import decode_task
from tests.spmd import spmd_testlib

_EXPECT = ['only:all-to-all,all-reduce', 'no-all-gather:wi|wo']


def test_tiny_moe_flat_beam_decode_matches_one_device_with_all_to_alls(
    in_corpus_dir):
  del in_corpus_dir
  r, what = decode_task.CheckDecode('m4.TinyMoE', 8, max_decode_len=6,
                                    expect=_EXPECT)
  assert r.ok, r.Report()
  assert what.startswith('decode: flat beam search k=4, at most 6 tokens; '
                         'Dev batch of 16 sentences x ')
  errors = {e.name: e for e in r.errors}
  assert sorted(errors) == ['ids', 'lengths', 'scores', 'topk_ids',
                            'topk_lengths', 'topk_scores']
  # Hypotheses are compared exactly, scores within float32 tolerance.
  assert errors['ids'].dtype == 'int32' and errors['ids'].rtol == 0.0
  assert errors['ids'].shape == (16, 6) and errors['ids'].max_abs == 0.0
  assert errors['scores'].dtype == 'float32' and errors['scores'].rtol > 0
  assert np.all(r.outputs['lengths'] >= 1)
  # The source batch is split over the 8 devices, experts too: the
  # encoder's and the decoder step's dispatch + combine are all-to-alls.
  assert r.input_shardings['src.ids'].startswith('{devices=[8,1]')
  assert 'devices=[8,1,1]' in r.input_shardings['theta.dec.layer[1].moe.wi']
  assert r.CollectiveCounts()['all-to-all'] == 4
  assert r.CollectiveCounts()['all-gather'] == 0


def _LocalRowOffset(mesh):
  """Adds each row's index WITHIN its shard to the hypotheses: a manual
  region's local index taken for the global one (a partitioning bug)."""

  def Fn(out):
    rows, length = out.ids.shape
    ids_l = sharding.auto_to_manual(out.ids, mesh, [0, -1])
    ids_l += tf.range(tf.shape(ids_l)[0])[:, tf.newaxis]
    out.ids = sharding.manual_to_auto(ids_l, mesh, [0, -1], [rows, length])
    return out

  return Fn


def test_a_hypothesis_changed_by_partitioning_fails_the_check(in_corpus_dir):
  del in_corpus_dir
  r, _ = decode_task.CheckDecode('m4.TinyMoE', 8, beam_size=1,
                                 max_decode_len=4,
                                 output_fn=_LocalRowOffset(np.arange(8)))
  assert not r.ok and r.matches is False
  bad = {e.name: e for e in r.errors if not e.ok}
  # 16 rows over 8 devices: the reference adds the row (0..15), the
  # partitioned program the row within its shard (0, 1): rows 2..15 differ
  # by up to 14 in every one of their 4 tokens.
  assert list(bad) == ['ids'] and bad['ids'].max_abs == 14.0
  assert bad['ids'].beyond == 14 * 4
  assert 'MISMATCH ids int32[16, 4]' in r.Report()
  assert r.Report().endswith('result: FAIL')


def test_compile_only_decode_reports_memory_without_data(tmp_path,
                                                         monkeypatch):
  monkeypatch.chdir(tmp_path)  # No data/: shapes only.
  r, what = decode_task.CompileDecode('m4.TinyMoE', beam_size=1,
                                      max_decode_len=4, expect=_EXPECT)
  assert r.ok and r.matches is None, r.Report()
  assert what == ('decode: greedy, at most 4 tokens; Dev batch of 16 '
                  'sentences x 64 source tokens (shapes only)')
  assert r.mesh_shape == (8,)
  # Per device: an eighth of the experts (TinyMoE: 1,048,576 of its
  # 2,090,752 weights), the rest replicated, in float32.
  assert r.memory['argument'] >= (2090752 - 1048576 * 7 // 8) * 4
  assert r.memory['argument'] < 2090752 * 4
  assert r.memory['temp'] > 0
  assert r.CollectiveCounts()['all-to-all'] == 4
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('args, message', [
    (['--model=m4.TinyMoE', '--mode=eval'],
     "spmd_check: error: --mode must be one of train, decode, got 'eval'"),
    (['--model=toy.FFRegression', '--mode=decode', '--mesh=8'],
     'spmd_check: error: toy.FFRegression: FeedForwardRegression has no decoder '
     '(BaseTask.CreateDecoder returns None); --mode=decode needs a task '
     'that decodes, e.g. a translation model'),
    (['--model=toy.FFRegression', '--mode=decode', '--compile_only'],
     'spmd_check: error: toy.FFRegression: task.device_mesh is None; '
     'compile_only compiles a config for its own mesh'),
    (['--model=m4.TinyMoE', '--mode=decode', '--compile_only',
      '--beam_size=0'],
     'spmd_check: error: beam_size and max_decode_len must be >= 1, got 0 '
     'and 48'),
])
def test_cli_bad_input_is_one_line(args, message, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert spmd_testlib.RunCli(*args) == message
  assert os.listdir(tmp_path) == []


def test_tpu_inference_of_expert_split_moe_uses_the_einsum_dispatch():
  """Sorted dispatch partitions by all-reducing each block's expert weights
  (no all-to-all): the TPU program of experts split over a mesh uses
  Algorithm 2 at inference; one device, or experts replicated, keeps it."""
  p = model_registry.GetParams('m4.TinyMoE', 'Train').task
  for platform, want in (('cpu', 'sorted'), ('tpu', 'einsum')):
    q = p.Copy()
    base_layer.ResolveParams(q, platform=platform)
    q = q.cls.InferenceParams(q)
    assert q.moe_tpl.dispatch_impl == want, platform
  replicated = p.Copy()
  replicated.moe_tpl.weight_split_dims_mapping.Set(wi=None, wo=None)
  base_layer.ResolveParams(replicated, platform='tpu')
  assert replicated.moe_tpl.inference_dispatch_impl == 'sorted'
  one_device = p.Copy()
  one_device.moe_tpl.device_mesh = np.arange(1)
  base_layer.ResolveParams(one_device, platform='tpu')
  assert one_device.moe_tpl.inference_dispatch_impl == 'sorted'
