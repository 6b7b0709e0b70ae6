"""Everything in tx that leans on another library's internals, each entry with the versions it
was checked against (CHECKED_AGAINST; tests/test_compat.py fails naming the entry when an
upgrade breaks one).

The bottom layer of tx: only the standard library is imported at module level, and jax, Orbax
etc. inside the functions that need them, so `import tx.compat` stays cheap (the CLI and
`tx plan` import it before JAX may start its backend).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterator

CHECKED_AGAINST = {
    'jax._src.distributed': 'jax 0.10.2',
    'jax._src.clusters': 'jax 0.10.2',
    'jax._src.xla_bridge': 'jax 0.10.2',
    'argparse subparsers': 'Python 3.11 argparse',
    'orbax CheckpointManager.metrics': 'orbax-checkpoint 0.12.8',
    'orphaned reads': 'Python 3.11 asyncio, orbax-checkpoint 0.12.8, tensorstore 0.1.86',
    'orbax save-thread log': 'orbax-checkpoint 0.12.8 (absl logging.exception per failed thread)',
    'without_torch': 'Python 3.11 import system, tensorboardX 2.6.5, torch 2.13.0',
    'cudnn refusals': 'jax 0.10.2 (jax.nn.dot_product_attention, cudnn/fused_attention_stablehlo)',
}


# ------------------------------------------------------ jax._src.distributed (jax 0.10.2)
# The coordination-service client that jax.distributed.initialize creates has no public handle.

def has_coordination_client() -> bool:
  """True when this process is connected to JAX's coordination service (jax.distributed);
  False with one process or a runtime that coordinates itself (a TPU pod slice)."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client is not None


def wait_at_barrier(barrier_id: str, timeout_s: float) -> None:
  """Blocks until every process reaches the coordination-service barrier `barrier_id`.

  Needs has_coordination_client(). Barrier ids must not repeat within a run.
  """
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  distributed.global_state.client.wait_at_barrier(barrier_id,
                                                   timeout_in_ms=int(timeout_s * 1000))


