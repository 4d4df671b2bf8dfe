"""An MT task's per-expert routing metrics reach TensorBoard as histograms."""

import numpy as np
import tensorflow as tf

from lingshard.train import summaries
from tests.models import mt_testlib


def _Events(logdir):
  """{tag: (plugin name, tensor ndarray)} of the event files in logdir."""
  out = {}
  for path in tf.io.gfile.glob(f'{logdir}/events.out.tfevents.*'):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        out[value.tag] = (value.metadata.plugin_data.plugin_name,
                          tf.make_ndarray(value.tensor))
  return out


def test_per_expert_metrics_are_written_as_histograms(tmp_path):
  task = mt_testlib.TinyParams(use_moe=True).Instantiate()
  metrics, _ = task.FProp(task.theta, mt_testlib.SyntheticBatch(task.params),
                          step=tf.constant(0, tf.int64))
  writer = summaries.SummaryWriter(str(tmp_path))
  writer.Write(1, summaries.MetricsToNumpy(metrics))
  writer.Flush()
  events = _Events(str(tmp_path))
  per_expert = metrics.enc_layer_001_tokens_per_expert_first[0].numpy()
  assert per_expert.shape == (4,)  # E = 4 experts.
  plugin, buckets = events['enc_layer_001_tokens_per_expert_first']
  assert plugin == 'histograms'
  # [k, 3] (left, right, count) buckets over the E values.
  assert buckets.shape[1] == 3 and buckets[:, 2].sum() == 4
  assert buckets[0, 0] == np.float64(per_expert.min())
  plugin, value = events['enc_layer_001_tokens_per_expert_first/002']
  assert plugin == 'scalars'
  np.testing.assert_allclose(value, per_expert[2], rtol=1e-6)
  plugin, value = events['loss']
  assert plugin == 'scalars' and value.shape == ()
