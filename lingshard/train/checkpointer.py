"""Checkpoints of a `TrainState` with tf.train.Checkpoint.

Layout of `<logdir>/train/`:

  checkpoint                      the state file: the commit point
  ckpt-<step>.index / .data-*     one checkpoint per saved step, keys:
    theta/<weight path>/.ATTRIBUTES/VARIABLE_VALUE      e.g. theta/model/fc_000/w
    opt/<weight path>/<slot>/.ATTRIBUTES/VARIABLE_VALUE e.g. opt/model/fc_000/w/m
    step/..., seed/...            int64 update count and the run's seed
    layout/<layer path>/...       int64 slot -> layer map of a pipeline
    data/.ATTRIBUTES/ITERATOR_STATE  the tf.data iterator (when enabled)

The state file is TensorFlow's CheckpointState text (so
tf.train.latest_checkpoint reads it): `model_checkpoint_path` (the latest)
and `all_model_checkpoint_paths` (the kept ones, oldest first), written by
this module as names relative to the directory.

Atomicity (a save, `Checkpointer.Save`): TF writes the shards under
`<prefix>_temp/` and merges them into `ckpt-<step>.*`; then the state file
is written to a temporary sibling and renamed over `checkpoint`; only after
that are the checkpoints the new state file does not list deleted. A crash
before that rename leaves the state file naming the previous checkpoint,
which is untouched. A step is never saved twice, so the checkpoint the state
file names is never being overwritten (tests/trainer/test_trainer_checkpointer.py
kills a process at each stage of a save, with max_to_keep=1, to prove this;
tests/trainer/test_trainer_resume.py kills the trainer with several signals
and resumes bit-exactly). The stages are named in SAVE_STAGES.

Nothing outside the directory: every entry of a state file read from disk
must be a `ckpt-<step>` of this very directory once `..` and symbolic links
are resolved (os.path.realpath; a `gs://`-style path is normalised only);
otherwise CheckpointError names the file and the entry, before anything is
written or deleted. Pruning never trusts that list: it deletes only the
`ckpt-<step>.*` files (and `ckpt-<step>_temp` directories, `checkpoint.tmp*`
files) that it finds in the directory and that the state file it just wrote
does not list; a symbolic link is removed, never followed.

A save that fails (a full disk, any write error) removes what it wrote of
that step and raises CheckpointError naming the directory and the OS error;
the state file still names the previous checkpoint.

Reading: the state file must parse and name a checkpoint whose `.index`
exists, and a directory holding `ckpt-*.index` files must have a state
file; otherwise CheckpointError names the file. The state file is first
read (and checked) at the first save, so a damaged directory is never
overwritten by a run restarting from step 0. A checkpoint whose `.index` or
`.data-*` file is truncated or corrupt is named the same way.

Before restoring, the checkpoint's variable names, shapes and dtypes are
compared with the run's: the first difference (in sorted path order) is
reported by name instead of TF's list of unresolved objects.

Layouts: a pipeline's stacked weights keep their shape under another
schedule or stage split (L = 4, K = 2: fill-drain holds layers {0, 1} on
stage 0, Circular(R=2) {0, 2}), so each layer's `WeightLayout()` is saved
under `layout/<layer path>` (never trained) and Restore / WarmStart refuse
another layout in one line naming the layer and both layouts, before
reading anything. A checkpoint without it (older runs) restores unchecked
with a logged warning, rather than stranding every older run.

Every weight is saved whole (its full shape): the device mesh and split
mappings are a layout the step's sharding annotations give the weights
inside a compiled program, not part of the checkpoint, so a checkpoint
restores on any mesh (tests/trainer/test_restore_mesh.py: 1 device -> 8,
experts split 8 ways). Initialising from other runs' checkpoints by name
rules (e.g. sparse upcycling): init_rules.py.
"""

import os
import posixpath
import re
import shutil
import time
import uuid

from absl import logging
from google.protobuf import text_format
import numpy as np
import tensorflow as tf
from tensorflow.python.training import checkpoint_state_pb2