def exchange(key: str, value: str, timeout_s: float) -> list[str]:
  """Every process's `value` for `key`, in process order, through the coordination service's
  key-value store (no device collective: a process that never arrives is a timeout, not a
  hang). Needs has_coordination_client(); keys must not repeat within a run."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  state = distributed.global_state
  state.client.key_value_set(f'{key}/{state.process_id}', value)
  return [state.client.blocking_key_value_get(f'{key}/{i}', int(timeout_s * 1000))
          for i in range(state.num_processes)]


# ------------------------------------------------------------ jax._src.clusters (jax 0.10.2)
# JAX's cluster auto-detection (SLURM, Open MPI, Cloud TPU, Kubernetes) has no public query.

def detected_cluster() -> tuple[str, int, int] | None:
  """(cluster name, process count, this process's id) of the environment
  jax.distributed.initialize() would detect by itself (opt-in methods such as mpi4py
  excluded), or None."""
  from jax._src import clusters  # pylint: disable=g-import-not-at-top
  for env in clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access
    if not env.opt_in_only_method and env.is_env_present():
      return env.name, int(env.get_process_count()), int(env.get_process_id())
  return None


# ------------------------------------------------------- jax._src.xla_bridge (jax 0.10.2)

def backends_started() -> bool:
  """True once JAX has created its backends (from then on the device count is fixed).

  Never starts them itself. Older jax without backends_are_initialized: its `_backends` dict.
  """
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  started = getattr(xla_bridge, 'backends_are_initialized', None)
  return started() if started is not None else bool(getattr(xla_bridge, '_backends', True))


# ------------------------------------------------------------ argparse (Python 3.11)

def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
  """The parser of subcommand `name` of `parser` (made with add_subparsers / add_parser).

  argparse has no public lookup: this reads `parser._actions` for its `_SubParsersAction`,
  whose `choices` maps command names (and aliases) to their parsers. KeyError for an unknown
  name, ValueError when `parser` has no subcommands.
  """
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      return action.choices[name]
  raise ValueError(f'{parser.prog} has no subcommands')


# ------------------------------------------- Orbax CheckpointManager (orbax-checkpoint 0.12.8)
# On opening a directory, CheckpointManager reads every step's metrics through its public
# `metrics(step)` (from a thread pool, in _load_checkpoint_infos); one unreadable metrics file
# makes the constructor raise. Overriding `metrics` is the only hook into that read.

def checkpoint_manager(directory, *, unreadable_metrics: Callable[[int, Exception], None],
                       **kwargs):
  """An orbax.checkpoint.CheckpointManager(directory, **kwargs) whose metrics(step) returns
  None for a step with missing or unreadable metrics (the step is then unranked), after
  calling unreadable_metrics(step, error), instead of raising (which would fail start-up).

  unreadable_metrics may be called from Orbax's threads.
  """
  return _lenient_manager_class()(directory, unreadable_metrics=unreadable_metrics, **kwargs)


@functools.cache
def _lenient_manager_class():
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  class LenientMetricsManager(ocp.CheckpointManager):
    """CheckpointManager, except an unreadable metrics file leaves its step unranked."""

    def __init__(self, directory, *, unreadable_metrics, **kwargs):
      self._unreadable_metrics = unreadable_metrics  # before super(): it reads the metrics
      super().__init__(directory, **kwargs)

    def metrics(self, step: int):
      try:
        return super().metrics(step)
      except Exception as e:  # pylint: disable=broad-except
        self._unreadable_metrics(step, e)
        return None

  return LenientMetricsManager


# ---------------------------------------------------------- debris of a failed Orbax read
# (Python 3.11 asyncio, orbax-checkpoint 0.12.8, tensorstore 0.1.86)
# Orbax reads a step with one asyncio task per array in a private event loop that it closes when
# the first read fails; the other reads then fail unawaited. What they leave, by its text:

# asyncio's Future/Task __del__ logs '<Future|Task> exception was never retrieved' (logger
# 'asyncio', the exception in exc_info).
NEVER_RETRIEVED = 'exception was never retrieved'
# Orbax wraps a failed array read in the first message ('Encountered error while reading array
# index: ...'); a read failing after the loop moved on can surface as TensorStore's own error
# ('OUT_OF_RANGE: Error reading "w2/0.0" in OCDBT database at ...'), the second.
ORBAX_READ_ERRORS = ('Encountered error while reading array', 'in OCDBT database at')


def is_orbax_read_error(exc: BaseException | None) -> bool:
  """True for the error of one failed Orbax array read (either text above)."""
  return exc is not None and any(m in str(exc) for m in ORBAX_READ_ERRORS)


def is_callback_into_closed_loop(exc: BaseException | None, tb) -> bool:
  """True for TensorStore's completion callback hitting Orbax's closed loop: asyncio raises
  RuntimeError('Event loop is closed') from loop.call_soon_threadsafe."""
  if not (isinstance(exc, RuntimeError) and str(exc) == 'Event loop is closed'):
    return False
  names = []
  while tb is not None:
    names.append(tb.tb_frame.f_code.co_name)
    tb = tb.tb_next
  return 'call_soon_threadsafe' in names


def add_asyncio_log_filter(log_filter: logging.Filter) -> None:
  """Adds `log_filter` to the 'asyncio' logger (where never-retrieved exceptions are logged)."""
  logging.getLogger('asyncio').addFilter(log_filter)


def add_orbax_log_filter(log_filter: logging.Filter) -> None:
  """Adds `log_filter` to the logger Orbax reports its background-thread failures on (absl
  logging, i.e. the Python logger 'absl', each failed save thread with its traceback)."""
  logging.getLogger('absl').addFilter(log_filter)


def drop_unraisable(drop: Callable[[object], bool]) -> None:
  """Chains sys.unraisablehook (process-wide): an unraisable `u` (u.exc_value,
  u.exc_traceback, ...) for which drop(u) is true is dropped; any other reaches the hook
  installed before."""
  previous = sys.unraisablehook

  def hook(unraisable):
    if not drop(unraisable):
      previous(unraisable)

  sys.unraisablehook = hook


# ---------------------------------- without_torch (Python 3.11 import system, tensorboardX 2.6.5)

@contextlib.contextmanager
def without_torch() -> Iterator[None]:
  """Within the block `import torch` raises ImportError, unless torch is already imported.

  A None entry in sys.modules makes the import system raise ModuleNotFoundError; tensorboardX
  imports torch only to accept torch tensors and carries on without it. The entry is removed
  afterwards, so a later `import torch` works as before.
  """
  hide = 'torch' not in sys.modules
  if hide:
    sys.modules['torch'] = None
  try:
    yield
  finally:
    if hide:
      sys.modules.pop('torch', None)


# ------------------------------------------------------------------ cuDNN attention (jax 0.10.2)

def is_cudnn_refusal(exc: BaseException) -> bool:
  """True for the errors jax.nn.dot_product_attention(implementation='cudnn') raises for a
  call cuDNN does not take: ValueError (a shape, dtype or layout check), NotImplementedError
  (a head dim, sequence length or GPU generation its flash attention lacks) and
  RuntimeError('cuDNN is not detected.') (no cuDNN). Any other error is not a refusal."""
  if isinstance(exc, (ValueError, NotImplementedError)):
    return True
  return isinstance(exc, RuntimeError) and 'cuDNN is not detected' in str(exc)
