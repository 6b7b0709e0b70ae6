"""Keeps the debris of a failed Orbax read off stderr.

Orbax reads a step with one asyncio task per array, gathered in a private event loop that it
closes when the first read fails. The other reads of the damaged step then fail unawaited:
asyncio logs "Task (or Future) exception was never retrieved", Python reports their coroutines as
"Exception ignored in", and TensorStore's completion callbacks hit the closed loop ("Event loop
is closed"), at any later moment, often at interpreter exit. restore() already reports the
step's failure once (and falls back or raises CheckpointError), so these tracebacks are noise
that would bury a command's one-line error. Only those three shapes are dropped; anything else
reaches the previous hooks unchanged. How each shape is recognised (the libraries' message
texts) and how the hooks are installed live in tx/compat.py.
"""

from __future__ import annotations

import logging

from tx import compat


class _NeverRetrievedReadErrors(logging.Filter):

  def filter(self, record):
    first_line = record.getMessage().split('\n', 1)[0]
    exc = record.exc_info[1] if record.exc_info else None
    return not (compat.NEVER_RETRIEVED in first_line and compat.is_orbax_read_error(exc))


def _is_read_debris(unraisable) -> bool:
  exc = unraisable.exc_value
  return (compat.is_orbax_read_error(exc)
          or compat.is_callback_into_closed_loop(exc, unraisable.exc_traceback))


_FILTER = _NeverRetrievedReadErrors()
_installed = False


def silence() -> None:
  """Installs the asyncio log filter and the unraisable hook, once per process."""
  global _installed
  if _installed:
    return
  _installed = True
  compat.add_asyncio_log_filter(_FILTER)
  compat.drop_unraisable(_is_read_debris)
