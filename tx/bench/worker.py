"""Runs one measurement in a fresh process and prints its result as the last stdout line.

    python -m tx.bench.worker tx.bench.tx_side:train '{"family": "decoder", ...}'

The result dict gets `peak_rss_bytes` (the process's high-water resident set, so the
framework, the model, the optimizer state and the step's activations all count) and
`threads`. `run_isolated` is the parent side: it starts the worker with the thread count
pinned (XLA's CPU client and torch both read it) and returns the dict.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import resource
import signal
import subprocess
import sys

from tx import malloc_tuning

MARK = 'TX_BENCH_RESULT '
_PARENT = 'TX_BENCH_PARENT'  # the pid of the process that started the worker
_PR_SET_PDEATHSIG = 1


class BenchError(RuntimeError):
  """A measurement process failed; the message holds the tail of its output."""


PLATFORMS = ('cpu', 'gpu')


def thread_env(threads: int, platform: str = 'cpu') -> dict[str, str]:
  """Environment pinning both frameworks to `threads` CPU threads and one device: the CPU
  (platform 'cpu': JAX_PLATFORMS=cpu unless set) or the first GPU (platform 'gpu':
  JAX_PLATFORMS=cuda; torch's side reads spec['platform']).

  It also sets tx's glibc malloc tunables (tx/malloc_tuning.py) where they apply, for tx
  and the peer alike; `TX_MALLOC_TUNING=0` measures without. A persistent compilation
  cache ($JAX_COMPILATION_CACHE_DIR) is left out: a cached program would time its load,
  not its compile.
  """
  if platform not in PLATFORMS:
    raise ValueError(f'platform must be one of {PLATFORMS}, got {platform!r}')
  env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  if malloc_tuning.would_help(env):
    env = malloc_tuning.tuned_env(env)
  flags = [f for f in env.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  jax_platforms = 'cuda' if platform == 'gpu' else env.get('JAX_PLATFORMS', '') or 'cpu'
  env.update(XLA_FLAGS=' '.join(flags), JAX_PLATFORMS=jax_platforms,
             OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
             TX_BENCH_THREADS=str(threads), TF_CPP_MIN_LOG_LEVEL='3')
  return env


def run_isolated(target: str, spec: dict, *, threads: int, timeout: float = 1800,
                 env: dict[str, str] | None = None, platform: str = 'cpu') -> dict:
  """Result dict of `target` ('module:function') run on `spec` (with `threads` and
  `platform` added) in a new process; `env` entries are set on top of
  `thread_env(threads, platform)` (e.g. the XLA_FLAGS `tx tune` times)."""
  spec = dict(spec, threads=threads, platform=platform)
  cmd = [sys.executable, '-m', 'tx.bench.worker', target, json.dumps(spec)]
  env = {**thread_env(threads, platform), **(env or {}), _PARENT: str(os.getpid())}
  try:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
  except subprocess.TimeoutExpired:
    raise BenchError(f'{target} timed out after {timeout:.0f}s') from None
  lines = [l for l in proc.stdout.splitlines() if l.startswith(MARK)]
  if proc.returncode or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise BenchError(f'{target} failed (exit {proc.returncode}): {" | ".join(tail)}')
  return json.loads(lines[-1][len(MARK):])


def _stop_with_parent() -> None:
  """Linux: the worker gets SIGTERM when the process that started it dies. A `kill` or
  `timeout` of `tx bench` / `tx tune` reaches that process alone; without this its worker
  would measure on, for up to half an hour, on the cores the next measurement times."""
  parent = os.environ.get(_PARENT)
  if not parent or not sys.platform.startswith('linux'):
    return
  try:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
  except (OSError, AttributeError):
    return
  if os.getppid() != int(parent):  # it died before the signal was asked for
    sys.exit(1)


def main(argv: list[str]) -> int:
  _stop_with_parent()
  target, spec = argv[0], json.loads(argv[1])
  module, name = target.split(':')
  if 'torch' in module:
    import torch  # pylint: disable=g-import-not-at-top  (optional (the interop extra); heavy)
    torch.set_num_threads(int(spec['threads']))
  result = getattr(importlib.import_module(module), name)(spec)
  result['peak_rss_bytes'] = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
  result['threads'] = float(spec['threads'])
  print(MARK + json.dumps(result), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
