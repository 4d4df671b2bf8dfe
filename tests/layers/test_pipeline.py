"""PipelinedLayer (GPipe §2): parity with the plain stack, errors, SPMD."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.layers import dropout
from lingshard.layers import pipeline
from lingshard.layers import transformer
from lingshard.nested_map import NestedMap
from lingshard.spmd import check
from tests.layers import pipeline_testlib

_B, _T, _M, _L = 8, 3, 4, 5
_STEP = 7


def _Inputs():
  rng = np.random.RandomState(0)
  x = rng.normal(size=[_B, _T, _M]).astype(np.float32)
  pad = (rng.rand(_B, _T) < 0.25).astype(np.float32)
  ctx = rng.normal(size=[_B, _M]).astype(np.float32)
  cot = rng.normal(size=[_B, _T, _M]).astype(np.float32)
  return x, pad, ctx, cot


def _Params(num_stages=1, num_micro_batches=1, remat=False, bn=False,
            **kwargs):
  return pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=_L, num_stages=num_stages,
      num_micro_batches=num_micro_batches, remat=remat,
      body_tpl=pipeline_testlib.MlpBody.Params().Set(
          dim=_M, dropout_prob=0.3, batch_norm=bn), **kwargs)


def _Loss(y, aux, cot):
  return tf.reduce_sum(y * cot) + aux.aux_loss + aux.metrics.h_mean


def _Pipelined(layer):
  """(loss, aux, per-layer gradients) of the pipelined FProp."""
  x, pad, ctx, cot = _Inputs()
  theta = layer.theta

  @tf.function(autograph=False)
  def Fn():
    with tf.GradientTape() as tape:
      y, aux = layer.FProp(theta, x, pad, ctx, step=tf.constant(_STEP))
      loss = _Loss(y, aux, cot)
    grads = tape.gradient(loss, theta, unconnected_gradients='zero')
    return loss, aux, grads

  loss, aux, grads = Fn()
  return loss, aux, layer.LayerThetas(grads)


def _Plain(layer, num_micro_batches=1):
  """The same L layers one after another on each micro-batch in turn.

  Micro-batch m is rows m * B/M ... (m + 1) * B/M - 1 (pipeline.py's
  blocks; one data shard).
  """
  x, pad, ctx, cot = _Inputs()
  theta = layer.theta
  size = _B // num_micro_batches
  with tf.GradientTape() as tape:
    ys, aux_losses, h_means, moments = [], [], [], []
    for m in range(num_micro_batches):
      rows = slice(m * size, (m + 1) * size)
      h, aux_loss, h_mean, mb_moments = x[rows], 0.0, 0.0, []
      for index, layer_theta in enumerate(layer.LayerThetas(theta)):
        with dropout.KeyedMasks(index, m * size):
          h, aux = layer.body.FProp(layer_theta, h, pad[rows], ctx[rows],
                                    step=tf.constant(_STEP))
        aux_loss += aux.aux_loss
        h_mean += aux.metrics.h_mean / _L
        mb_moments.append(aux.get('moments'))
      ys.append(h)
      aux_losses.append(aux_loss)
      h_means.append(h_mean)
      moments.append(mb_moments)
    aux = NestedMap(aux_loss=tf.add_n(aux_losses) / num_micro_batches,
                    metrics=NestedMap(h_mean=tf.add_n(h_means) /
                                      num_micro_batches))
    y = tf.concat(ys, 0)
    loss = _Loss(y, aux, cot)
  grads = tape.gradient(loss, theta, unconnected_gradients='zero')
  return loss, aux, layer.LayerThetas(grads), moments


_PLAIN = {}


def _PlainOnce():
  """The unpipelined reference (K=1, M=1); weights do not depend on K."""
  if 'ref' not in _PLAIN:
    _PLAIN['ref'] = _Plain(_Params().Instantiate())
  return _PLAIN['ref']


def _AssertGradsClose(got, want, num_layers=_L):
  assert len(got) == len(want) == num_layers
  for g_layer, w_layer in zip(got, want):
    for (key, g), (_, w) in zip(g_layer.FlattenItems(), w_layer.FlattenItems()):
      # float32: summation order differs between the two programs.
      scale = max(1.0, float(np.abs(w.numpy()).max()))
      np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-4,
                                 atol=2e-5 * scale, err_msg=key)


@pytest.mark.parametrize('num_stages,num_micro_batches,remat', [
    (1, 1, False), (1, 8, False), (2, 2, True), (2, 4, False), (4, 1, True),
    (4, 2, False)])
def test_pipelined_stack_equals_plain_stack_with_dropout(
    num_stages, num_micro_batches, remat):
  layer = _Params(num_stages, num_micro_batches, remat).Instantiate()
  loss, aux, grads = _Pipelined(layer)
  want_loss, want_aux, want_grads, _ = _PlainOnce()
  np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
  np.testing.assert_allclose(aux.aux_loss.numpy(), want_aux.aux_loss.numpy(),
                             rtol=1e-5)
  np.testing.assert_allclose(aux.metrics.h_mean.numpy(),
                             want_aux.metrics.h_mean.numpy(), rtol=1e-5)
  _AssertGradsClose(grads, want_grads)


def test_batch_norm_uses_micro_batch_statistics_and_returns_batch_moments():
  layer = _Params(2, 2, remat=True, bn=True).Instantiate()
  loss, aux, grads = _Pipelined(layer)
  want_loss, want_aux, want_grads, moments = _Plain(layer, 2)
  np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
  np.testing.assert_allclose(aux.aux_loss.numpy(), want_aux.aux_loss.numpy(),
                             rtol=1e-5)
  _AssertGradsClose(grads, want_grads)
  # Layer 0's batch-norm input does not depend on the micro-batching: the
  # accumulated moments are numpy's mean/var over the whole mini-batch.
  x, pad, ctx, _ = _Inputs()
  body, theta0 = layer.body, layer.LayerThetas(layer.theta)[0]
  with dropout.KeyedMasks(0, 0):
    h = body.dropout.FProp(None, body.fc.FProp(theta0.fc, x + ctx[:, None]),
                           step=tf.constant(_STEP)).numpy()
  keep = h[pad == 0]
  assert len(aux.moments) == _L
  np.testing.assert_allclose(aux.moments[0].count.numpy(), keep.shape[0])
  np.testing.assert_allclose(aux.moments[0].mean.numpy(), keep.mean(0),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(
      (aux.moments[0].m2 / aux.moments[0].count).numpy(), keep.var(0),
      rtol=1e-4, atol=1e-5)
  # Every layer's moments: the exact union of its micro-batch moments.
  for index in range(_L):
    parts = [mb[index] for mb in moments]
    count = sum(float(p.count) for p in parts)
    mean = sum(p.count.numpy() * p.mean.numpy() for p in parts) / count
    m2 = sum(p.m2.numpy() + p.count.numpy() * (p.mean.numpy() - mean)**2
             for p in parts)
    np.testing.assert_allclose(aux.moments[index].mean.numpy(), mean,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(aux.moments[index].m2.numpy(), m2, rtol=1e-4,
                               atol=1e-4)


def test_unequal_cells_run_padded_and_inference_runs_unpipelined():
  layer = _Params(3, 2, stage_splits=[1, 3, 1]).Instantiate()
  assert layer.StageSplits() == [1, 3, 1]
  # Stacked [K, S, ...] with S = 3 slots; padded slots count as params.
  assert layer.theta.fc.w.shape == (3, 3, _M, 8)
  loss, _, grads = _Pipelined(layer)
  want_loss, _, want_grads, _ = _PlainOnce()
  np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
  _AssertGradsClose(grads, want_grads)
  x, pad, ctx, _ = _Inputs()
  infer = _Params(2, 2, is_inference=True).Instantiate()
  y, _ = infer.FProp(infer.theta, x, pad, ctx)
  h = x
  for layer_theta in infer.LayerThetas(infer.theta):
    h, _ = infer.body.FProp(layer_theta, h, pad, ctx)
  np.testing.assert_allclose(y.numpy(), h.numpy(), rtol=1e-6)


def test_bad_configs_are_one_line_errors_naming_both_numbers():
  layer = _Params(2, 3).Instantiate()
  x, pad, ctx, _ = _Inputs()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: num_micro_batches 3 does not divide the batch 8; use a '
      r'divisor of 8$')):
    layer.FProp(layer.theta, x, pad, ctx)
  layer = _Params(2, micro_batch_size=3, num_micro_batches=None).Instantiate()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: micro_batch_size 3 does not divide the batch 8; use a '
      r'divisor of 8$')):
    layer.FProp(layer.theta, x, pad, ctx)
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: num_stages 4 does not fit the mesh axis stage of size 2; '
      r'set num_stages to 2$')):
    _Params(4, 2, stage_mesh_axis='stage', device_mesh=np.arange(8).reshape(
        4, 2), mesh_axis_names=['data', 'stage']).Instantiate()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: set exactly one of num_micro_batches \(2\) and '
      r'micro_batch_size \(4\)$')):
    _Params(2, 2, micro_batch_size=4).Instantiate()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: stage_splits \[2, 2\] must be 2 counts >= 1 summing to '
      r'num_layers 5$')):
    _Params(2, 2, stage_splits=[2, 2]).Instantiate()
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: num_stages 6 exceeds num_layers 5; use at most 5 stages$')):
    _Params(6, 2).Instantiate()


@pytest.mark.parametrize('mesh,batch_axis', [((4,), None), ((2, 4), 0)])
def test_stage_split_shifts_with_collective_permute(mesh, batch_axis):
  """Stages over the last mesh axis; on 2 x 4 the batch over data (axis 0).

  Micro-batches are rows i::M, so a data-split batch forms them without
  moving data: only the stage shifts and all-reduces communicate.
  """
  stage_axis = len(mesh) - 1
  p = _Params(4, 2, remat=True, stage_mesh_axis=stage_axis,
              batch_mesh_axis=batch_axis).Set(num_layers=4)
  x, pad, ctx, _ = _Inputs()
  split = None
  if batch_axis is not None:
    split = [[0, -1, -1], [0, -1], [0, -1]]
  r = check.CheckLayerParams(
      p, mesh, [x, pad, ctx], fprop_kwargs={'step': np.int32(_STEP)},
      input_split_dims_mapping=split,
      expect=['has:collective-permute', 'only:collective-permute,all-reduce',
              'no-all-gather:stack/w_fc__w', 'no-all-gather:stack/w_out__w'])
  assert r.ok, r.Report()
  # The stacked weights [K, S, ...]: K split 4 ways (replicated over data).
  want = ('{devices=[4,1,1,1]' if len(mesh) == 1 else
          '{devices=[4,1,1,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}')
  assert r.input_shardings['theta.layer.fc.w'].startswith(want)


def test_remat_program_keeps_less_in_memory():
  x, pad, ctx, _ = _Inputs()
  temp = {}
  for remat in (False, True):
    p = _Params(1, 2, remat=remat).Set(num_layers=2)
    p.body_tpl.hidden = 64
    r = check.CheckLayerParams(p, (1,), [x, pad, ctx], compare=False)
    temp[remat] = r.memory['temp']
  assert temp[True] < temp[False], temp


def test_pipelined_transformer_decoder_layers_equal_the_plain_loop():
  """TransformerLayer as the body, the encoder output as per-example extras."""
  body = transformer.TransformerLayer.Params().Set(
      model_dim=8, hidden_dim=16, num_heads=2, dim_per_head=4,
      is_decoder=True, residual_dropout_prob=0.2, atten_dropout_prob=0.2,
      relu_dropout_prob=0.2)
  layer = pipeline.PipelinedLayer.Params().Set(
      name='dec', body_tpl=body, num_layers=2, num_stages=2,
      num_micro_batches=2, remat=True).Instantiate()
  rng = np.random.RandomState(1)
  x = rng.normal(size=[4, 3, 8]).astype(np.float32)
  pad = np.zeros([4, 3], np.float32)
  enc = rng.normal(size=[4, 5, 8]).astype(np.float32)
  enc_pad = (rng.rand(4, 5) < 0.3).astype(np.float32)
  theta = layer.theta

  @tf.function(autograph=False)
  def Pipelined():
    with tf.GradientTape() as tape:
      y, _ = layer.FProp(theta, x, pad, enc, enc_pad, step=tf.constant(3))
      loss = tf.reduce_sum(y * y)
    return loss, tape.gradient(loss, theta)

  with tf.GradientTape() as tape:
    h = x
    for index, layer_theta in enumerate(layer.LayerThetas(theta)):
      with dropout.KeyedMasks(index, 0):
        h, _ = layer.body.FProp(layer_theta, h, pad, enc, enc_pad,
                                step=tf.constant(3))
    want_loss = tf.reduce_sum(h * h)
  want = tape.gradient(want_loss, theta)
  loss, grads = Pipelined()
  np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
  _AssertGradsClose(layer.LayerThetas(grads), layer.LayerThetas(want), 2)


def test_layers_of_different_shapes_run_padded_to_the_widest():
  """A list of body params (FFN hidden 4 ... 16): each layer computes its
  own function on its own weights, split by its own cost."""
  hidden = [4, 4, 4, 4, 16]
  tpls = [pipeline_testlib.MlpBody.Params().Set(dim=_M, hidden=h)
          for h in hidden]
  layer = pipeline.PipelinedLayer.Params().Set(
      name='stack', num_layers=_L, num_stages=2, num_micro_batches=2,
      remat=True, body_tpl=tpls).Instantiate()
  # Costs 2 x (9H + 4) = 80 x 4 and 296: by cost [4, 1] (max 320), not the
  # equal-count [3, 2] (max 376).
  assert layer.StageSplits() == [4, 1]
  assert layer.theta.fc.w.shape == (2, 4, _M, 16)
  own = [t.Copy().Set(name='own').Instantiate() for t in tpls]
  x, pad, ctx, cot = _Inputs()
  theta = layer.theta

  def Own(index, layer_theta):
    """Layer index's weights, unpadded to its own shapes."""
    return own[index].theta.Pack([
        w[tuple(slice(0, n) for n in mine.shape)] for w, mine in zip(
            layer_theta.Flatten(), own[index].theta.Flatten())])

  with tf.GradientTape() as tape:
    h = x
    for index, layer_theta in enumerate(layer.LayerThetas(theta)):
      h, _ = own[index].FProp(Own(index, layer_theta), h, pad, ctx)
    want_loss = tf.reduce_sum(h * cot)
  want = tape.gradient(want_loss, theta, unconnected_gradients='zero')

  @tf.function(autograph=False)
  def Pipelined():
    with tf.GradientTape() as tape:
      y, _ = layer.FProp(theta, x, pad, ctx)
      loss = tf.reduce_sum(y * cot)
    return loss, tape.gradient(loss, theta, unconnected_gradients='zero')

  loss, grads = Pipelined()
  np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
  _AssertGradsClose(layer.LayerThetas(grads), layer.LayerThetas(want))
  # The padded hidden units of the narrow layers stay zero: zero gradients.
  fc_w = layer.LayerThetas(grads)[0].fc.w.numpy()
  assert fc_w.shape == (_M, 16) and not fc_w[:, 4:].any()


def test_layers_of_different_weight_structures_are_refused():
  tpls = [pipeline_testlib.MlpBody.Params().Set(dim=_M, batch_norm=bn)
          for bn in (False, True)]
  with pytest.raises(pipeline.PipelineError, match=(
      r'^stack: the body_tpl layers differ in their weights or weight ranks; '
      r'a pipeline stacks one weight structure$')):
    pipeline.PipelinedLayer.Params().Set(
        name='stack', num_layers=2, num_stages=2, num_micro_batches=1,
        body_tpl=tpls).Instantiate()
