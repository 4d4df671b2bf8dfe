"""Writes that leave the previous state when they fail (a full disk, a
read-only directory): build next to the target, then rename into place.

Locally a file is written to a fresh temporary sibling (tempfile.mkstemp)
and renamed over the target; a directory is built in a fresh sibling
(tempfile.mkdtemp), the previous one moved into another fresh sibling and
deleted only once the new one is in place. Only what these functions made
is ever deleted. Object stores such as GCS (`scheme://` paths) have no
directory rename: there, files are written in place.

Errors are the file system's: OSError locally, tf.errors.OpError through
tf.io.gfile; `Reason` gives either's one-line cause for a message.
"""

import errno
import os
import re
import shutil
import tempfile

import tensorflow as tf

# TF op errors: `{{function_node ...}} <path>; <cause> [Op:Name] name: ...`.
_FUNCTION_PREFIX = re.compile(r'^\{\{function_node [^}]*\}\}\s*')
_OP_SUFFIX = re.compile(r'\s*\[Op:[^\]]*\].*$')

# What a failed write raises: OSError (Python's own files) or an OpError
# (tf.io.gfile, tf.summary, tf.saved_model).
ERRORS = (OSError, tf.errors.OpError)


def IsRemote(path):
  return '://' in str(path)


def Reason(error):
  """The one-line cause of a failed write, e.g. 'No space left on device'
  (TF prefixes its messages with the op and the path, and may add lines)."""
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  text = (getattr(error, 'message', None) or str(error)).strip()
  first = text.splitlines()[0] if text else type(error).__name__
  first = _OP_SUFFIX.sub('', _FUNCTION_PREFIX.sub('', first))
  return first.rsplit('; ', 1)[-1].strip()


def _Umasked(mode):
  umask = os.umask(0)
  os.umask(umask)
  return mode & ~umask


def WriteText(path, text):
  """Writes `text` (str) to `path`; the previous file stays on failure."""
  if IsRemote(path):
    with tf.io.gfile.GFile(path, 'w') as f:
      f.write(text)
    return
  parent, name = os.path.split(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=parent, prefix=f'.{name}.tmp-')
  try:
    with os.fdopen(fd, 'w', encoding='utf-8', newline='\n') as f:
      f.write(text)
    os.chmod(tmp, _Umasked(0o666))  # mkstemp makes it 0o600.
    os.replace(tmp, path)
  except BaseException:
    if os.path.lexists(tmp):
      os.remove(tmp)  # Made by mkstemp above.
    raise


def ReplaceDir(path, build, tag='tmp'):
  """Calls build(directory) on a fresh directory, which then replaces
  `path` (missing, or a directory the caller may replace); returns build's
  result. On failure `path` is as it was and no temporary is left.

  Args:
    path: the directory to write (NotADirectoryError if it is a file).
    build: fills the directory it is given (its only argument).
    tag: names the temporaries (`.<name>.<tag>-XXXX`, `.<name>.replaced-`).
  """
  if IsRemote(path):
    tf.io.gfile.makedirs(path)
    return build(path)
  if os.path.lexists(path) and not os.path.isdir(path):
    # A file (or a link to one) is never replaced by a directory.
    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
  parent, name = os.path.split(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=f'.{name}.{tag}-')
  try:
    result = build(tmp)
    os.chmod(tmp, _Umasked(0o777))  # mkdtemp makes it 0o700.
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)  # Made by mkdtemp above.
    raise
  if not os.path.lexists(path):
    os.rename(tmp, path)
    return result
  aside = None
  try:
    aside = tempfile.mkdtemp(dir=parent, prefix=f'.{name}.replaced-')
    os.rename(path, os.path.join(aside, name))
  except BaseException:
    if aside:
      os.rmdir(aside)  # Made by mkdtemp above; still empty.
    shutil.rmtree(tmp, ignore_errors=True)  # Made by mkdtemp above.
    raise
  try:
    os.rename(tmp, path)
  except BaseException:
    os.rename(os.path.join(aside, name), path)
    os.rmdir(aside)
    shutil.rmtree(tmp, ignore_errors=True)  # Made by mkdtemp above.
    raise
  shutil.rmtree(aside)  # Made by mkdtemp above; holds the replaced copy.
  return result
