"""Checkpoints of a `TrainState` with tf.train.Checkpoint + CheckpointManager.

Layout of `<logdir>/train/`:

  checkpoint                      the manager's state file: the commit point
  ckpt-<step>.index / .data-*     one checkpoint per saved step, keys:
    theta/<weight path>/.ATTRIBUTES/VARIABLE_VALUE      e.g. theta/model/fc_000/w
    opt/<weight path>/<slot>/.ATTRIBUTES/VARIABLE_VALUE e.g. opt/model/fc_000/w/m
    step/..., seed/...            int64 update count and the run's seed
    data/.ATTRIBUTES/ITERATOR_STATE  the tf.data iterator (when enabled)

Atomicity: TF writes the shards under `<prefix>_temp/`, merges them into
`ckpt-<step>.*`, and only then rewrites the `checkpoint` state file (itself
written to a temporary file and renamed). A crash before that rename leaves
the state file naming the previous checkpoint, which is untouched (old
checkpoints are deleted only after the new state is recorded). A step is
never saved twice, so the checkpoint the state file names is never being
overwritten (tests/trainer/test_trainer_checkpointer.py kills a process at
each stage of a save to prove this).

Before restoring, the checkpoint's variable names, shapes and dtypes are
compared with the run's: the first difference (in sorted path order) is
reported by name instead of TF's list of unresolved objects.
"""

import os
import time

from absl import logging
import tensorflow as tf

