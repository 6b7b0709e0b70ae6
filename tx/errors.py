"""The error a user can cause from the command line, printed as one line with exit status 2.

Errors of the other parts live beside them (they sit lower in the import graph):
`tx.config.ConfigError` (a bad key or value), `tx.data.errors.DataError` (bad or missing
data), `tx.train.errors.CheckpointError` / `NonFiniteError`. Every command layer (tx.cli,
tx.bench, tx.runs, tx.sweep) may raise `UserError`; this module imports nothing.
A full disk is not the user's input but stops a run the same way: `DiskFullError`.
"""


class UserError(Exception):
  """Command-line misuse (a bad flag value, a missing directory); printed as one line."""


class DiskFullError(RuntimeError):
  """A write failed because its filesystem is full (or over quota); printed as one line with
  exit status 1. Nothing half-written is left behind: the latest complete checkpoint stays."""


_DISK_FULL_ERRNOS = (28, 122)  # ENOSPC, EDQUOT (Linux)
# TensorStore (Orbax's array writer) raises ValueError('RESOURCE_EXHAUSTED: ... No space left
# on device [os_error_code='28']') rather than an OSError.
_DISK_FULL_TEXT = ('No space left on device', 'Disk quota exceeded', "os_error_code='28'",
                   "os_error_code='122'")


def is_disk_full(error: BaseException | None) -> bool:
  """True if `error`, or an exception it was raised from, says the filesystem is full."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, DiskFullError):
      return True
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
      return True
    if any(text in str(error) for text in _DISK_FULL_TEXT):
      return True
    error = error.__cause__ or error.__context__
  return False
