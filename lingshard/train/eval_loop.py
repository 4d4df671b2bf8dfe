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
from lingshard.train import atomic
from lingshard.train import step as step_lib
from lingshard.train import strategies
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
    replicated: a strategies.Replicated (the training job's strategy, mesh
      and compilation); default: one device, op by op.
  """

  def __init__(self, task, input_generator, num_batches=0, replicated=None):
    self.task = task
    self._input = input_generator
    self._num_batches = num_batches
    self.replicated = replicated or strategies.Replicated()
    self._fprop = self.replicated.Function(self._FProp)
    self._is_nll = False  # Set while tracing: which PerExampleLoss branch.

  def _FProp(self, theta, batch, step):
    """One replica's rows: (metrics, loss [b], weight [b])."""
    metrics, per_example = self.task.FProp(self.task.ShardTheta(theta),
                                           batch, step=step)
    loss, weight, self._is_nll = PerExampleLoss(per_example)
    metrics = NestedMap({k: (tf.cast(v, tf.float32), tf.cast(w, tf.float32))
                         for k, (v, w) in metrics.items()})
    return metrics, loss, weight

  def Evaluate(self, theta, step):
    """{'step', 'metrics': {name: mean}, 'languages': {lang: {...}}}.

    `theta`: tensors, or the variables of the strategy it runs under."""
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
      blocks = self._fprop(theta, base_input.NumericBatch(batch), step_t)
      for name, (v, w) in CombineReplicaMetrics(
          [metrics for metrics, _, _ in blocks]).items():
        if v.size == 1:
          sums[name] += float(v) * w
          weights[name] += w
      loss = np.concatenate([np.asarray(x) for _, x, _ in blocks])
      weight = np.concatenate([np.asarray(w) for _, _, w in blocks])
      language = (np.asarray(batch['lang']) if 'lang' in batch else
                  np.full(loss.shape, ALL.encode('utf-8')))
      for lang, x, w in zip(language, loss, weight):
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


def CombineReplicaMetrics(blocks):
  """{name: (value ndarray, float weight)}: one batch's task metrics from
  its replicas' row blocks (NestedMaps of (value, weight)), as one device
  reports them on the whole batch (step.CrossReplicaSum's rules): counts
  (step.IsCount) summed; a metric of weight 1 on every replica (a mean over
  groups, e.g. aux_loss) averaged, weight 1; any other the mean weighted by
  its weights (tokens, examples), weight their sum. One block: itself."""
  out = {}
  for name in blocks[0]:
    vs = [np.asarray(b[name][0]) for b in blocks]
    ws = [float(b[name][1]) for b in blocks]
    if len(blocks) == 1:
      out[name] = (vs[0], ws[0])
    elif step_lib.IsCount(name):
      out[name] = (sum(vs), ws[0])
    elif all(w == 1.0 for w in ws):
      out[name] = (sum(vs) / len(vs), 1.0)
    else:
      total = sum(ws)
      out[name] = (sum(v * w for v, w in zip(vs, ws)) / total if total else
                   vs[0], total)
  return out


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
