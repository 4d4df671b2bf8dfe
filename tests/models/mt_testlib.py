"""Tiny MT model params and synthetic batches in the lingshard.data layout."""

import numpy as np
import tensorflow as tf
from lingshard.models import mt_model
from lingshard.nested_map import NestedMap
from lingshard.layers.moe import top2


def TinyParams(use_moe=False, **kw):
  """A TransformerMTModel small enough for unit tests (2 + 2 layers)."""
  p = mt_model.TransformerMTModel.Params().Set(
      name='model', src_vocab_size=23, tgt_vocab_size=19, model_dim=16,
      hidden_dim=32, num_heads=2, dim_per_head=8, num_encoder_layers=2,
      num_decoder_layers=2, label_smoothing=0.1)
  if use_moe:
    # One group, dropless (C = S): room for every token, causal routing.
    p.moe_tpl = top2.MoELayer.Params().Set(num_experts=4, num_groups=1,
                                          capacity_factor=None,
                                          eval_capacity_factor=None)
  return p.Set(**kw)


def SyntheticBatch(task_params, batch_size=3, src_len=6, tgt_len=5, seed=0,
                   src_lengths=None, tgt_lengths=None):
  """A batch like lingshard.data.inputs.MtInput's (numpy -> tf tensors).

  src.ids end with EOS; tgt.ids start with BOS and tgt.labels are the ids
  shifted by one, ending with EOS; paddings mark positions past each length.
  """
  p = task_params
  rng = np.random.RandomState(seed)
  if src_lengths is None:
    src_lengths = rng.randint(2, src_len + 1, [batch_size])
  if tgt_lengths is None:
    tgt_lengths = rng.randint(2, tgt_len + 1, [batch_size])
  src_pad = (np.arange(src_len)[None] >= np.asarray(src_lengths)[:, None])
  tgt_pad = (np.arange(tgt_len)[None] >= np.asarray(tgt_lengths)[:, None])
  src = rng.randint(3, p.src_vocab_size, [batch_size, src_len])
  words = rng.randint(3, p.tgt_vocab_size, [batch_size, tgt_len + 1])
  words[:, 0] = p.sos_id
  for b, n in enumerate(tgt_lengths):
    words[b, n] = p.eos_id
  for b, n in enumerate(src_lengths):
    src[b, n - 1] = p.eos_id
  ids, labels = words[:, :-1], words[:, 1:]
  f32 = lambda x: tf.constant(x, tf.float32)  # noqa: E731
  i32 = lambda x: tf.constant(x, tf.int32)  # noqa: E731
  return NestedMap(
      src=NestedMap(ids=i32(np.where(src_pad, 0, src)), paddings=f32(src_pad)),
      tgt=NestedMap(ids=i32(np.where(tgt_pad, 0, ids)),
                    labels=i32(np.where(tgt_pad, 0, labels)),
                    paddings=f32(tgt_pad), weights=f32(1.0 - tgt_pad)),
      lang=tf.constant(['xx'] * batch_size))
