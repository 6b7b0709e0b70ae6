"""One writer per run directory: an exclusive `flock` on `<workdir>/.tx.lock`.

    with run_lock.hold(workdir):   # RunLocked (exit 2, one line) if another process writes it
      ...                          # write config.json, metrics, checkpoints, summary.json

`tx train` (and so each run of `tx sweep`) and `tx convert` take it before they write
anything in the run directory; readers (`tx eval`, `tx generate`, `tx compare`, `tx plan`)
never do, so they keep working while a run trains. In a multi-process run process 0 holds
it for the whole job.

The lock file records the holder's pid, host and start time (written after locking), so a
refused writer can name it. The lock itself is the kernel's, not the file's: the OS drops it
when the holder's process ends however it ends (SIGKILL, OOM killer, a crash), so no stale
lock is ever left behind and nothing has to be cleaned up; the file stays, and its content
means nothing while no one holds the lock.

What flock promises, and where:
- Local filesystems (ext4, xfs, btrfs, tmpfs): exclusive between all processes of the host.
- NFS: depends on the client. Linux >= 2.6.12 emulates flock with fcntl byte-range locks
  through the NFS lock manager, so it holds across hosts, unless the share is mounted with
  `local_lock=flock` / `local_lock=all` (or `nolock`), where it is local to one client and
  two hosts can both "hold" it. The lock manager may also lose locks when the server
  restarts. Other clients (BSD, macOS) differ again.
- Lustre: cluster-wide only with the `flock` mount option; with `localflock` it is per node,
  with `noflock` flock fails (a run then refuses to start rather than run unlocked).
- GPFS / Spectrum Scale: flock is cluster-wide in current releases; check your version.
On such filesystems, where the mount options are not yours to check, run one writing process
per run directory (a scheduler's job name per directory), or keep run directories on a
local disk and copy them out when done.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from tx.errors import UserError

LOCK_FILE = '.tx.lock'


class RunLocked(UserError):
  """Another process holds the run directory's lock (printed as one line, exit status 2)."""


class RunLock:
  """An exclusive, non-blocking flock on `directory/.tx.lock` (the directory must exist)."""

  def __init__(self, directory: str | Path):
    self.path = Path(directory) / LOCK_FILE
    self.created_file = False  # True when acquire() made the lock file (see `discard`)
    self._fd: int | None = None

  def acquire(self) -> RunLock:
    """Takes the lock and records this process in the file; RunLocked if another holds it."""
    self.created_file = not self.path.exists()
    # O_RDWR without O_TRUNC: the holder's record must survive until we hold the lock.
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = _read_holder(fd)
      os.close(fd)
      if e.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
        raise RunLocked(f'--workdir: cannot lock {self.path} ({os.strerror(e.errno)}); this '
                        'filesystem does not support flock: use a local directory') from None
      raise RunLocked(f'--workdir: {self.path.parent} is in use by {holder}; wait for it to '
                      'finish, stop it, or use another --workdir') from None
    record = {'pid': os.getpid(), 'host': socket.gethostname(),
              'since': datetime.datetime.now().astimezone().isoformat(timespec='seconds')}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + '\n').encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    """Drops the lock (a no-op when not held); the file stays."""
    if self._fd is not None:
      os.close(self._fd)  # closing the last descriptor releases the flock
      self._fd = None

  def discard(self) -> None:
    """Releases the lock and removes the lock file if acquire() created it (a run that
    leaves nothing behind)."""
    if self._fd is not None and self.created_file:
      self.path.unlink(missing_ok=True)
    self.release()

  def __enter__(self) -> RunLock:
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _read_holder(fd: int) -> str:
  """'process 123 on host h since 2025-01-01T10:00:00+00:00' from the lock file's record."""
  try:
    record = json.loads(os.pread(fd, 4096, 0).decode())
    return f'process {record["pid"]} on host {record["host"]} since {record["since"]}'
  except (OSError, ValueError, KeyError, TypeError):
    return 'another process (it has not recorded itself yet)'


class JobLock:
  """The run directory's lock held by process 0 for the whole job; every process raises
  RunLocked when process 0 could not take it (so none of them waits in a collective)."""

  def __init__(self, directory: str | Path):
    self.directory = Path(directory)
    self.lock = RunLock(directory) if jax.process_index() == 0 else None

  def acquire(self) -> JobLock:
    """Takes the lock on process 0; RunLocked on every process if that failed."""
    error = None
    if self.lock is not None:
      try:
        self.lock.acquire()
      except RunLocked as e:
        error = e
    if jax.process_count() > 1:
      ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
      if not ok and error is None:
        raise RunLocked(f'--workdir: process 0 could not lock {self.directory} (see its '
                        'error): another job writes there; use another --workdir')
    if error is not None:
      raise error
    return self

  def release(self) -> None:
    """Drops the lock (process 0)."""
    if self.lock is not None:
      self.lock.release()

  def discard(self) -> None:
    """See RunLock.discard (process 0)."""
    if self.lock is not None:
      self.lock.discard()

  def __enter__(self) -> JobLock:
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def hold(directory: str | Path) -> JobLock:
  """`with hold(workdir):` the job's writer lock on `workdir` (see the module docstring)."""
  return JobLock(directory)