_THETA = 'theta/'
_LAYOUT = 'layout/'
_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'
STATE_FILE = 'checkpoint'
_PREFIX = 'ckpt'
# What a damaged or truncated checkpoint file raises when read (a short
# read of a `.data` file is an IndexError).
READ_ERRORS = (tf.errors.OpError, ValueError, LookupError)
_WRITE_ERRORS = (tf.errors.OpError, OSError)
# A file or directory of checkpoint <step>: `ckpt-<step>.index`,
# `ckpt-<step>.data-*`, `ckpt-<step>_temp*` (shards of an unfinished save).
_FILE = re.compile(rf'{_PREFIX}-(\d+)(?:\.index|\.data-.*|_temp.*)')
_NAME = re.compile(rf'{_PREFIX}-(\d+)')

# The stages of a save after TF's write (in order): `ckpt-<step>` complete,
# state file not yet written; the state file's temporary sibling written,
# not yet renamed; the new state file in place, no old checkpoint deleted;
# one old file deleted. Testing only: `stage_hook(stage, step)`, when set,
# is called at each (tests/trainer/ckpt_crash_helper.py stops the process
# there).
SAVE_STAGES = ('before_state', 'mid_state', 'before_sweep', 'mid_sweep')
stage_hook = None


def _Stage(stage, step):
  if stage_hook is not None:
    stage_hook(stage, step)


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


def _LayoutKey(path):
  return f'{_LAYOUT}{path}{_SUFFIX}'


def _LayoutMismatch(reader, layouts):
  """The one-line reason the checkpoint's layouts differ from `layouts`
  ({layer path: int array}), or None; a missing record is a warning."""
  shapes = reader.get_variable_to_shape_map()
  for name, ours in sorted(layouts.items()):
    key = _LayoutKey(name)
    if key not in shapes:
      logging.warning('The checkpoint records no weight layout of %s; '
                      'restoring it as this run\'s %s.', name, ours.tolist())
      continue
    theirs = reader.get_tensor(key)
    if theirs.shape != ours.shape or not np.array_equal(theirs, ours):
      return (f'pipeline {name!r} holds layers {theirs.tolist()} in the '
              f'checkpoint but {ours.tolist()} in the model (stage -> slot '
              '-> layer, -1 padding): another schedule or stage split would '
              'restore its layers permuted')
  return None


def _Describe(shape, dtype):
  return f'{list(shape)} {tf.as_dtype(dtype).name}'


def ErrorText(error):
  """One line of an exception's message, without TF's op decorations."""
  text = getattr(error, 'message', None) or str(error) or type(error).__name__
  text = re.sub(r'\{\{function_node [^}]*\}\}\s*', '', text)
  text = re.sub(r'\s*\[Op:\w+\]', '', text)
  return ' '.join(text.split())


def _Advice(train_dir):
  state = os.path.join(train_dir, STATE_FILE)
  return (f'nothing was written: make {state} name a good checkpoint (one '
          f'line: model_checkpoint_path: "{_PREFIX}-<step>") or use a new '
          'logdir')


def _Absolute(train_dir, path):
  if os.path.isabs(path) or '://' in path:
    return path
  return os.path.join(train_dir, path)


def _Resolve(path):
  """`path` with `..` and (on a local file system) symbolic links resolved."""
  return posixpath.normpath(path) if '://' in path else os.path.realpath(path)


def _Step(path):
  m = re.search(rf'{_PREFIX}-(\d+)\.index$', path)
  return int(m.group(1)) if m else -1


def _EntryStep(train_dir, state, entry):
  """The step of state-file entry `entry`; CheckpointError unless it is a
  `ckpt-<step>` of `train_dir` itself (after resolving `..` and links)."""
  head, base = posixpath.split(_Absolute(train_dir, entry))
  m = _NAME.fullmatch(base)
  if m is None or _Resolve(head or '.') != _Resolve(train_dir):
    raise CheckpointError(
        f'checkpoint state file {state} names {entry!r}, which is not a '
        f'{_PREFIX}-<step> checkpoint of {train_dir}; {_Advice(train_dir)}')
  return int(m.group(1))


