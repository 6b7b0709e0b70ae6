"""Keeps the debris of a failed Orbax read, or of a save that filled the disk, off stderr.

Orbax reads a step with one asyncio task per array, gathered in a private event loop that it
closes when the first read fails. The other reads of the damaged step then fail unawaited:
asyncio logs "Task (or Future) exception was never retrieved", Python reports their coroutines as
"Exception ignored in", and TensorStore's completion callbacks hit the closed loop ("Event loop
is closed"), at any later moment, often at interpreter exit. restore() already reports the
step's failure once (and falls back or raises CheckpointError), so these tracebacks are noise
that would bury a command's one-line error. Only those three shapes are dropped; anything else
reaches the previous hooks unchanged. How each shape is recognised (the libraries' message
texts) and how the hooks are installed live in tx/compat.py.

A save that fills the disk leaves the same closed-loop callbacks, and Orbax logs each of its
failed background threads with a traceback (three or four per save) before the error reaches
`wait()`; the Checkpointer reports it there as one DiskFullError line, so those log records
are dropped too (`silence()` covers both; only records whose error says the disk is full). The
save's other writes (Orbax's async metadata files) can fail the same way unawaited, and asyncio
then reports them as never retrieved when they are collected, sometimes after the error line:
those records are dropped when their error says the disk is full.
"""

from __future__ import annotations

import logging

from tx import compat
from tx.errors import is_disk_full


class _NeverRetrievedReadErrors(logging.Filter):
  """Drops asyncio's 'never retrieved' records of a failed read, or of a write that found the
  disk full (both already reported once)."""

  def filter(self, record):
    first_line = record.getMessage().split('\n', 1)[0]
    exc = record.exc_info[1] if record.exc_info else None
    return not (compat.NEVER_RETRIEVED in first_line
                and (compat.is_orbax_read_error(exc) or is_disk_full(exc)))


class _DiskFullSaveThreads(logging.Filter):

  def filter(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    return not (record.levelno >= logging.ERROR and is_disk_full(exc))


def _is_read_debris(unraisable) -> bool:
  exc = unraisable.exc_value
  return (compat.is_orbax_read_error(exc)
          or compat.is_callback_into_closed_loop(exc, unraisable.exc_traceback))


_FILTER = _NeverRetrievedReadErrors()
_SAVE_FILTER = _DiskFullSaveThreads()
_installed = False


def silence() -> None:
  """Installs the log filters and the unraisable hook, once per process."""
  global _installed
  if _installed:
    return
  _installed = True
  compat.add_asyncio_log_filter(_FILTER)
  compat.add_orbax_log_filter(_SAVE_FILTER)
  compat.drop_unraisable(_is_read_debris)
