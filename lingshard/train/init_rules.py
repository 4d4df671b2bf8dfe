"""Initialising weights from other checkpoints by name rules (Lingvo's
`init_from_checkpoint_rules`), with sparse upcycling.

`task.train.init_from_checkpoint_rules` is a dict

  {checkpoint: ([(target regex, source format), ...], [ignore regex, ...])}

- checkpoint: a checkpoint prefix (`<logdir>/train/ckpt-<step>`), a run's
  logdir or its `train` directory (their latest checkpoint), or '' = the
  checkpoint given by the trainer's `--init_from_checkpoint` flag (so a
  registered config can name its source run on the command line).
- load rules: a weight of this model whose path (`model/enc/layer_001/moe/
  wi`) a target regex matches in full (re.fullmatch) is loaded from the
  checkpoint's weight named `source format % match.groups()` (Lingvo's
  %-format: `('(.*)', '%s')` loads every weight from the same name). Within
  one checkpoint the first matching rule wins, so a catch-all goes last.
- ignore rules: weights they match in full are not loaded from that
  checkpoint.

The rules apply once, when the trainer starts with no checkpoint of its own
in --logdir (a resumed run restores its own checkpoint instead). Only
weights are loaded: optimizer slots start fresh and the step at 0. A weight
no rule loads keeps its initial value (e.g. the router of an upcycled MoE),
unless `task.train.init_from_checkpoint_require_all` is set: then each
weight must be loaded, or matched by an ignore rule (a deliberately fresh
weight). A weight loaded by the rules of two checkpoints is an error.

Shapes (`LoadedValue`): a source of the target's shape loads as is. An MoE
expert weight ([E, ...]: `MoEBase.EXPERT_WEIGHTS` of an unpipelined MoE
layer) also loads
- a dense weight of its trailing shape [...], copied to every expert:
  sparse upcycling (Komatsuzaki et al. 2023, Figure 1: each expert starts
  as a copy of the dense MLP it replaces, the router fresh, every other
  weight copied). With dropless routing whose gates sum to 1 per token,
  the upcycled MoE computes what the dense model did;
- an expert weight of another expert count [E1, ...] when E is a multiple
  of E1: each expert is repeated E / E1 times (target expert e is source
  expert e // (E / E1), np.repeat), else a one-line error.
Anything else is a one-line error naming both weights and shapes.

Every error is a `checkpointer.CheckpointError` of one line (the trainer
prints it and exits 1).
"""

import os
import re

from absl import logging
import numpy as np
import tensorflow as tf

from lingshard.train import checkpointer

_PREFIX = 'init_from_checkpoint_rules'
# The key whose checkpoint is the trainer's --init_from_checkpoint.
FLAG_KEY = ''


class InitRulesError(checkpointer.CheckpointError):
  """Rules that cannot initialise this model (one line)."""


def _Fail(text):
  return InitRulesError(f'{_PREFIX}: {text}')


def _Regex(text):
  try:
    return re.compile(text)
  except re.error as e:
    raise _Fail(f'{text!r} is not a regular expression ({e})') from None


def _IsStrPair(x):
  return (isinstance(x, (tuple, list)) and len(x) == 2 and
          all(isinstance(s, str) for s in x))


def _Parse(rules):
  """[(key, [(regex, compiled, format)], [(regex, compiled)])], validated."""
  if not isinstance(rules, dict):
    raise _Fail(f'must be a dict {{checkpoint: (load rules, ignore rules)}}, '
                f'got {type(rules).__name__}')
  parsed = []
  for key, value in rules.items():
    if not (isinstance(key, str) and isinstance(value, (tuple, list)) and
            len(value) == 2 and isinstance(value[0], (tuple, list)) and
            isinstance(value[1], (tuple, list)) and
            all(_IsStrPair(r) for r in value[0]) and
            all(isinstance(r, str) for r in value[1])):
      raise _Fail(f'the value of {key!r} must be ([(target regex, source '
                  'format), ...], [ignore regex, ...])')
    loads = [(regex, _Regex(regex), fmt) for regex, fmt in value[0]]
    ignores = [(regex, _Regex(regex)) for regex in value[1]]
    parsed.append((key, loads, ignores))
  return parsed


def ResolveCheckpoint(path, what):
  """The checkpoint prefix `path` names: a prefix as is, or the latest
  checkpoint of a directory (a logdir or its `train` directory). `what`
  names the path in errors (e.g. '--init_from_checkpoint')."""
  if not tf.io.gfile.isdir(path):
    return path
  for train_dir in (os.path.join(path, 'train'), path):
    if tf.io.gfile.exists(os.path.join(train_dir, checkpointer.STATE_FILE)):
      return checkpointer.ReadState(train_dir)
  raise checkpointer.CheckpointError(
      f'{what} {path} is a directory without a checkpoint (neither it nor '
      f'its train/ holds a {checkpointer.STATE_FILE} file); pass a run\'s '
      'logdir or a checkpoint prefix such as <logdir>/train/ckpt-<step>')


def ExpertWeights(task):
  """{weight path: E} of the expert weights ([E, ...]) of every MoE layer
  of `task` (a pipeline's stacked weights have other paths: not listed)."""
  out = {}
  for layer in task.AllLayers():
    for name, num_experts in layer.ExpertWeights().items():
      out[f'{layer.path}/{name}'] = num_experts
  return out


