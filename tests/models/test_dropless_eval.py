"""Dropless evaluation of m4.TinyMoE (random weights): the default eval task
(sorted dispatch) gives the padded-dropless log-perplexity, differs from
capacity factor 2.0 where tokens are dropped, and scores a sentence the
same whatever its batch neighbours."""

import numpy as np
import tensorflow as tf

from lingshard import model_registry
from tests.models import mt_testlib

BATCH, SRC_LEN, TGT_LEN = 8, 12, 10


def _TrainTaskParams():
  return model_registry.GetParams('m4.TinyMoE', 'Train').task


def _Theta(train_p, zero_router):
  task = train_p.Instantiate()
  theta = task.theta
  rng = np.random.RandomState(0)
  for name, v in theta.FlattenItems():
    if name.endswith('moe.wg') and zero_router:
      # All logits tie: every token wants experts 0 and 1 (top-2 of ties),
      # so capacity-limited groups drop choices deterministically.
      v.assign(tf.zeros_like(v))
    elif name.endswith('moe.wg'):
      v.assign(rng.normal(scale=0.3, size=v.shape).astype(np.float32))
  return theta


def _EvalTask(train_p, **moe):
  p = train_p.cls.InferenceParams(train_p)
  p.moe_tpl.Set(**moe)
  return p.Instantiate()


def _Variants(train_p):
  """name -> inference task: the default (sorted, one-token groups), the
  padded dropless ones (training-like groups, C = S; one-token groups
  with Algorithm 2's einsum) and capacity factor 2.0 on training groups."""
  groups = dict(num_groups=8, group_size=None)  # Training groups.
  return {
      'default': _EvalTask(train_p),
      'padded_dropless': _EvalTask(train_p, dispatch_impl='gather', **groups),
      'einsum_one_token': _EvalTask(train_p, dispatch_impl='einsum'),
      'sorted_groups': _EvalTask(train_p, dispatch_impl='sorted', **groups),
      'cf2': _EvalTask(train_p, dispatch_impl='gather',
                       eval_capacity_factor=2.0, **groups),
  }


def _Eval(task, theta, batch):
  preds = task.ComputePredictions(theta, batch)
  metrics, per_example = task.ComputeLoss(theta, preds, batch)
  dropped = sum(float(np.max(v[0].numpy())) for k, v in metrics.items()
                if k.endswith('over_capacity_by_choice'))
  return (float(metrics.log_pplx[0].numpy()), per_example.xent.numpy(),
          dropped)


def test_dropless_eval_log_pplx_equals_padded_and_differs_from_cf2():
  train_p = _TrainTaskParams()
  assert train_p.moe_tpl.eval_capacity_factor is None  # The default.
  batch = mt_testlib.SyntheticBatch(train_p, BATCH, SRC_LEN, TGT_LEN, seed=3)
  tasks = _Variants(train_p)
  assert tasks['default'].params.moe_tpl.dispatch_impl == 'sorted'
  for zero_router in (False, True):
    theta = _Theta(train_p, zero_router)
    res = {name: _Eval(task, theta, batch) for name, task in tasks.items()}
    for name in ('padded_dropless', 'einsum_one_token', 'sorted_groups'):
      np.testing.assert_allclose(res[name][0], res['default'][0], rtol=1e-5,
                                 err_msg=name)
      np.testing.assert_allclose(res[name][1], res['default'][1], rtol=1e-5,
                                 err_msg=name)
      assert res[name][2] == 0.0
    if zero_router:
      # 2 experts take every token: C = 2*2*S/8 = S/2 drops half.
      assert res['cf2'][2] > 0.3
      assert abs(res['cf2'][0] - res['default'][0]) > 1e-3


def test_eval_score_does_not_depend_on_batch_neighbours_by_default():
  train_p = _TrainTaskParams()
  theta = _Theta(train_p, zero_router=False)
  task = train_p.cls.InferenceParams(train_p).Instantiate()
  first, other = (mt_testlib.SyntheticBatch(train_p, BATCH, SRC_LEN,
                                            TGT_LEN, seed=seed)
                   for seed in (1, 2))
  # Row 0 of the first batch, among other neighbours.
  mixed = tf.nest.map_structure(
      lambda new, old: tf.concat([old[:1], new[1:]], 0), other, first)
  scores = [_Eval(task, theta, batch)[1] for batch in (first, mixed)]
  np.testing.assert_allclose(scores[1][0], scores[0][0], rtol=1e-5)
  assert np.abs(scores[1][1:] - scores[0][1:]).max() > 1e-3
