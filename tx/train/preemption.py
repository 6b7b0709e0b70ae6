"""Preemption: SIGTERM or SIGINT asks the training loop to checkpoint and stop.

    with PreemptionGuard() as guard:
      for step in ...:
        ...train step...
        if guard.requested(step):
          save a checkpoint at `step`, then raise Preempted(guard.signal_name, step, workdir)

Single process: a signal handler sets a flag that the loop reads after each step, so the step in
flight finishes and the save is synchronous and complete before the process exits (a second
signal of the same kind stops at once, the usual escape hatch). Several processes: every process
must stop at the same step, so the loop asks JAX's preemption sync manager (started by
`jax.distributed.initialize`, which listens for SIGTERM itself), which picks the step all
processes save at; SIGINT then keeps its default behaviour.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """Training stopped on a signal after saving a checkpoint; the same command resumes it."""

  def __init__(self, signal_name: str, step: int, workdir):
    self.signal_name, self.step, self.workdir = signal_name, step, workdir
    self.exit_code = 128 + getattr(signal, signal_name, signal.SIGTERM)
    super().__init__(f'{signal_name} received: saved a checkpoint at step {step} in {workdir}; '
                     'run the same command again to resume from it')


class PreemptionGuard:
  """Context manager turning SIGTERM/SIGINT into `requested(step) -> True` at a safe step."""

  def __init__(self):
    self.signal_name: str | None = None
    self._previous: dict[int, object] = {}
    import jax  # pylint: disable=g-import-not-at-top  (the CLI imports this module before JAX)
    self._multi_process = jax.process_count() > 1

  def __enter__(self):
    if threading.current_thread() is threading.main_thread() and not self._multi_process:
      for sig in SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def _handle(self, signum, frame):
    if self.signal_name is not None:  # second signal: do what it would have done without us
      signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
      signal.raise_signal(signum)
      return
    self.signal_name = signal.Signals(signum).name

  def requested(self, step: int) -> bool:
    """True at the step where this run should checkpoint and stop. Call once after each step."""
    if self._multi_process:
      # as above
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      try:
        if multihost_utils.reached_preemption_sync_point(step):
          self.signal_name = self.signal_name or 'SIGTERM'
          return True
      except RuntimeError:  # the preemption service is off: no coordinated stop
        return False
      return False
    return self.signal_name is not None
