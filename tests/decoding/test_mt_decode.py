"""Decoding the MT model: incremental steps equal the full forward pass
(standard and flat layouts, dense and MoE), flat beam equals standard beam,
greedy is self-consistent."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.decoding import flat_beam_search
from lingshard.models import mt_decoder
from lingshard.models import mt_model
from tests.models import mt_testlib


def _Tasks(use_moe):
  """(training task, decoding task sharing its theta)."""
  p = mt_testlib.TinyParams(use_moe=use_moe, residual_dropout_prob=0.1)
  train = p.Instantiate()
  return train, mt_model.TransformerMTModel.InferenceParams(p).Instantiate()


def _FullLogProbs(task, theta, batch):
  logits = task.ComputePredictions(theta, batch).logits
  return tf.nn.log_softmax(logits).numpy()


@pytest.mark.parametrize('use_moe', [False, True])
def test_incremental_steps_equal_full_forward(use_moe):
  train, task = _Tasks(use_moe)
  theta = train.theta
  batch = mt_testlib.SyntheticBatch(task.params, tgt_len=5,
                                    tgt_lengths=[5, 5, 5])
  want = _FullLogProbs(task, theta, batch)
  enc, _ = task.Encode(theta, batch.src.ids, batch.src.paddings)
  step_fn, states = task.DecoderStepFn(theta, enc, batch.src.paddings, 1, 5,
                                       flat=False)
  for t in range(5):
    logp, states = step_fn(batch.tgt.ids[:, t], tf.constant(t), states)
    np.testing.assert_allclose(logp.numpy(), want[:, t], atol=1e-4)


@pytest.mark.parametrize('use_moe', [False, True])
def test_flat_steps_equal_full_forward_per_hypothesis(use_moe):
  # k = 3 hypotheses per sentence follow 3 different target sequences;
  # each attends only to its own tokens in the interleaved flat sequence.
  train, task = _Tasks(use_moe)
  theta, b, k, length = train.theta, 2, 3, 4
  base = mt_testlib.SyntheticBatch(task.params, batch_size=b)
  seqs = [mt_testlib.SyntheticBatch(task.params, batch_size=b, tgt_len=length,
                                    tgt_lengths=[length] * b, seed=10 + j)
          for j in range(k)]
  want = []
  for seq in seqs:
    seq.src = base.src
    want.append(_FullLogProbs(task, theta, seq))
  enc, _ = task.Encode(theta, base.src.ids, base.src.paddings)
  step_fn, states = task.DecoderStepFn(theta, enc, base.src.paddings, k,
                                       length, flat=True)
  own = np.zeros([b, k, k * length], np.float32)
  for t in range(length):
    ids = tf.stack([s.tgt.ids[:, t] for s in seqs], axis=1)
    for j, pos in enumerate(flat_beam_search.StepPositions(t, k).numpy()):
      own[:, j, pos] = 1.0
    logp, states = step_fn(ids, tf.constant(t), tf.constant(own), states)
    for j in range(k):
      np.testing.assert_allclose(logp.numpy()[:, j], want[j][:, t],
                                 atol=1e-4)


@pytest.mark.parametrize('use_moe', [False, True])
def test_flat_beam_equals_standard_beam(use_moe):
  train, task = _Tasks(use_moe)
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=3)
  out = {}
  for flat in (False, True):
    out[flat] = task.Decode(train.theta, batch.src.ids, batch.src.paddings,
                            beam_size=3, max_decode_len=6,
                            length_norm_alpha=0.6, flat_beam=flat)
  for key in ('topk_ids', 'topk_lengths'):
    np.testing.assert_array_equal(out[False][key], out[True][key])
  np.testing.assert_allclose(out[False].topk_scores, out[True].topk_scores,
                             rtol=1e-4)


def test_beam_scores_are_length_normalised_log_probs():
  train, task = _Tasks(False)
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=2)
  out = task.Decode(train.theta, batch.src.ids, batch.src.paddings,
                    beam_size=2, max_decode_len=5, length_norm_alpha=0.8)
  for b in range(2):
    n = int(out.lengths[b])
    ids = np.zeros([1, 5], np.int32)
    ids[0, :n] = out.ids[b, :n]
    seq = mt_testlib.SyntheticBatch(task.params, batch_size=1, tgt_len=5,
                                    tgt_lengths=[5])
    seq.src.ids, seq.src.paddings = batch.src.ids[b:b + 1], batch.src.paddings[
        b:b + 1]
    inputs = np.concatenate([[[task.params.sos_id]], ids[:, :4]], axis=1)
    seq.tgt.ids = tf.constant(inputs, tf.int32)
    logp = _FullLogProbs(task, train.theta, seq)[0]
    total = sum(logp[t, ids[0, t]] for t in range(n))
    np.testing.assert_allclose(out.scores[b], total / ((5 + n) / 6)**0.8,
                               rtol=1e-4)


def test_greedy_is_argmax_of_its_own_prefix():
  train, task = _Tasks(True)
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=2)

  @tf.function
  def Greedy(theta, ids, paddings):
    return task.Decode(theta, ids, paddings, beam_size=1, max_decode_len=5)

  out = Greedy(train.theta, batch.src.ids, batch.src.paddings)
  ids = out.ids.numpy()
  inputs = np.concatenate([np.full([2, 1], task.params.sos_id), ids[:, :4]],
                          axis=1)
  batch.tgt = mt_testlib.SyntheticBatch(task.params, batch_size=2, tgt_len=5,
                                        tgt_lengths=[5, 5]).tgt
  batch.tgt.ids = tf.constant(inputs, tf.int32)
  logp = _FullLogProbs(task, train.theta, batch)
  for b in range(2):
    n = int(out.lengths[b])
    np.testing.assert_array_equal(ids[b, :n], logp[b, :n].argmax(-1))
    assert not ids[b, n:].any()
    np.testing.assert_allclose(
        out.scores[b], sum(logp[b, t, ids[b, t]] for t in range(n)),
        rtol=1e-4)


def test_moe_decodes_without_drops():
  _, task = _Tasks(True)
  moe = task.dec.layer[1].moe
  assert moe.params.is_inference
  for tokens in (1, 3, 12, 40):
    g, s = moe.GroupShape(tokens)
    assert (g, s) == (tokens, 1) and moe.Capacity(s) >= s
  # A whole batch through the decoding task: nothing over capacity.
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=4, tgt_len=6)
  metrics, _ = task.FProp(task.theta, batch)
  for key in ('enc_layer_001', 'dec_layer_001'):
    assert float(metrics[f'{key}_frac_dispatched_2'][0]) == 1.0
    assert float(metrics[f'{key}_over_capacity_second'][0]) == 0.0


def test_decode_needs_an_inference_task():
  train, _ = _Tasks(False)
  batch = mt_testlib.SyntheticBatch(train.params)
  with pytest.raises(ValueError, match='Decode needs a task built with '
                     'is_inference=True'):
    train.Decode(train.theta, batch.src.ids, batch.src.paddings)


@pytest.mark.parametrize('beam_size', [1, 4])
def test_xla_compiled_search_equals_op_by_op(beam_size):
  """p.decode.jit (the decoder's default) compiles the whole search; it
  returns the hypotheses the op-by-op graph does (MoE model, with EOS)."""
  train, task = _Tasks(use_moe=True)
  batch = mt_testlib.SyntheticBatch(task.params, batch_size=3, seed=4)
  out = {}
  for jit in (False, True):
    fn = tf.function(lambda th, ids, pad: task.Decode(
        th, ids, pad, beam_size=beam_size, max_decode_len=7),
                     jit_compile=jit)
    out[jit] = fn(train.theta, batch.src.ids, batch.src.paddings)
  np.testing.assert_array_equal(out[True].ids.numpy(), out[False].ids.numpy())
  np.testing.assert_array_equal(out[True].lengths.numpy(),
                                out[False].lengths.numpy())
  np.testing.assert_allclose(out[True].scores.numpy(),
                             out[False].scores.numpy(), rtol=1e-5)
  assert task.params.decode.jit  # What the trainer's decoder uses.


def test_short_last_batch_decodes_as_alone_in_one_trace():
  """MtDecoder(batch_size=B) decodes a batch of fewer rows (an eval input's
  last) with its last row repeated up to B: the same hypotheses as decoding
  it alone, and one trace (one XLA compile) of the search for both sizes."""
  train, task = _Tasks(use_moe=True)
  traces = []
  decode = task.Decode

  def CountedDecode(*args, **kwargs):
    traces.append(args[1].shape[0])  # Python runs once per trace.
    return decode(*args, **kwargs)

  task.Decode = CountedDecode
  ids_text = lambda ids: ' '.join(str(int(i)) for i in ids)  # noqa: E731
  full = mt_testlib.SyntheticBatch(task.params, batch_size=5, seed=5)
  last = mt_testlib.SyntheticBatch(task.params, batch_size=3, seed=6,
                                   src_lengths=[6, 3, 2])
  padded = mt_decoder.MtDecoder(task, ids_text, ids_text, batch_size=5,
                                decode_kwargs=dict(max_decode_len=6))
  alone = mt_decoder.MtDecoder(task, ids_text, ids_text,
                               decode_kwargs=dict(max_decode_len=6))
  got = [padded.DecodeBatch(train.theta, b) for b in (full, last)]
  assert traces == [5]
  want = alone.DecodeBatch(train.theta, last)
  assert traces == [5, 3]
  assert [len(r) for r in got] == [5, 3]
  assert got[1] == want
  assert len({r.hypothesis for r in want}) > 1  # Not the copied row's.
