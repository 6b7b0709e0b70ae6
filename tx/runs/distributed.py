"""Several processes from the command line: `jax.distributed` for `tx train`, `sweep`, `eval`.

    tx train EXP --workdir DIR --coordinator HOST:PORT --num-processes N --process-id I

The same three values may come from $TX_COORDINATOR, $TX_NUM_PROCESSES and $TX_PROCESS_ID
(flags win). Without them, where JAX detects a cluster by itself (SLURM, Open MPI, Cloud TPU
pods, Kubernetes) and it has more than one process, `jax.distributed.initialize()` reads
everything from that environment. One process (the default) initializes nothing.

Only process 0 prints, logs and writes summaries and plots; every process writes its own
checkpoint shards. A coordinator that cannot be reached within --coordinator-timeout, and
processes started with different configs, are one-line errors (exit 2), not hangs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading

from tx import compat
from tx.errors import UserError

ENV = {'coordinator': 'TX_COORDINATOR', 'num_processes': 'TX_NUM_PROCESSES',
       'process_id': 'TX_PROCESS_ID'}
DEFAULT_TIMEOUT_S = 300
_JAX_GRACE_S = 30  # JAX's own connect deadline, past ours


def add_flags(parser: argparse.ArgumentParser) -> None:
  """The flags of a command that may run as one of several processes."""
  g = parser.add_argument_group('several processes (jax.distributed; default: auto-detect)')
  g.add_argument('--coordinator', default=None, metavar='HOST:PORT',
                 help=f'process 0\'s address, the same for every process (${ENV["coordinator"]})')
  g.add_argument('--num-processes', type=int, default=None, metavar='N',
                 help=f'how many processes run this job (${ENV["num_processes"]})')
  g.add_argument('--process-id', type=int, default=None, metavar='I',
                 help=f'this process, 0..N-1 (${ENV["process_id"]})')
  g.add_argument('--coordinator-timeout', type=int, default=DEFAULT_TIMEOUT_S, metavar='S',
                 help='seconds to wait for every process to connect (default 300)')


def explicit_settings(args) -> tuple[str | None, int | None, int | None]:
  """(coordinator, num_processes, process_id) from the flags, else the TX_* variables."""
  values = []
  for name, var in ENV.items():
    value = getattr(args, name, None)
    if value is None and os.environ.get(var):
      text = os.environ[var]
      if name != 'coordinator':
        try:
          value = int(text)
        except ValueError:
          raise UserError(f'${var}={text!r}: must be an integer') from None
      else:
        value = text
    values.append(value)
  return tuple(values)


def initialize(args, command: str = 'train') -> int:
  """Connects this process to the others when it is one of several; returns the count.

  Must run before JAX starts its backends (before any jax.devices() or computation).
  """
  import jax  # pylint: disable=g-import-not-at-top  (the CLI imports JAX only when it needs it)
  coordinator, count, pid = explicit_settings(args)
  timeout = getattr(args, 'coordinator_timeout', DEFAULT_TIMEOUT_S)
  if timeout <= 0:
    raise UserError(f'--coordinator-timeout: must be > 0 seconds, got {timeout}')
  if count is not None:
    if count < 1:
      raise UserError(f'--num-processes: must be >= 1, got {count}')
    if count == 1:
      return 1
    if coordinator is None or pid is None:
      raise UserError('--num-processes > 1 needs --coordinator HOST:PORT and --process-id I '
                      f'(or ${ENV["coordinator"]} and ${ENV["process_id"]}) on every process')
    if not 0 <= pid < count:
      raise UserError(f'--process-id: must be in 0..{count - 1}, got {pid}')
    if ':' not in coordinator:
      raise UserError(f'--coordinator: {coordinator!r} must be HOST:PORT')
    where = f'the coordinator {coordinator} (process {pid} of {count})'
    kwargs = dict(coordinator_address=coordinator, num_processes=count, process_id=pid)
  else:
    detected = compat.detected_cluster()
    if detected is None or detected[1] <= 1:
      return 1
    name, count, _ = detected
    where = f'the coordinator of this {name} job ({count} processes, auto-detected)'
    kwargs = {}
  advice = ('start every process with the same --coordinator, reachable from this host, or '
            'raise --coordinator-timeout')
  # JAX aborts the process (a C++ fatal error, no exception) when its own deadline passes, so
  # a watchdog with a shorter one says why in one line and exits first.
  connected = threading.Event()

  def watchdog():
    if not connected.wait(timeout):
      print(f'tx {command}: error: not every process connected to {where} within {timeout} s; '
            f'{advice}', file=sys.stderr, flush=True)
      os._exit(2)  # pylint: disable=protected-access

  threading.Thread(target=watchdog, name='tx-connect-watchdog', daemon=True).start()
  try:
    jax.distributed.initialize(initialization_timeout=timeout + _JAX_GRACE_S, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise UserError(f'could not connect to {where} ({first}); {advice}') from None
  finally:
    connected.set()
  return jax.process_count()


def check_same_config(config_dict: dict, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
  """UserError (one line) unless every process resolved the same config (a no-op alone)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1 or not compat.has_coordination_client():
    return
  digest = hashlib.sha256(json.dumps(config_dict, sort_keys=True, default=str).encode())
  try:
    digests = compat.exchange('tx/config', digest.hexdigest()[:16], timeout_s)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f'processes did not all reach the config check within {timeout_s} s '
                    f'({str(e).strip().splitlines()[0][:160] if str(e).strip() else e!r}); one '
                    'of them probably failed: see its output') from None
  differing = [i for i, d in enumerate(digests) if d != digests[0]]
  if differing:
    raise UserError(f'process {differing[0]} resolved a different config than process 0; start '
                    'every process with the same experiment, --set overrides and '
                    '--experiments sources')


def every_process_value(key: str, value, timeout_s: float = DEFAULT_TIMEOUT_S) -> list:
  """Every process's `value` (JSON-serialisable), in process order, on every process; [value]
  when alone. For choices each process makes on its own that must agree (`tx tune`'s model
  setting: each host reads its own cache, and every process must compile the same program)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1 or not compat.has_coordination_client():
    return [value]
  try:
    values = compat.exchange(key, json.dumps(value, sort_keys=True), timeout_s)
  except Exception:  # pylint: disable=broad-except
    raise UserError(f'processes did not all reach {key!r} within {timeout_s} s; one of them '
                    'probably failed: see its output') from None
  return [json.loads(v) for v in values]


def process_id_without_connecting(args) -> int:
  """This process's id among several (flags, TX_* variables or a detected cluster), without
  initializing anything; 0 when alone. For commands that run on process 0 only (`tx plan`)."""
  _, count, pid = explicit_settings(args)
  if count is not None:
    return pid or 0
  detected = compat.detected_cluster()
  return detected[2] if detected is not None and detected[1] > 1 else 0


def is_main_process() -> bool:
  """True on process 0 (and when alone): the one that prints."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0