_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be used by this run."""


def _Tree(by_path):
  """{`a/b/c`: var} -> {'a': {'b': {'c': var}}}: checkpoint keys `a/b/c`."""
  root = {}
  for path in sorted(by_path):
    node = root
    parts = path.split('/')
    for part in parts[:-1]:
      node = node.setdefault(part, {})
    node[parts[-1]] = by_path[path]
  return root


def _Describe(shape, dtype):
  return f'{list(shape)} {tf.as_dtype(dtype).name}'


class Checkpointer:
  """Saves and restores a TrainState (and optionally a data iterator).

  Args:
    train_dir: the checkpoint directory (`<logdir>/train`).
    state: the TrainState.
    iterator: a tf.data iterator to save, or None.
    max_to_keep: K most recent checkpoints kept.
    save_interval_steps / save_interval_secs: `MaybeSave` cadence (0 = off).
    is_chief: non-chief workers of a multi-worker run save to a private
      temporary directory (every worker must take part in a save) and
      delete it.
    include_optimizer: False restores theta/step/seed only (eval, export).
  """

  def __init__(self, train_dir, state, iterator=None, max_to_keep=5,
               save_interval_steps=0, save_interval_secs=0.0, is_chief=True,
               worker_id=0, include_optimizer=True):
    self.train_dir = train_dir
    self._state = state
    self._theta = state.ThetaByPath()
    self._slots = state.SlotsByPath() if include_optimizer else {}
    objects = dict(step=state.step, seed=state.seed, theta=_Tree(self._theta))
    if include_optimizer:
      objects['opt'] = _Tree(self._slots)
    self._has_iterator = iterator is not None
    if iterator is not None:
      objects['data'] = iterator
    self._ckpt = tf.train.Checkpoint(**objects)
    self._is_chief = is_chief
    self._save_dir = (train_dir if is_chief else
                      os.path.join(train_dir, f'.tmp_worker_{worker_id}'))
    self._manager = tf.train.CheckpointManager(
        self._ckpt, self._save_dir, max_to_keep=max_to_keep)
    self._interval_steps = save_interval_steps
    self._interval_secs = save_interval_secs
    self._last_saved_step = None
    self._last_save_time = time.time()

  # ------------------------------------------------------------- restoring
  def LatestPath(self):
    """Path prefix of the newest committed checkpoint, or None."""
    return tf.train.latest_checkpoint(self.train_dir)

  def CheckCompatible(self, path):
    """Raises CheckpointError naming the first variable that differs."""
    try:
      reader = tf.train.load_checkpoint(path)
      shapes = reader.get_variable_to_shape_map()
      dtypes = reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as e:
      raise CheckpointError(f'checkpoint {path} is unreadable: '
                            f'{type(e).__name__}: {e}') from None
    for prefix, kind, ours in (('theta', 'variable', self._theta),
                               ('opt', 'optimizer slot', self._slots)):
      if prefix == 'opt' and not ours:
        continue
      theirs = {k[len(prefix) + 1:-len(_SUFFIX)]: k for k in shapes
                if k.startswith(prefix + '/') and k.endswith(_SUFFIX)}
      for name in sorted(set(ours) | set(theirs)):
        if name not in theirs:
          raise CheckpointError(f'checkpoint {path} does not match the model: '
                                f'{kind} {name!r} is missing from the '
                                'checkpoint')
        if name not in ours:
          raise CheckpointError(f'checkpoint {path} does not match the model: '
                                f'checkpoint {kind} {name!r} is not in the '
                                'model')
        var, key = ours[name], theirs[name]
        mine = _Describe(var.shape, var.dtype)
        saved = _Describe(shapes[key], dtypes[key])
        if mine != saved:
          raise CheckpointError(f'checkpoint {path} does not match the model: '
                                f'{kind} {name!r} is {mine} in the model but '
                                f'{saved} in the checkpoint')

  def Restore(self, path=None):
    """Restores `path` (default: the latest). Returns (step, data_restored),
    or (None, False) when there is nothing to restore."""
    path = path or self.LatestPath()
    if path is None:
      return None, False
    self.CheckCompatible(path)
    reader = tf.train.load_checkpoint(path)
    has_data = 'data/.ATTRIBUTES/ITERATOR_STATE' in (
        reader.get_variable_to_shape_map())
    objects = dict(step=self._state.step, seed=self._state.seed,
                   theta=_Tree(self._theta))
    if self._slots:
      objects['opt'] = _Tree(self._slots)
    if self._has_iterator and has_data:
      objects['data'] = self._ckpt.data
    seed_before = int(self._state.seed.numpy())
    try:
      tf.train.Checkpoint(**objects).read(path).expect_partial()
    except (tf.errors.OpError, ValueError) as e:
      raise CheckpointError(f'checkpoint {path} is unreadable: '
                            f'{type(e).__name__}: {e}') from None
    saved_seed = int(self._state.seed.numpy())
    if saved_seed != seed_before:
      raise CheckpointError(
          f'checkpoint {path} was trained with random_seed {saved_seed} but '
          f'this run has {seed_before}; pass --seed={saved_seed} (or a new '
          'logdir) so that randomness continues where it stopped')
    step = int(self._state.step.numpy())
    self._last_saved_step = step
    logging.info('Restored %s (step %d%s).', path, step,
                 ', data iterator' if objects.get('data') is not None else '')
    return step, objects.get('data') is not None

  def WarmStart(self, path):
    """Loads theta only (no optimizer slots, step or data) from `path`.

    Every weight of the model must be in the checkpoint with the same
    shape; extra checkpoint variables are ignored.
    """
    try:
      reader = tf.train.load_checkpoint(path)
      shapes = reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as e:
      raise CheckpointError(f'--init_from_checkpoint {path} is unreadable: '
                            f'{type(e).__name__}: {e}') from None
    for name in sorted(self._theta):
      key = f'theta/{name}{_SUFFIX}'
      var = self._theta[name]
      if key not in shapes:
        raise CheckpointError(f'--init_from_checkpoint {path}: variable '
                              f'{name!r} is missing from the checkpoint')
      if list(shapes[key]) != var.shape.as_list():
        raise CheckpointError(f'--init_from_checkpoint {path}: variable '
                              f'{name!r} is {var.shape.as_list()} in the '
                              f'model but {list(shapes[key])} in the '
                              'checkpoint')
    for name in sorted(self._theta):
      self._theta[name].assign(
          reader.get_tensor(f'theta/{name}{_SUFFIX}'))
    logging.info('Warm-started %d weights from %s.', len(self._theta), path)

  # ---------------------------------------------------------------- saving
  def ShouldSave(self, step):
    """Whether `MaybeSave(step)` would save."""
    if step == self._last_saved_step:
      return False
    if self._interval_steps and step % self._interval_steps == 0:
      return True
    return bool(self._interval_secs and
                time.time() - self._last_save_time >= self._interval_secs)

  def MaybeSave(self, step):
    """Saves if the step or time interval says so; returns the path or None."""
    return self.Save(step) if self.ShouldSave(step) else None

  def Save(self, step):
    """Saves `ckpt-<step>` unless that step is already saved."""
    if step == self._last_saved_step:
      return None
    path = self._manager.save(checkpoint_number=step)
    self._last_saved_step = step
    self._last_save_time = time.time()
    if not self._is_chief:
      tf.io.gfile.rmtree(self._save_dir)
      return None
    return path

  @property
  def last_saved_step(self):
    return self._last_saved_step
