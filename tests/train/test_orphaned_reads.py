"""tx/train/orphaned_reads.py: which 'never retrieved' asyncio records are dropped."""

import logging

from tx.train import orphaned_reads


def _record(message, exc):
  return logging.LogRecord('asyncio', logging.ERROR, __file__, 1, message, None,
                           (type(exc), exc, None))


def test_read_debris_of_a_damaged_step_is_dropped_in_both_shapes():
  keep = orphaned_reads._NeverRetrievedReadErrors().filter
  orbax = ValueError('Encountered error while reading array index (0, 0) for "w1"')
  tensorstore = ValueError('OUT_OF_RANGE: Error reading "w2/0.0" in OCDBT database at local '
                           'file "/tmp/x/1/state/": Requested byte range [75818, 90978) is not '
                           'valid for value of size 100')
  for message in ('Task exception was never retrieved', 'Future exception was never retrieved'):
    assert not keep(_record(message, orbax))
    assert not keep(_record(message, tensorstore))


def test_an_unawaited_write_that_found_the_disk_full_is_dropped():
  """A save's async metadata write failing with ENOSPC after the save was reported as one
  DiskFullError line (tests/train/test_disk_full.py runs the real case)."""
  import errno  # pylint: disable=g-import-not-at-top
  keep = orphaned_reads._NeverRetrievedReadErrors().filter
  full = OSError(errno.ENOSPC, 'No space left on device')
  assert not keep(_record('Future exception was never retrieved', full))
  assert keep(_record('Future exception was never retrieved', OSError(errno.EACCES, 'denied')))
  assert keep(_record('something else', full))


def test_anything_else_reaches_the_log():
  keep = orphaned_reads._NeverRetrievedReadErrors().filter
  assert keep(_record('Future exception was never retrieved', ValueError('a real bug')))
  assert keep(_record('something else', ValueError('in OCDBT database at local file "x"')))


def test_unraisable_read_debris_is_dropped_and_nothing_else():
  import asyncio
  import types
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    closed = e
  debris = orphaned_reads._is_read_debris
  unraisable = lambda exc: types.SimpleNamespace(exc_value=exc, exc_traceback=exc.__traceback__)
  assert debris(unraisable(closed))
  assert debris(unraisable(ValueError('Encountered error while reading array index (0,)')))
  assert not debris(unraisable(RuntimeError('Event loop is closed')))  # not from a callback
  assert not debris(unraisable(ValueError('a real bug')))
