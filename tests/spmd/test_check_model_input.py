"""The checker on a model's real input: string leaves of the batch (MtInput's
`lang`) stay out of the XLA program, as in the trainer's step; a missing
corpus is one line naming the prepare command."""

import os

import numpy as np
import tensorflow as tf

from lingshard import base_input
from lingshard import model_registry
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from tests.spmd import spmd_testlib


def test_numeric_batch_drops_only_string_leaves():
  batch = NestedMap(
      src=NestedMap(ids=np.ones([2, 3], np.int32),
                    strs=np.array([b'a', b'b'], object)),
      lang=tf.constant(['de', 'fr']),
      names=np.array(['x', 'y']),
      tags=np.array([b'x', b'y']),
      inputs=[np.zeros([2], np.float32), np.array([b'q'], object)],
      step=tf.constant(3, tf.int64))
  out = base_input.NumericBatch(batch)
  assert [k for k, _ in out.FlattenItems()] == ['inputs[0]', 'src.ids',
                                                'step']
  assert out.src.ids is batch.src.ids and out.step is batch.step


def test_tiny_moe_real_batch_has_strings_that_stay_out_of_the_program(
    in_corpus_dir):
  del in_corpus_dir
  model = model_registry.GetParams('m4.TinyMoE', 'Train').Instantiate()
  batch = check.FirstBatch(model.GetInput())
  assert batch.lang.dtype == object  # The real input carries strings.
  r = check.CheckModel('m4.TinyMoE', 8,
                       expect=['only:all-to-all,all-reduce',
                               'no-all-gather:wi|wo'])
  assert r.ok, r.Report()
  inputs = [k for k in r.input_shardings if k.startswith('batch.')]
  assert sorted(inputs) == sorted(
      f'batch.{k}' for k, _ in base_input.NumericBatch(batch).FlattenItems())
  assert 'batch.lang' not in r.input_shardings


def test_cli_without_corpus_says_how_to_prepare(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert spmd_testlib.RunCli('--model=m4.TinyMoE', '--mesh=8') == (
      'spmd_check: error: no corpus file matches data/ui_m4/train.tsv; '
      'prepare the corpus with: python -m lingshard.data.prepare --out '
      'data/ui_m4')
  assert os.listdir(tmp_path) == []
