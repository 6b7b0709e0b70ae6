"""Keeps the debris of a failed Orbax read off stderr.

Orbax reads a step with one asyncio task per array, gathered in a private event loop that it
closes when the first read fails. The other reads of the damaged step then fail unawaited:
asyncio logs "Task (or Future) exception was never retrieved", Python reports their coroutines as
"Exception ignored in", and TensorStore's completion callbacks hit the closed loop ("Event loop
is closed"), at any later moment, often at interpreter exit. restore() already reports the
step's failure once (and falls back or raises CheckpointError), so these tracebacks are noise
that would bury a command's one-line error. Only those three shapes are dropped; anything else
reaches the previous hooks unchanged.
"""

from __future__ import annotations

import logging
import sys

# Orbax wraps a failed array read in the first message; a read that fails after the loop
# has moved on can surface as TensorStore's own error (e.g. 'OUT_OF_RANGE: Error reading
# "w2/0.0" in OCDBT database at ...'), which is the second.
_READ_ERRORS = ('Encountered error while reading array', 'in OCDBT database at')


def _is_read_error(exc) -> bool:
  return exc is not None and any(m in str(exc) for m in _READ_ERRORS)


def _is_callback_into_closed_loop(exc, tb) -> bool:
  if not (isinstance(exc, RuntimeError) and str(exc) == 'Event loop is closed'):
    return False
  names = []
  while tb is not None:
    names.append(tb.tb_frame.f_code.co_name)
    tb = tb.tb_next
  return 'call_soon_threadsafe' in names


class _NeverRetrievedReadErrors(logging.Filter):

  def filter(self, record):
    first_line = record.getMessage().split('\n', 1)[0]
    exc = record.exc_info[1] if record.exc_info else None
    return not ('exception was never retrieved' in first_line and _is_read_error(exc))


_FILTER = _NeverRetrievedReadErrors()
_installed = False


def silence() -> None:
  """Installs the asyncio log filter and the unraisable hook, once per process."""
  global _installed
  if _installed:
    return
  _installed = True
  logging.getLogger('asyncio').addFilter(_FILTER)
  previous = sys.unraisablehook

  def hook(unraisable):
    exc = unraisable.exc_value
    if _is_read_error(exc) or _is_callback_into_closed_loop(exc, unraisable.exc_traceback):
      return
    previous(unraisable)

  sys.unraisablehook = hook