def _ReadSteps(train_dir):
  """(latest step, sorted steps of every entry) of the state file of
  `train_dir`, or (None, []) when there is none (see ReadState). Every
  entry is checked (_EntryStep)."""
  state = os.path.join(train_dir, STATE_FILE)
  if not tf.io.gfile.exists(state):
    found = tf.io.gfile.glob(os.path.join(train_dir, f'{_PREFIX}-*.index'))
    if not found:
      return None, []
    newest = os.path.basename(max(found, key=_Step))
    raise CheckpointError(f'checkpoint state file {state} is missing but '
                          f'{train_dir} holds {newest}; {_Advice(train_dir)}')
  try:
    with tf.io.gfile.GFile(state, 'rb') as f:
      text = f.read().decode('utf-8')
    proto = text_format.Parse(text, checkpoint_state_pb2.CheckpointState())
  except (tf.errors.OpError, UnicodeDecodeError,
          text_format.ParseError) as e:
    raise CheckpointError(f'checkpoint state file {state} is unreadable '
                          f'({ErrorText(e)}); {_Advice(train_dir)}') from None
  if not proto.model_checkpoint_path:
    what = 'is empty' if not text.strip() else 'names no checkpoint'
    raise CheckpointError(f'checkpoint state file {state} {what}; '
                          f'{_Advice(train_dir)}')
  latest = _EntryStep(train_dir, state, proto.model_checkpoint_path)
  listed = [_EntryStep(train_dir, state, entry)
            for entry in proto.all_model_checkpoint_paths]
  path = os.path.join(train_dir, f'{_PREFIX}-{latest}')
  if not tf.io.gfile.exists(path + '.index'):
    raise CheckpointError(
        f'checkpoint state file {state} names '
        f'{proto.model_checkpoint_path!r} but {path}.index does not exist; '
        f'{_Advice(train_dir)}')
  return latest, sorted(set(listed) | {latest})


def ReadState(train_dir):
  """Prefix of the checkpoint the state file of `train_dir` names, or None
  when there is no state file and no `ckpt-*.index` file.

  Raises CheckpointError (naming the file) for a state file that does not
  parse, names no checkpoint or one without an `.index` file, or names
  anything but a `ckpt-<step>` of `train_dir` (after resolving `..` and
  links), and for `ckpt-*.index` files without a state file.
  """
  latest, _ = _ReadSteps(train_dir)
  return None if latest is None else os.path.join(train_dir,
                                                  f'{_PREFIX}-{latest}')


def _Remove(path):
  """Removes a file or directory; a symbolic link is removed, not followed."""
  if '://' in path:
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    else:
      tf.io.gfile.remove(path)
  elif os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)  # Does not follow links inside either.
  else:
    os.unlink(path)


def _WriteState(train_dir, steps):
  """Makes the state file of `train_dir` list `steps` (the last is the
  latest): a temporary sibling renamed over it. No steps: removes it."""
  state = os.path.join(train_dir, STATE_FILE)
  if not steps:
    if tf.io.gfile.exists(state):
      _Remove(state)
    return
  proto = checkpoint_state_pb2.CheckpointState(
      model_checkpoint_path=f'{_PREFIX}-{steps[-1]}',
      all_model_checkpoint_paths=[f'{_PREFIX}-{s}' for s in steps])
  tmp = f'{state}.tmp{uuid.uuid4().hex}'
  with tf.io.gfile.GFile(tmp, 'w') as f:
    f.write(text_format.MessageToString(proto))
  _Stage('mid_state', steps[-1])
  tf.io.gfile.rename(tmp, state, overwrite=True)


def _DataFile(path):
  """The `.data-*` file of checkpoint `path` (its pattern when several)."""
  found = sorted(tf.io.gfile.glob(path + '.data-*'))
  return found[0] if len(found) == 1 else path + '.data-*'


def WeightKey(name):
  """The checkpoint key of the weight at path `name`."""
  return f'{_THETA}{name}{_SUFFIX}'


def WeightNames(reader):
  """The weight paths a checkpoint (its `Reader`) holds."""
  return {k[len(_THETA):-len(_SUFFIX)]
          for k in reader.get_variable_to_shape_map()
          if k.startswith(_THETA) and k.endswith(_SUFFIX)}


