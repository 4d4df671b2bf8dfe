"""Export and decode batch and pad sentences differently, so an inference
task (TransformerMTModel.InferenceParams) must translate a sentence the
same whatever its batch neighbours and padding, including for GShard's random
second-expert policy (whose draws are keyed by a token's batch index)."""

import numpy as np
import pytest
import tensorflow as tf

from lingshard.models import mt_model
from tests.models import mt_testlib


@pytest.mark.parametrize('policy', ['random', 'sampling', 'all'])
def test_inference_output_independent_of_batch_and_padding(policy):
  p = mt_testlib.TinyParams(use_moe=True)
  p.moe_tpl.Set(num_experts=8, second_expert_policy=policy)
  train = p.Instantiate()
  task = mt_model.TransformerMTModel.InferenceParams(p).Instantiate()
  # Four sentences, then the same four reversed in a wider padded batch.
  batch = mt_testlib.SyntheticBatch(p, batch_size=4, src_len=7, seed=3,
                                    src_lengths=[7, 5, 6, 4])
  ids, paddings = batch.src.ids.numpy(), batch.src.paddings.numpy()
  wide_ids = np.zeros([4, 12], np.int32)
  wide_paddings = np.ones([4, 12], np.float32)
  wide_ids[:, :7], wide_paddings[:, :7] = ids[::-1], paddings[::-1]
  outs = []
  for i, pad in ((ids, paddings), (wide_ids, wide_paddings)):
    enc, _ = task.Encode(train.theta, tf.constant(i), tf.constant(pad))
    dec = task.Decode(train.theta, tf.constant(i), tf.constant(pad),
                      beam_size=3, max_decode_len=6)
    outs.append((enc.numpy(), dec.topk_scores.numpy(), dec.topk_ids.numpy()))
  (enc, scores, hyps), (wide_enc, wide_scores, wide_hyps) = outs
  real = paddings < 0.5
  np.testing.assert_allclose(enc[real], wide_enc[::-1, :7][real], atol=1e-5)
  np.testing.assert_allclose(scores, wide_scores[::-1], atol=1e-5)
  np.testing.assert_array_equal(hyps, wide_hyps[::-1])
