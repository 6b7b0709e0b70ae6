"""How XLA:CPU runs a LayerNorm's forward and backward: the fusions, and each one's time.

Self-contained (jax only, no tx) so that it can go with an upstream report
(benchmarks/upstream_xla_cpu_layernorm.md).

  python benchmarks/layernorm_passes.py [--rows 2048] [--width 128] [--calls 200]

Jits the gradient of sum(LayerNorm(x)·c) with respect to x, the scale and the bias (the
two-pass form: mean, then the mean of the squared deviations; float32), prints the median
time of a call, then each fusion of the optimized program with its median duration in a
profiled run of 20 calls, slowest first. With `--torch`, also the same forward and backward
through torch's fused kernels (`native_layer_norm` and its backward), if torch is installed.

On the Intel host (benchmarks/NOTES.md, attempt 82) at [2048, 128] the call takes ~800 us
on two threads and on one, in 16 fusions: YNNPACK reductions fed by broadcasts XLA writes
out in full, about 13 passes over the array; torch's kernels take ~0.32 ms. Run it pinned
to the CPUs XLA may use (`taskset -c 0,1`).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp


def layer_norm(x, scale, bias, eps: float = 1e-12):
  """x [rows, width] normalised over its last axis, times scale [width], plus bias [width]."""
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def _median_us(call, calls: int) -> float:
  call()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e6


def _torch_us(rows: int, width: int, calls: int) -> float:
  import torch  # pylint: disable=import-outside-toplevel
  x = torch.randn(rows, width)
  scale, bias, c = torch.ones(width), torch.zeros(width), torch.randn(rows, width)

  def call():
    y, mean, rstd = torch.ops.aten.native_layer_norm(x, [width], scale, bias, 1e-12)
    torch.ops.aten.native_layer_norm_backward(c, x, [width], mean, rstd, scale, bias,
                                              [True, True, True])
    return y
  return _median_us(call, calls)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
  p.add_argument('--rows', type=int, default=2048)
  p.add_argument('--width', type=int, default=128)
  p.add_argument('--calls', type=int, default=200)
  p.add_argument('--torch', action='store_true')
  args = p.parse_args()
  if args.rows < 1 or args.width < 2:
    p.error(f'--rows must be at least 1 and --width at least 2, got {args.rows}, {args.width}')
  loss = lambda x, s, b, c: jnp.sum(layer_norm(x, s, b) * c)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  x, c = (jax.random.normal(jax.random.key(i), (args.rows, args.width)) for i in range(2))
  scale, bias = jnp.ones(args.width), jnp.zeros(args.width)
  inputs = (x, scale, bias, c)
  call = lambda: jax.block_until_ready(grads(*inputs))
  print(f'LayerNorm forward and backward at [{args.rows}, {args.width}], float32: '
        f'{_median_us(call, args.calls):.0f} us a call (XLA)')

  fusions = {line.split('=')[0].strip().lstrip('%').split()[-1]: line.split('=')[1].split()[0]
             for line in grads.lower(*inputs).compile().as_text().splitlines()
             if ' fusion(' in line}
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder):
      for _ in range(20):
        call()
    with gzip.open(sorted(glob.glob(f'{folder}/**/*.trace.json.gz', recursive=True))[-1]) as f:
      events = json.load(f)['traceEvents']
  durations = collections.defaultdict(list)
  for e in events:
    if e.get('ph') == 'X' and e.get('name') in fusions:
      durations[e['name']].append(e['dur'])
  rows = sorted(((statistics.median(d), name) for name, d in durations.items()), reverse=True)
  print(f'{len(fusions)} fusions; median us a call in a profiled run, slowest first:')
  for us, name in rows:
    print(f'  {us:7.1f}  {name:<32} -> {fusions[name]}')
  if args.torch:  # last: torch's OpenMP threads spin for a while after its calls
    print(f'torch native_layer_norm and its backward: '
          f'{_torch_us(args.rows, args.width, args.calls):.0f} us a call')


if __name__ == '__main__':
  main()
