"""Which programs carry sharding annotations (sharding.Function).

The trainer's step on m4.TinyMoE, on the corpus prepared by
lingshard.data.prepare: traced op by op (no --jit) it holds no XlaSharding
op (each would run as an XLA program of its own); XLA-compiled (--jit, a
TPU replica function, the SPMD checker's export) it keeps them.
"""

import os

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from lingshard import base_input
from lingshard import model_registry
from lingshard import platform
from lingshard import sharding
from lingshard.spmd import check
from lingshard.train import step as step_lib
from lingshard.train import strategies
from lingshard.train import train_loop

MODEL = 'm4.TinyMoE'


def _Params(prepared_dir):
  params = model_registry.GetParams(MODEL, 'Train')
  vocab = os.path.join(prepared_dir, 'vocab', 'spm_shared.model')
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  params.input.Set(file_pattern=os.path.join(prepared_dir, 'train.tsv'),
                   src_vocab=vocab, tgt_vocab=vocab, bucket_upper_bounds=[16],
                   bucket_batch_limits=[8])
  params.task.Set(src_vocab_size=size, tgt_vocab_size=size)
  return params


def _OpTypes(concrete):
  """Op types of a concrete function's graph and of every function in its
  library (the step's nested functions and loops)."""
  graph_def = concrete.graph.as_graph_def()
  types = [n.op for n in graph_def.node]
  for fn in graph_def.library.function:
    types += [n.op for n in fn.node_def]
  return types


def _TrainerStepOps(params, tmp_path, jit):
  info = strategies.StrategyInfo(
      kind='default', program=platform.ForStrategy('default', jit))
  trainer = train_loop.Trainer(params, str(tmp_path), info=info,
                               printer=lambda _: None)
  batch = next(iter(trainer.model.GetInput().GetDataset()))
  return _OpTypes(trainer.run_step.get_concrete_function(
      base_input.NumericBatch(batch)))


def test_op_by_op_train_step_has_no_sharding_op(prepared_dir, tmp_path):
  ops = _TrainerStepOps(_Params(prepared_dir), tmp_path / 'graph', jit=False)
  assert ops.count('Einsum') > 10  # The real MoE step was traced.
  assert 'XlaSharding' not in ops


def test_jit_train_step_keeps_its_annotations(prepared_dir, tmp_path):
  ops = _TrainerStepOps(_Params(prepared_dir), tmp_path / 'jit', jit=True)
  # Every MoE and attention layer annotates its weights and activations.
  assert ops.count('XlaSharding') > 50


def test_tpu_replica_function_is_annotated(prepared_dir):
  """TPUStrategy compiles its replica function without jit_compile: the
  step traced with xla_compiled=True (the trainer's choice on 'tpu') keeps
  the annotations (xla_compiled=False: the op-by-op test above)."""
  params = _Params(prepared_dir)
  model = params.Instantiate()
  task = model.task
  batch = base_input.NumericBatch(next(iter(model.GetInput().GetDataset())))
  train_step = step_lib.TrainStep(task)
  theta = task.theta.Transform(lambda v: v.read_value())
  opt_state = train_step.InitOptState(theta)
  fn = sharding.Function(train_step.Pure, xla_compiled=True, autograph=False)
  ops = _OpTypes(fn.get_concrete_function(theta, opt_state, batch,
                                          tf.constant(0, tf.int64)))
  assert ops.count('XlaSharding') > 50


def test_spmd_check_export_is_annotated():
  def Fn(inputs):
    return {'y': sharding.split(inputs.x * 2.0, 0, 8)}

  result = check.CheckFunction(Fn, {'x': np.ones([8, 4], np.float32)}, [8],
                               compare=False)
  hlo = result.exported_hlo
  assert b'Sharding' in hlo  # The custom call's target, serialized.


def test_function_is_traced_in_its_own_context():
  def Annotated(x):
    return sharding.split(x, 0, 2)

  x = tf.ones([4, 2])
  # A caller's context does not decide: the Function's own choice does.
  with sharding.Unannotated():
    compiled = sharding.Function(Annotated, xla_compiled=True)
  plain = sharding.Function(Annotated, xla_compiled=False)
  assert 'XlaSharding' in _OpTypes(compiled.get_concrete_function(x))
  assert 'XlaSharding' not in _OpTypes(plain.get_concrete_function(x))
