"""One trainer per logdir: an exclusive lock a crashed run does not leave.

`Hold(logdir)` takes `fcntl.flock` on `<logdir>/trainer.lock` (created if
needed, never through a symbolic link) for the whole training run and
writes the holder (pid, host, start time) into it; a second trainer gets
LockError naming that holder. The kernel drops the lock when the holder's
process ends in any way (SIGKILL included), so a crashed run leaves at most
a stale file, which the next run simply locks and rewrites. A run that ends
deletes the file while still holding the lock; an acquirer that locked a
file already deleted (it opened it just before) sees that the path no
longer names its file and tries again.

Only training takes it (Lingvo's evaler and decoder jobs read checkpoints
beside a running trainer; eval, decode and export here do too). A logdir
on a remote file system (`gs://...`) is not locked: flock needs a local
(or NFS) file.
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
import time

LOCK_FILE = 'trainer.lock'


class LockError(RuntimeError):
  """The logdir is held by another trainer, or cannot be locked."""


def _Clean(text, limit=100):
  """A value read from the lock file, as one short line."""
  return ' '.join(str(text).split())[:limit]


def _Holder(fd):
  """`pid P on HOST, started T` from a held lock file, or what we know."""
  try:
    holder = json.loads(os.pread(fd, 4096, 0).decode('utf-8'))
    pid, host, started = holder['pid'], holder['host'], holder['started']
  except (OSError, ValueError, TypeError, KeyError):
    return 'a process that has not recorded itself yet'
  return f'pid {_Clean(pid)} on {_Clean(host)}, started {_Clean(started)}'


def _MakeDirs(logdir):
  """Creates `logdir` and missing parents; returns those it created."""
  created = []
  path = os.path.abspath(logdir)
  while not os.path.exists(path):
    created.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  os.makedirs(logdir, exist_ok=True)
  return created


def _Acquire(logdir, path):
  """The fd of `path`, exclusively locked, with this process recorded."""
  for _ in range(100):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _Holder(fd)
      os.close(fd)
      raise LockError(
          f'--logdir {logdir} is in use by another trainer ({holder}); wait '
          'for it to finish (or stop it) or choose another --logdir'
      ) from None
    except BaseException:
      os.close(fd)
      raise
    mine = os.fstat(fd)
    try:
      now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
      now = None
    if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev,
                                                        mine.st_ino):
      record = json.dumps({
          'pid': os.getpid(), 'host': socket.gethostname(),
          'started': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})
      os.ftruncate(fd, 0)
      os.pwrite(fd, (record + '\n').encode('utf-8'), 0)
      return fd
    os.close(fd)  # Deleted by the run that held it: lock the new file.
    os.makedirs(logdir, exist_ok=True)
  raise LockError(f'--logdir {logdir}: could not lock {path} (it keeps '
                  'being replaced)')


@contextlib.contextmanager
def Hold(logdir):
  """Holds `logdir`'s lock for the `with` block; LockError if another
  trainer holds it or it cannot be created. Directories it created are
  removed again if they are still empty at the end (a refused or failed
  run leaves nothing)."""
  if '://' in logdir:
    yield None
    return
  path = os.path.join(logdir, LOCK_FILE)
  try:
    created = _MakeDirs(logdir)
    fd = _Acquire(logdir, path)
  except OSError as e:
    why = e.strerror or str(e)
    if e.errno == errno.ELOOP:
      why = 'it is a symbolic link'
    raise LockError(f'--logdir {logdir}: cannot lock {path}: {why}; remove '
                    'it or choose another --logdir') from None
  try:
    yield path
  finally:
    with contextlib.suppress(OSError):
      os.unlink(path)
    for directory in created:  # Deepest first.
      try:
        os.rmdir(directory)
      except OSError:
        break
    os.close(fd)
