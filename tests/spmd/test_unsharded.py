"""The checker's single-device reference (lingshard/spmd/unsharded.py): the
annotated program's HLO without its annotations is the program an
unannotated trace gives, value for value; programs with manual regions are
traced again instead."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard import sharding
from lingshard.spmd import check
from lingshard.spmd import unsharded
from lingshard.spmd import xla_runtime

_MESH = np.arange(8).reshape(2, 4)


def _Fn(x, w):
  """Annotations on inputs, intermediates, a gradient and the outputs
  (Sharding calls feed the root tuple)."""
  x = sharding.mesh_split(x, _MESH, [0, -1])
  w = sharding.mesh_split(w, _MESH, [-1, 1])
  with tf.GradientTape() as tape:
    tape.watch(w)
    h = sharding.mesh_split(tf.tanh(x @ w), _MESH, [0, 1])
    loss = tf.reduce_sum(h * h)
  dw = sharding.mesh_split(tape.gradient(loss, w), _MESH, [-1, 1])
  return [loss, sharding.replicate(dw)]


def _Hlo(args, annotated):
  fn = sharding.Function(_Fn, xla_compiled=True, jit_compile=True)
  if annotated:
    with sharding.SpmdPartitioning(8):
      return fn.experimental_get_compiler_ir(*args)(stage='hlo_serialized')
  with sharding.Unannotated():
    return fn.experimental_get_compiler_ir(*args)(stage='hlo_serialized')


def _Targets(serialized):
  module = xla_runtime.ParseHloModule(serialized)
  return [i.custom_call_target for c in module.computations
          for i in c.instructions if i.opcode == 'custom-call']


def _Shardings(serialized):
  module = xla_runtime.ParseHloModule(serialized)
  return [i.name for c in module.computations for i in c.instructions
          if i.HasField('sharding')]


def test_stripped_program_equals_the_unannotated_trace():
  rng = np.random.RandomState(0)
  values = [rng.normal(size=[8, 16]).astype(np.float32),
            rng.normal(size=[16, 12]).astype(np.float32)]
  args = [tf.constant(v) for v in values]
  annotated = _Hlo(args, annotated=True)
  assert _Targets(annotated).count('Sharding') >= 6
  assert not unsharded.HasManualRegions(annotated)
  stripped = unsharded.StripShardings(annotated)
  assert 'Sharding' not in _Targets(stripped)
  assert _Shardings(stripped) == []
  plain = _Hlo(args, annotated=False)
  assert _Targets(plain) == []
  shapes = [(), (16, 12)]
  got = xla_runtime.CompileSpmd(stripped, 1).Run(values, shapes)
  want = xla_runtime.CompileSpmd(plain, 1).Run(values, shapes)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  # And the partitioned program matches it (the checker's comparison).
  result = check.CheckFunction(
      lambda inp: dict(zip(['loss', 'dw'], _Fn(inp['x'], inp['w']))),
      {'x': values[0], 'w': values[1]}, [2, 4])
  result.AssertOk()
  np.testing.assert_allclose(result.outputs['loss'], want[0], rtol=1e-5)


def test_a_manual_region_is_found_and_not_stripped():
  def Manual(x):
    local = sharding.auto_to_manual(x, np.arange(8), [0, -1])
    return sharding.manual_to_auto(local * 2.0, np.arange(8), [0, -1],
                                   [8, 4])

  fn = sharding.Function(Manual, xla_compiled=True, jit_compile=True)
  with sharding.SpmdPartitioning(8):
    hlo = fn.experimental_get_compiler_ir(tf.ones([8, 4]))(
        stage='hlo_serialized')
  assert unsharded.HasManualRegions(hlo)
  with pytest.raises(ValueError, match=r'a manual region '
                     r'\(SPMDFullToShardShape\) is not an identity'):
    unsharded.StripShardings(hlo)
  # The checker traces it again without annotations: still compared.
  result = check.CheckFunction(lambda inp: {'y': Manual(inp['x'])},
                               {'x': np.arange(32, dtype=np.float32)
                                .reshape(8, 4)}, [8])
  result.AssertOk()
  np.testing.assert_array_equal(
      result.outputs['y'], 2.0 * np.arange(32).reshape(8, 4))
