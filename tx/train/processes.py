"""Keeping the processes of a multi-host run in step outside of compiled collectives."""

from __future__ import annotations

import itertools

import jax

from tx import compat

DEFAULT_TIMEOUT_S = 30 * 60
_calls = itertools.count()  # barrier ids must not repeat; every process counts alike


def wait_for_all(name: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
  """Blocks until every process reaches the barrier `name` (a no-op with one process).

  The first cross-process collective (an Orbax barrier, a sharded step) sets up its
  transport with a fixed 30 s deadline, so processes that finish slow host-side work
  (preparing or tokenizing data, waiting for another process to do so) at different
  times must meet here first, under a generous timeout.
  """
  if jax.process_count() == 1:
    return
  if not compat.has_coordination_client():  # multi-process without jax.distributed (a TPU pod)
    return
  compat.wait_at_barrier(f'tx:{next(_calls)}:{name}', timeout_s)
