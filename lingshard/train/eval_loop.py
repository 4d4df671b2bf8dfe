"""Evaluation: dev loss / log-perplexity overall and per language.

The eval task is built from the task class's `InferenceParams` (the train
task's params with `is_inference=True`, plus what a task adds); it has no
variables of its own: `FProp` runs on the training run's theta, on the
batch without its string leaves (base_input.NumericBatch).

Seams with tasks and inputs:
- `batch.lang`: [B] language codes (strings; MtInput has them). Batches
  without it are all counted under language `all`.
- per-example loss from `ComputeLoss`'s second output (`PerExampleLoss`):
  `nll` [B] (summed token NLL) with `num_tokens` [B] (what MT tasks
  return) gives per-language log-perplexity; else the only [B] tensor
  there is, weighted 1 per example (e.g. the toy model's squared error).
"""

import collections
import json
import math
import os

import numpy as np
import tensorflow as tf

from lingshard import base_input
from lingshard import sharding
from lingshard.train import atomic
from lingshard.nested_map import NestedMap

ALL = 'all'


def PerExampleLoss(per_example):
  """(loss sum [B], weight [B], is_nll): is_nll says loss/weight is an NLL."""
  if 'nll' in per_example and 'num_tokens' in per_example:
    return (tf.cast(per_example.nll, tf.float32),
            tf.cast(per_example.num_tokens, tf.float32), True)
  leaves = [v for v in per_example.Flatten() if v.shape.rank == 1]
  if len(leaves) != 1:
    raise ValueError('per-example loss: ComputeLoss should return `nll` and '
                     '`num_tokens` [B] per example; got keys '
                     f'{[k for k, _ in per_example.FlattenItems()]}')
  value = tf.cast(leaves[0], tf.float32)
  return value, tf.ones_like(value), False


class Evaluator:
  """Evaluates a task on an input generator's dataset.

  Args:
    task: the eval task (inference params); only its FProp is used.
    input_generator: has `GetDataset()`; must be finite if num_batches == 0.
    num_batches: batches per evaluation (0: the whole dataset).
  """

  def __init__(self, task, input_generator, num_batches=0):
    self.task = task
    self._input = input_generator
    self._num_batches = num_batches
    self._fprop = sharding.Function(self._FProp, xla_compiled=False)
    self._is_nll = False  # Set while tracing: which PerExampleLoss branch.

  def _FProp(self, theta, batch, step):
    metrics, per_example = self.task.FProp(
        theta, base_input.NumericBatch(batch), step=step)
    loss, weight, self._is_nll = PerExampleLoss(per_example)
    metrics = NestedMap({k: (tf.cast(v, tf.float32), tf.cast(w, tf.float32))
                         for k, (v, w) in metrics.items()})
    language = batch.get('lang', tf.fill(tf.shape(loss), ALL))
    return metrics, loss, weight, language

  def Evaluate(self, theta, step):
    """{'step', 'metrics': {name: mean}, 'languages': {lang: {...}}}."""
    dataset = self._input.GetDataset()
    if self._num_batches:
      dataset = dataset.take(self._num_batches)
    elif dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
      raise ValueError('the eval dataset is endless: set '
                       'task.train.eval_num_batches')
    sums = collections.defaultdict(float)
    weights = collections.defaultdict(float)
    per_lang = collections.defaultdict(lambda: [0.0, 0.0, 0])
    step_t = tf.constant(step, tf.int64)
    for batch in dataset:
      metrics, loss, weight, language = self._fprop(theta, batch, step_t)
      for name, (v, w) in metrics.items():
        v, w = np.asarray(v), float(w)
        if v.size == 1:
          sums[name] += float(v) * w
          weights[name] += w
      for lang, x, w in zip(language.numpy(), loss.numpy(), weight.numpy()):
        acc = per_lang[lang.decode('utf-8')]
        acc[0] += float(x)
        acc[1] += float(w)
        acc[2] += 1
    result = {'step': int(step),
              'metrics': {k: sums[k] / weights[k] for k in sorted(sums)
                          if weights[k] > 0},
              'languages': {}}
    for lang in sorted(per_lang):
      total, weight, examples = per_lang[lang]
      entry = {'loss': total / weight if weight else float('nan'),
               'weight': weight, 'examples': examples}
      if self._is_nll:  # loss is the per-token NLL: log-perplexity.
        entry['log_pplx'] = entry['loss']
        entry['pplx'] = math.exp(min(entry['loss'], 700.0))
      result['languages'][lang] = entry
    return result


def Scalars(result):
  """Flat {summary name: value} of an eval result (per-language included)."""
  out = dict(result['metrics'])
  for lang, entry in result['languages'].items():
    for key in ('loss', 'log_pplx', 'pplx'):
      if key in entry:
        out[f'lang/{lang}/{key}'] = entry[key]
  return out


def WriteJson(directory, result):
  """Writes `result` to `<directory>/metrics-<step>.json` (one file per
  evaluation: object stores such as GCS cannot append), through a
  temporary sibling (atomic.WriteText): a failed write leaves no file or
  the previous one. Raises atomic.ERRORS."""
  tf.io.gfile.makedirs(directory)
  path = os.path.join(directory, f'metrics-{result["step"]:08d}.json')
  atomic.WriteText(path, json.dumps(result, indent=1, sort_keys=True) + '\n')
  return path
