"""Does XLA:CPU's batched matmul use every core? The product attention is made of, timed on one
core and on all of them, in XLA (one device, and the batch split over virtual devices) and in
torch when it is installed.

    python benchmarks/batched_dot_threads.py [--shape 96 256 64 256] [--dtype float32]

Each measurement runs in a fresh process (`taskset` pins the one-core runs; XLA sizes its
thread pool from the cores it may use). A line per measurement: GFLOP/s of
[B, M, K] · [B, K, N]. On the AMD EPYC hosts of benchmarks/NOTES.md (attempts 39 and 41) XLA
read ~80 GFLOP/s on one core and on two, torch 72 -> 107-113, and XLA with the batch over two
virtual devices 132: the cores are there, XLA's batched dot does not split its batch over
them. Rerun it after a jax upgrade to see whether that changed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

_CHILD = r'''
import json, sys, time
kind, b, m, k, n, dtype, devices = (sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6],
                                    int(sys.argv[7]))
def rate(fn, sync):
  fn(); sync()
  best = None
  for _ in range(7):
    t = time.perf_counter()
    for _ in range(20):
      out = fn()
    sync(out)
    s = (time.perf_counter() - t) / 20
    best = s if best is None else min(best, s)
  return 2 * b * m * k * n / best / 1e9
if kind == 'xla':
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  mesh = Mesh(np.array(jax.devices()[:devices]), ('b',))
  put = lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec('b')))
  rng = np.random.default_rng(0)
  x = put(rng.standard_normal((b, m, k)).astype(dtype))
  y = put(rng.standard_normal((b, k, n)).astype(dtype))
  f = jax.jit(lambda x, y: jnp.einsum('bmk,bkn->bmn', x, y))
  print(json.dumps(rate(lambda: f(x, y), lambda *o: jax.block_until_ready(o))))
else:
  import torch
  torch.set_num_threads(int(sys.argv[8]))
  x = torch.randn(b, m, k, dtype=getattr(torch, dtype))
  y = torch.randn(b, k, n, dtype=getattr(torch, dtype))
  print(json.dumps(rate(lambda: torch.bmm(x, y), lambda *o: None)))
'''


def measure(kind: str, shape, dtype: str, cores: int, devices: int = 1) -> float | None:
  """GFLOP/s of one measurement in a fresh process on `cores` cores (None if it failed)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', TF_CPP_MIN_LOG_LEVEL='3')
  flags = [f for f in env.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  env['XLA_FLAGS'] = ' '.join(flags + [f'--xla_force_host_platform_device_count={devices}'])
  cmd = [sys.executable, '-c', _CHILD, kind, *map(str, shape), dtype, str(devices), str(cores)]
  if cores < (os.cpu_count() or 1):
    cmd = ['taskset', '-c', ','.join(map(str, sorted(os.sched_getaffinity(0))[:cores]))] + cmd
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  if proc.returncode:
    print(f'{kind}: failed: {proc.stderr.strip().splitlines()[-1:]}', file=sys.stderr)
    return None
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--shape', type=int, nargs=4, default=(96, 256, 64, 256),
                 metavar=('B', 'M', 'K', 'N'),
                 help="[B, M, K] · [B, K, N] (default: bert_6l's q·kᵀ, 16 x 6 heads)")
  p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
  args = p.parse_args(argv)
  cores = len(os.sched_getaffinity(0))
  if cores > 1 and not shutil.which('taskset'):
    print('taskset (util-linux) is needed for the one-core runs', file=sys.stderr)
    return 2
  runs = [('XLA, one device', 'xla', 1, 1), ('XLA, one device', 'xla', cores, 1),
          (f'XLA, batch over {cores} virtual devices', 'xla', cores, cores)]
  try:
    import torch  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import  (optional)
    runs += [('torch.bmm', 'torch', 1, 1), ('torch.bmm', 'torch', cores, 1)]
  except ImportError:
    print('torch not installed: XLA only', file=sys.stderr)
  b, m, k, n = args.shape
  print(f'[{b}, {m}, {k}] · [{b}, {k}, {n}] {args.dtype}, GFLOP/s (best of 7 x 20 calls):')
  for label, kind, used, devices in runs:
    rate = measure(kind, args.shape, args.dtype, used, devices)
    shown = '-' if rate is None else f'{rate:.0f}'
    print(f'  {label:<34} {used} core{"s" if used > 1 else " "}  {shown:>6}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