def Reader(path, what='checkpoint file', advice=None):
  """A CheckpointReader of `path`; CheckpointError naming its `.index`."""
  try:
    return tf.train.load_checkpoint(path)
  except READ_ERRORS as e:
    raise CheckpointError(f'{what} {path}.index is unreadable '
                          f'({ErrorText(e)})' +
                          (f'; {advice}' if advice else '')) from None


def _FirstBadFile(path, reader):
  """(file, error) of the first unreadable file of checkpoint `path`
  (every tensor is read back, checksums included), or (None, None)."""
  dtypes = reader.get_variable_to_dtype_map()
  names = sorted(dtypes)
  try:
    tf.raw_ops.RestoreV2(prefix=path, tensor_names=names,
                         shape_and_slices=[''] * len(names),
                         dtypes=[dtypes[n] for n in names])
  except READ_ERRORS as e:
    return _DataFile(path), e
  return None, None


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
    self._layouts = {name: np.asarray(v, np.int64)
                     for name, v in state.layouts.items()}
    if self._layouts:  # Saved, never trained nor restored (compared).
      objects['layout'] = _Tree({
          name: tf.Variable(v, trainable=False, name=f'{name}/layout')
          for name, v in self._layouts.items()})
    if include_optimizer:
      objects['opt'] = _Tree(self._slots)
    self._has_iterator = iterator is not None
    if iterator is not None:
      objects['data'] = iterator
    self._ckpt = tf.train.Checkpoint(**objects)
    self._is_chief = is_chief
    self._save_dir = (train_dir if is_chief else
                      os.path.join(train_dir, f'.tmp_worker_{worker_id}'))
    self._max_to_keep = max_to_keep
    # Steps the state file lists (the latest last), read at the first save
    # (see _Listed), then the list this object wrote.
    self._listed = None
    self._on_disk = []
    self._interval_steps = save_interval_steps
    self._interval_secs = save_interval_secs
    self._last_saved_step = None
    self._last_save_time = time.time()

  def _Listed(self):
    """The kept steps, from the state file at the first call: it is checked
    (ReadState) before this run writes anything, entries newer than the
    latest (a state file edited to go back) and entries without files are
    dropped."""
    if self._listed is None:
      latest, self._on_disk = _ReadSteps(self._save_dir)
      self._listed = [s for s in self._on_disk if s == latest or (
          latest is not None and s < latest and tf.io.gfile.exists(
              os.path.join(self._save_dir, f'{_PREFIX}-{s}.index')))]
    return self._listed

  # ------------------------------------------------------------- restoring
  def LatestPath(self):
    """Path prefix of the newest committed checkpoint, or None; raises
    CheckpointError for a damaged state file (see ReadState)."""
    return ReadState(self.train_dir)

  def CheckCompatible(self, path, reader=None):
    """Raises CheckpointError naming the first variable that differs."""
    reader = reader or Reader(path)
    mismatch = _LayoutMismatch(reader, self._layouts)
    if mismatch:
      raise CheckpointError(f'checkpoint {path} does not match the model: '
                            f'{mismatch}; resume with the layout it was '
                            'trained with, or use a new logdir')
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
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
    reader = Reader(path, advice=_Advice(self.train_dir))
    self.CheckCompatible(path, reader)
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
    except READ_ERRORS as e:
      bad, error = _FirstBadFile(path, reader)
      if bad is None:
        raise CheckpointError(f'checkpoint {path} could not be restored: '
                              f'{ErrorText(e)}') from None
      raise CheckpointError(f'checkpoint file {bad} is unreadable '
                            f'({ErrorText(error)}); '
                            f'{_Advice(self.train_dir)}') from None
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
    reader = Reader(path, what='--init_from_checkpoint file')
    mismatch = _LayoutMismatch(reader, self._layouts)
    if mismatch:
      raise CheckpointError(f'--init_from_checkpoint {path}: {mismatch}; '
                            'start from it with the layout it was trained '
                            'with')
    shapes = reader.get_variable_to_shape_map()
    for name in sorted(self._theta):
      key = WeightKey(name)
      var = self._theta[name]
      if key not in shapes:
        raise CheckpointError(f'--init_from_checkpoint {path}: variable '
                              f'{name!r} is missing from the checkpoint')
      if list(shapes[key]) != var.shape.as_list():
        raise CheckpointError(f'--init_from_checkpoint {path}: variable '
                              f'{name!r} is {var.shape.as_list()} in the '
                              f'model but {list(shapes[key])} in the '
                              'checkpoint')
    try:
      values = {name: reader.get_tensor(WeightKey(name))
                for name in sorted(self._theta)}
    except READ_ERRORS as e:
      raise CheckpointError(f'--init_from_checkpoint file {_DataFile(path)} '
                            f'is unreadable ({ErrorText(e)})') from None
    for name, value in values.items():
      self._theta[name].assign(value)
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
    """Saves `ckpt-<step>` unless that step is already saved; returns its
    prefix (None on a non-chief worker).

    On a write error (e.g. a full disk) removes the files of this step and
    raises CheckpointError; the state file still names the previous
    checkpoint.
    """
    if step == self._last_saved_step:
      return None
    if not self._is_chief:
      prefix = os.path.join(self._save_dir, f'{_PREFIX}-{step}')
      try:
        self._ckpt.write(prefix)
      except _WRITE_ERRORS as e:
        raise self._SaveFailed(step, e) from None
      _Remove(self._save_dir)
      self._Saved(step)
      return None
    listed = self._Listed()
    kept = [s for s in listed if s < step]
    prefix = os.path.join(self._save_dir, f'{_PREFIX}-{step}')
    try:
      tf.io.gfile.makedirs(self._save_dir)
      if step in self._on_disk:  # Unlist it before replacing its files.
        _WriteState(self._save_dir, kept)
        self._listed = self._on_disk = kept
      for name in self._Files(lambda s: s == step):
        _Remove(name)  # Files of an unfinished save of this step.
      self._ckpt.write(prefix)
      _Stage('before_state', step)
      new = kept + [step]
      if self._max_to_keep:
        new = new[-self._max_to_keep:]
      _WriteState(self._save_dir, new)
    except _WRITE_ERRORS as e:
      raise self._SaveFailed(step, e) from None
    self._listed = self._on_disk = new
    _Stage('before_sweep', step)
    self._Prune(new)
    self._Saved(step)
    return prefix

  def _Saved(self, step):
    self._last_saved_step = step
    self._last_save_time = time.time()

  def _Files(self, drop):
    """Paths of the `ckpt-<step>` files and directories in the directory
    whose step satisfies `drop`, and leftover state-file temporaries."""
    out = []
    if not tf.io.gfile.isdir(self._save_dir):
      return out
    for name in sorted(tf.io.gfile.listdir(self._save_dir)):
      name = name.rstrip('/')
      m = _FILE.fullmatch(name)
      if (m and drop(int(m.group(1)))) or name.startswith(STATE_FILE + '.tmp'):
        out.append(os.path.join(self._save_dir, name))
    return out

  def _Prune(self, kept):
    """Deletes what the state file no longer lists (found in the
    directory, never read from a list on disk)."""
    for i, name in enumerate(self._Files(lambda s: s not in kept)):
      try:
        _Remove(name)
      except _WRITE_ERRORS as e:
        logging.warning('Could not remove %s: %s', name, ErrorText(e))
      if i == 0:
        _Stage('mid_sweep', kept[-1])

  def _SaveFailed(self, step, error):
    """Cleans up after a failed save of `step`; the CheckpointError."""
    partial = ([self._save_dir] if not self._is_chief else
               self._Files(lambda s: s == step))
    for name in partial:
      try:
        _Remove(name)
      except _WRITE_ERRORS as e:
        logging.warning('Could not remove %s: %s', name, ErrorText(e))
    latest = (os.path.join(self._save_dir, f'{_PREFIX}-{self._listed[-1]}')
              if self._is_chief and self._listed else None)
    detail = ErrorText(error).rsplit('; ', 1)[-1]
    kept = (f'the latest checkpoint is {latest}: free space there (or fix '
            'the error) and restart to resume from it' if latest else
            'no checkpoint was saved yet: free space there (or fix the '
            'error) and restart')
    return CheckpointError(
        f'could not save checkpoint {_PREFIX}-{step} in {self._save_dir}: '
        f'{detail}; its partial files were removed; {kept}')

  @property
  def last_saved_step(self):
    return self._last_saved_step
