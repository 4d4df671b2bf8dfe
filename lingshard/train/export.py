"""Export machinery: writes a task's export module (a tf.Module) as a
SavedModel, safely.

The task builds the module (`BaseTask.CreateExportModule`, e.g.
`lingshard.models.mt_export.Translator`); it has `Signatures()` ->
{name: concrete function}, saved as the SavedModel's signatures.

The export directory also holds MARKER (JSON: model, step, ...), which
identifies it as ours: `Export` replaces such a directory (or an empty or
missing one) but refuses any other non-empty directory unless
`overwrite`, and never the working, home or root directory, one that
holds the logdir, or a non-export directory inside the logdir (its
checkpoints in train/, eval and decode outputs), whatever `overwrite`.
Locally the SavedModel is built in a fresh temporary sibling and renamed
into place; a replaced directory is first moved into another fresh
sibling, deleted only once the new export is in place (atomic.ReplaceDir).
A failed write (a full disk) is one line, ExportWriteError, and leaves
the directory as it was.
"""

import json
import os

import tensorflow as tf

from lingshard.train import atomic

MARKER = 'lingshard_export.json'
SAVED_MODEL = 'saved_model.pb'


class ExportDirError(ValueError):
  """An export destination that Export refuses to replace."""


# ------------------------------------------------------------ destination
def IsExport(path):
  """Whether directory `path` holds an export of ours (MARKER + SavedModel)."""
  return (tf.io.gfile.exists(os.path.join(path, MARKER)) and
          tf.io.gfile.exists(os.path.join(path, SAVED_MODEL)))


def _Contains(parent, child):
  """Whether `child` is `parent` or inside it (both real, absolute)."""
  return os.path.commonpath([parent, child]) == parent


def _CheckProtected(flag_value, path, logdir):
  """ExportDirError if replacing `path` would delete a directory we must
  keep: root, the working or home directory, the logdir, an ancestor, or
  a non-empty directory inside the logdir that is not an export. Paths are
  compared after resolving `..` and symbolic links."""
  real = os.path.realpath(path)
  kept = [('the root directory', os.path.realpath(os.sep)),
          ('the working directory', os.path.realpath(os.getcwd())),
          ('the home directory', os.path.realpath(os.path.expanduser('~')))]
  if logdir and '://' not in logdir:
    kept.append(('the logdir', os.path.realpath(logdir)))
  for what, kept_path in kept:
    if real == kept_path:
      raise ExportDirError(f'--export_dir {flag_value} would delete {what}; '
                           'pass a new or empty directory')
  for what, kept_path in kept[1:]:
    if _Contains(real, kept_path):
      raise ExportDirError(f'--export_dir {flag_value} would delete {what} '
                           f'{kept_path} inside it; pass a new or empty '
                           'directory')
  # Inside the logdir only our own exports are replaced, even with
  # --export_overwrite: train/ (the checkpoints), eval and decode outputs
  # are the run's.
  logdir_real = kept[-1][1] if kept[-1][0] == 'the logdir' else None
  if (logdir_real and _Contains(logdir_real, real) and os.path.isdir(real)
      and os.listdir(real) and not IsExport(real)):
    raise ExportDirError(f'--export_dir {flag_value} would delete {real}, '
                         'a directory of the logdir that is not a lingshard '
                         'export; pass a new or empty directory')


def _CheckReplaceable(flag_value, path, overwrite):
  """ExportDirError unless `path` is missing, empty, ours or `overwrite`."""
  if not tf.io.gfile.exists(path):
    return
  if not tf.io.gfile.isdir(path):
    raise ExportDirError(f'--export_dir {flag_value} is a file; pass a '
                         'directory path')
  if overwrite or not tf.io.gfile.listdir(path) or IsExport(path):
    return
  raise ExportDirError(f'--export_dir {flag_value} is not empty and is not '
                       'a lingshard export; pass --export_overwrite to '
                       'replace it')


def CheckExportDir(export_dir, overwrite=False, logdir=None):
  """The path Export would write (`~` expanded locally); ExportDirError if
  Export must refuse it (see Export's args)."""
  if '://' in export_dir:
    _CheckReplaceable(export_dir, export_dir, overwrite)
    return export_dir
  path = os.path.expanduser(export_dir)
  _CheckProtected(export_dir, path, logdir)
  _CheckReplaceable(export_dir, path, overwrite)
  return path


class ExportWriteError(ExportDirError):
  """The file system refused the export (full disk, read-only, ...)."""


def _Save(module, signatures, directory, metadata):
  tf.saved_model.save(module, directory, signatures=signatures)
  with tf.io.gfile.GFile(os.path.join(directory, MARKER), 'w') as f:
    f.write(json.dumps(dict(metadata or {}), sort_keys=True) + '\n')


def Export(module, export_dir, overwrite=False, logdir=None, metadata=None):
  """Writes the SavedModel of `module` and MARKER to `export_dir`; returns
  its path.

  Args:
    module: a tf.Module with `Signatures()` -> {name: concrete function}.
    export_dir: destination; `~` is expanded. Missing, empty or a previous
      export (IsExport): replaced; any other directory: ExportDirError
      unless `overwrite`. Never the root, working or home directory, the
      logdir or a directory containing one of them, nor a non-empty
      directory inside the logdir that is not an export.
    overwrite: replace a non-empty directory that is not an export.
    logdir: the run's logdir (kept, see above).
    metadata: JSON-able dict written to MARKER (e.g. model, step).

  Locally the export is built in a temporary sibling and renamed
  (atomic.ReplaceDir), so a crash never leaves a half-written export at
  `export_dir`; object stores such as GCS have no directory rename: there
  it is written in place.

  Raises:
    ExportDirError: `export_dir` must not be replaced (nothing written);
      ExportWriteError (a subclass, one line) if writing failed, e.g. on
      a full disk (`export_dir` is left as it was).
  """
  export_dir = CheckExportDir(export_dir, overwrite, logdir)
  signatures = module.Signatures()  # Traced before anything is written.
  try:
    atomic.ReplaceDir(export_dir, lambda d: _Save(module, signatures, d,
                                                  metadata), tag='export')
  except atomic.ERRORS as e:
    raise ExportWriteError(
        f'cannot write the export to {export_dir}: {atomic.Reason(e)}; '
        'nothing was changed there: free space or pass another '
        '--export_dir') from None
  return export_dir


def DefaultExportDir(logdir, step):
  return os.path.join(logdir, 'export', f'{step:08d}')
