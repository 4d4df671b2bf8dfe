"""A pipeline's stacked weights keep one shape under another schedule or
stage split (L = 4, K = 2: fill-drain holds layers {0, 1} on stage 0,
Circular(R=2) {0, 2}): checkpoints record each pipeline's slot -> layer
map, and Restore / WarmStart refuse another layout in one line, before
anything is read; the same layout restores; a checkpoint without the
record (older runs) restores as before."""

import re

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import pipeline
from lingshard.layers import pipeline_schedule
from lingshard.train import checkpointer
from lingshard.train import state as state_lib
from tests.layers import pipeline_testlib

_FILL_DRAIN = [[0, 1], [2, 3]]
_CIRCULAR = [[0, 2], [1, 3]]


def _State(schedule, seed=1, stage_splits=None):
  task = pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=4, num_stages=2, num_micro_batches=2,
      schedule=schedule, random_seed=seed, stage_splits=stage_splits,
      body_tpl=pipeline_testlib.MlpBody.Params()).Instantiate()
  return state_lib.TrainState(task)


def _Circular():
  return pipeline_schedule.Circular.Params().Set(repeats=2)


def _Values(state):
  return [v.numpy() for v in state.theta.Flatten()]


def _RestoredZeroed(logdir, schedule):
  """A new state of `schedule`, its weights zeroed, restored from logdir:
  (state, Restore()'s answer)."""
  state = _State(schedule)
  for var in state.theta.Flatten():
    var.assign(tf.zeros_like(var))
  return state, checkpointer.Checkpointer(
      logdir, state, include_optimizer=False).Restore()


def test_another_pipeline_layout_is_refused_in_one_line(tmp_path):
  fill_drain = _State(pipeline_schedule.FillDrain.Params())
  fill_drain.step.assign(3)
  checkpointer.Checkpointer(str(tmp_path), fill_drain,
                            include_optimizer=False).Save(3)
  path = str(tmp_path / 'ckpt-3')
  reader = tf.train.load_checkpoint(path)
  np.testing.assert_array_equal(
      reader.get_tensor('layout/stack/.ATTRIBUTES/VARIABLE_VALUE'),
      _FILL_DRAIN)
  circular = _State(_Circular(), seed=2)
  assert [v.shape for v in circular.theta.Flatten()] == [
      v.shape for v in fill_drain.theta.Flatten()]  # Same shapes.
  before = _Values(circular)
  ckpt = checkpointer.Checkpointer(str(tmp_path), circular,
                                   include_optimizer=False)
  reason = (f"pipeline 'stack' holds layers {_FILL_DRAIN} in the checkpoint "
            f'but {_CIRCULAR} in the model (stage -> slot -> layer, -1 '
            'padding): another schedule or stage split would restore its '
            'layers permuted')
  with pytest.raises(checkpointer.CheckpointError, match='^' + re.escape(
      f'checkpoint {path} does not match the model: {reason}; resume with '
      'the layout it was trained with, or use a new logdir') + '$'):
    ckpt.Restore()
  with pytest.raises(checkpointer.CheckpointError, match='^' + re.escape(
      f'--init_from_checkpoint {path}: {reason}; start from it with the '
      'layout it was trained with') + '$'):
    ckpt.WarmStart(path)
  for got, want in zip(_Values(circular), before):  # Nothing was read.
    np.testing.assert_array_equal(got, want)
  assert int(circular.step.numpy()) == 0 and int(circular.seed.numpy()) == 2
  # The same layout restores, weight for weight.
  again, restored = _RestoredZeroed(str(tmp_path),
                                    pipeline_schedule.FillDrain.Params())
  assert restored == (3, False)
  for got, want in zip(_Values(again), _Values(fill_drain)):
    np.testing.assert_array_equal(got, want)


def test_another_stage_split_is_refused(tmp_path):
  """Fill-drain [1, 3] vs [3, 1]: both [2, 3] slots, padded differently."""
  checkpointer.Checkpointer(str(tmp_path), _State(
      pipeline_schedule.FillDrain.Params(), stage_splits=[1, 3]),
                            include_optimizer=False).Save(0)
  other = _State(pipeline_schedule.FillDrain.Params(), stage_splits=[3, 1])
  with pytest.raises(checkpointer.CheckpointError, match=re.escape(
      "pipeline 'stack' holds layers [[0, -1, -1], [1, 2, 3]] in the "
      'checkpoint but [[0, 1, 2], [3, -1, -1]] in the model')):
    checkpointer.Checkpointer(str(tmp_path), other,
                              include_optimizer=False).Restore()


def test_a_checkpoint_without_a_layout_record_restores(tmp_path):
  """Older checkpoints (no layout/ keys) restore as before, unchecked."""
  state = _State(_Circular())
  state.step.assign(5)
  state.layouts = {}  # Saved as a run before layouts were recorded.
  checkpointer.Checkpointer(str(tmp_path), state,
                            include_optimizer=False).Save(5)
  assert not [k for k in tf.train.list_variables(str(tmp_path / 'ckpt-5'))
              if k[0].startswith('layout/')]
  other, restored = _RestoredZeroed(str(tmp_path), _Circular())
  assert restored == (5, False)
  for got, want in zip(_Values(other), _Values(state)):
    np.testing.assert_array_equal(got, want)
