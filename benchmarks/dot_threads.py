"""Does XLA:CPU run a small-batch product on both cores? A stand-in of a decoding step.

Self-contained (jax only, no tx) so that it can go with an upstream report
(benchmarks/upstream_xla_cpu_products.md); hence its own few lines of trace reading.

  python benchmarks/dot_threads.py [--rows 1] [--qkv none|side|chain|fused] [--qkv-width 384]
                                   [--gap 0] [--weights in_out|out_in]

Six layers of a decoder's feed-forward chain (x·Wi, GELU, ·Wo, float32, d_model 384, d_ff
1536; separate weights per layer) run 256 times in a `fori_loop`, as a decoding loop runs
them. `--qkv` puts three [384, w] products before each layer's chain, as attention's q, k
and v: side by side (`side`), each waiting for the one before (`chain`), or as one [384, 3w]
product (`fused`). `--gap N` puts N small elementwise ops (each its own fusion) before each
layer: a few microseconds of work and no product. `--weights out_in` stores every weight
[out, in] and contracts its last dimension (x·Wᵀ) instead of [in, out] (x·W). Prints the step
time, the process's CPU time over its wall time, and the median duration of each product
shape in one profiled call.

On the Intel host (benchmarks/NOTES.md, attempt 81) the chain alone runs each Wi product in
~47 us on two CPUs and ~92 on one; with q, k and v before it, in any of the three forms,
~80-90 us on two CPUs: at one core's speed, as in real decoding. Ten elementwise ops between
the layers cost the chain twice their own time, and the Wi product goes to ~70 us. Weights
stored [out, in] cut that gap's cost (0.65-0.68 against 0.91-0.92 ms a step) but not the
q/k/v case's (attempt 82). Run it pinned to the CPUs XLA may use (`taskset -c 0,1`).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import resource
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

D_MODEL, D_FF, LAYERS, STEPS = 384, 1536, 6, 256


def product(x, w, out_in: bool = False):
  """x [rows, in] times w [in, out], or w [out, in] transposed when `out_in`."""
  return jax.lax.dot_general(x, w, (((1,), (1 if out_in else 0,)), ((), ())))


def layer(x, wi, wo, qkv, mode: str, gap: int = 0, out_in: bool = False):
  """One layer of the stand-in: optional q/k/v-like products or `gap` elementwise ops (kept
  apart by optimization barriers), then the FFN chain. Weights [out, in] when `out_in`."""
  dot = lambda x, w: product(x, w, out_in)
  for _ in range(gap):
    x = jax.lax.optimization_barrier(jnp.sin(x) * 0.9 + 0.01 * jnp.cos(x * 3.0))
  if mode == 'side':
    q, k, v = (dot(x, w) for w in qkv)
  elif mode == 'chain':  # each product reads the previous one's result (a data dependency)
    q = dot(x, qkv[0])
    k = dot(x + 0 * q[:, :1], qkv[1])
    v = dot(x + 0 * k[:, :1], qkv[2])
  elif mode == 'fused':
    q, k, v = jnp.split(dot(x, qkv), 3, axis=1)
  if mode != 'none':
    x = x + jnp.tile((q * k + v) * 0.1, (1, D_MODEL // q.shape[1]))
  return (x + dot(jax.nn.gelu(dot(x, wi)), wo)) * 0.5


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
  p.add_argument('--rows', type=int, default=1)
  p.add_argument('--qkv', choices=('none', 'side', 'chain', 'fused'), default='none')
  p.add_argument('--qkv-width', type=int, default=D_MODEL)
  p.add_argument('--gap', type=int, default=0)
  p.add_argument('--weights', choices=('in_out', 'out_in'), default='in_out')
  args = p.parse_args()
  out_in = args.weights == 'out_in'
  if args.qkv_width < 1 or D_MODEL % args.qkv_width:
    p.error(f'--qkv-width must divide {D_MODEL} (the q/k/v result is tiled back to it), '
            f'got {args.qkv_width}')
  rng = np.random.default_rng(0)
  def weight(fan_in, fan_out):
    shape = (fan_out, fan_in) if out_in else (fan_in, fan_out)
    return jnp.asarray(rng.standard_normal(shape) * 0.05, jnp.float32)
  wi = [weight(D_MODEL, D_FF) for _ in range(LAYERS)]
  wo = [weight(D_FF, D_MODEL) for _ in range(LAYERS)]
  qkv = [[weight(D_MODEL, args.qkv_width) for _ in range(3)] for _ in range(LAYERS)]
  if args.qkv == 'fused':
    qkv = [jnp.concatenate(w, axis=0 if out_in else 1) for w in qkv]
  x = jnp.asarray(rng.standard_normal((args.rows, D_MODEL)) * 0.05, jnp.float32)

  @jax.jit
  def run(x, wi, wo, qkv):
    def step(unused_t, x):
      for a, b, c in zip(wi, wo, qkv):
        x = layer(x, a, b, c, args.qkv, args.gap, out_in)
      return x
    return jax.lax.fori_loop(0, STEPS, step, x)

  inputs = (x, wi, wo, qkv)
  jax.block_until_ready(run(*inputs))
  usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
  times = []
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(run(*inputs))
    times.append(time.perf_counter() - start)
  after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall
  cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
  # a product is a dot, or at batch > 1 a YNNPACK fusion around one: name -> result shape
  shapes = {line.split('=')[0].strip().lstrip('%'): line.split('=')[1].split()[0]
            for line in run.lower(*inputs).compile().as_text().splitlines()
            if ' dot(' in line or line.strip().startswith(('%ynn_fusion', 'ROOT %ynn_fusion'))}
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder):
      jax.block_until_ready(run(*inputs))
    with gzip.open(sorted(glob.glob(f'{folder}/**/*.trace.json.gz', recursive=True))[-1]) as f:
      events = json.load(f)['traceEvents']
  per_shape = collections.defaultdict(list)
  for e in events:
    if e.get('ph') == 'X' and e.get('name') in shapes:
      per_shape[shapes[e['name']]].append(e['dur'])
  medians = {s: round(float(np.median(d)), 1) for s, d in per_shape.items()}
  print(f'rows {args.rows}, qkv {args.qkv} ({args.qkv_width} wide), gap {args.gap}, '
        f'weights {args.weights}: '
        f'{min(times) / STEPS * 1e3:.3f}'
        f' ms a step, CPU / wall {cpu / wall:.2f}; '
        f'us a product: {medians}')


if __name__ == '__main__':
  main()