def LoadedValue(value, target_shape, num_experts=None):
  """Source `value` (ndarray) as a target of `target_shape` (see the module
  docstring; `num_experts`: E when the target is an expert weight [E, ...]).
  Raises ValueError with the reason it cannot."""
  source, target = list(value.shape), [int(d) for d in target_shape]
  if source == target:
    return value
  if num_experts is not None and target[:1] == [num_experts]:
    if source == target[1:]:  # Sparse upcycling: the dense weight per expert.
      return np.broadcast_to(value, target).copy()
    if len(source) == len(target) and source[1:] == target[1:]:
      if num_experts % source[0]:
        raise ValueError(f'{num_experts} experts are not a multiple of the '
                         f'checkpoint\'s {source[0]} (each expert is repeated '
                         'E / E1 times)')
      return np.repeat(value, num_experts // source[0], axis=0)
  raise ValueError('the shapes differ (only an expert weight [E, ...] loads '
                   'another shape: a dense [...] copied to every expert, or '
                   '[E1, ...] with E a multiple of E1)')


class Rules:
  """Validated `init_from_checkpoint_rules` and the trainer's flag.

  Args:
    rules: the train param (see the module docstring).
    require_all: `init_from_checkpoint_require_all`.
    flag_checkpoint: --init_from_checkpoint (None: unset).
  Raises InitRulesError for malformed rules, and when there are rules and
  the flag is set but no rule set is keyed '' (it would be silently
  unused). Without rules the flag warm-starts every weight (Trainer).
  """

  def __init__(self, rules, require_all=False, flag_checkpoint=None):
    self._parsed = _Parse(rules or {})
    self._require_all = bool(require_all)
    self._flag = flag_checkpoint or None
    keys = [key for key, _, _ in self._parsed]
    if keys and self._flag and FLAG_KEY not in keys:
      raise _Fail(f'--init_from_checkpoint={self._flag} is not used: the '
                  'rules name their checkpoints (key a rule set \'\' to '
                  'load from the flag)')

  def __bool__(self):
    return bool(self._parsed)

  def CheckFlag(self):
    """InitRulesError when a rule set loads from --init_from_checkpoint
    ('' key) and the flag is unset."""
    if any(key == FLAG_KEY for key, _, _ in self._parsed) and not self._flag:
      raise _Fail('the rules keyed \'\' load from --init_from_checkpoint, '
                  'which is not set; pass --init_from_checkpoint=<the source '
                  "run's logdir or a checkpoint prefix>")

  def _Checkpoint(self, key):
    if key == FLAG_KEY:
      self.CheckFlag()
      return ResolveCheckpoint(self._flag, '--init_from_checkpoint')
    return ResolveCheckpoint(key, f'{_PREFIX} checkpoint')

  def Plan(self, theta_names, sources):
    """{target: (key, source)} for this model's weight paths `theta_names`
    and `sources` = {key: (checkpoint path, its weight paths)}; checks the
    rules' names and, with require_all, that every weight is covered."""
    plan, ignored = {}, set()
    for key, loads, ignores in self._parsed:
      path, names = sources[key]
      for target in sorted(theta_names):
        if any(r.fullmatch(target) for _, r in ignores):
          ignored.add(target)
          continue
        rule = next(((regex, fmt, m) for regex, r, fmt in loads
                     for m in [r.fullmatch(target)] if m), None)
        if rule is None:
          continue
        regex, fmt, match = rule
        try:
          source = fmt % match.groups()
        except (TypeError, ValueError) as e:
          raise _Fail(f'rule ({regex!r}, {fmt!r}) cannot name the source of '
                      f'{target!r}: {e}') from None
        if source not in names:
          raise _Fail(f'{target!r} loads {source!r} (rule ({regex!r}, '
                      f'{fmt!r})), which is not in checkpoint {path}')
        if target in plan:
          raise _Fail(f'{target!r} is loaded by the rules of two '
                      f'checkpoints, {sources[plan[target][0]][0]} and '
                      f'{path}; ignore it in one of them')
        plan[target] = (key, source)
    if self._require_all:
      for target in sorted(theta_names):
        if target not in plan and target not in ignored:
          raise _Fail(f'{target!r} is loaded by no rule and ignored by none '
                      '(init_from_checkpoint_require_all); add a rule or an '
                      'ignore rule for it')
    return plan

  def Apply(self, theta, expert_weights=None):
    """Loads the rules' weights into `theta` ({path: tf.Variable});
    `expert_weights` = ExpertWeights(task). Returns {target: source}."""
    expert_weights = expert_weights or {}
    readers, sources = {}, {}
    for key, _, _ in self._parsed:
      path = self._Checkpoint(key)
      readers[key] = checkpointer.Reader(path, what=f'{_PREFIX} checkpoint')
      sources[key] = (path, checkpointer.WeightNames(readers[key]))
    plan = self.Plan(list(theta), sources)
    for target, (key, source) in sorted(plan.items()):
      var, path = theta[target], sources[key][0]
      try:
        value = np.asarray(readers[key].get_tensor(
            checkpointer.WeightKey(source)))
      except checkpointer.READ_ERRORS as e:
        raise _Fail(f'checkpoint {path} is unreadable '
                    f'({checkpointer.ErrorText(e)})') from None
      where = (f'cannot load {target!r} {var.shape.as_list()} from '
               f'{source!r} {list(value.shape)} of checkpoint {path}')
      if value.dtype != var.dtype.as_numpy_dtype:
        raise _Fail(f'{where}: dtype {var.dtype.name} in the model but '
                    f'{value.dtype.name} in the checkpoint')
      try:
        value = LoadedValue(value, var.shape, expert_weights.get(target))
      except ValueError as e:
        raise _Fail(f'{where}: {e}') from None
      var.assign(value)
    logging.info('init_from_checkpoint_rules: loaded %d of %d weights.',
                 len(plan), len(theta))
    return {target: source for target, (_, source) in plan.items()}
