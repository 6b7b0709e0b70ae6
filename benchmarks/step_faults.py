"""What the step buffer's page faults cost a `tx bench` case, under variants of tx's glibc tunables.

  python benchmarks/step_faults.py [CASE] [--calls 6] [--rounds 2] [--per-call K]
  python benchmarks/step_faults.py gpt_6l --variants '' glibc.malloc.arena_max=1
  python benchmarks/step_faults.py gpt_6l_bf16 --set '{"matmul_impl": "torch"}' --per-call 4

XLA:CPU allocates a training call's scratch buffer (`memory_analysis().temp_size_in_bytes`)
at every call. A buffer that glibc serves from the main heap is returned to the kernel when
the call frees it, as soon as more than `glibc.malloc.trim_threshold` bytes are free at the
heap's top (256 MiB in tx's tunables until attempt 114, 4 GiB since), and the next call
faults it in again (benchmarks/NOTES.md, attempts 24, 44, 51, 60, 61 and 114). This script
runs CASE's training call (as `tx tune` times it) `--calls` times in a fresh process per
variant, in `--rounds` rounds (every other one in reverse order), and prints per call: seconds
a step, minor page faults, system time, resident memory after the call and the process's peak. A
variant is tx's tunables with some keys set otherwise, and environment variables set ('' =
tx's own; default: tx's, and the trim threshold at 256 MiB). `--per-call K` runs K steps a
call (train.steps_per_call, as a tune's `_4_per_call` twin does); `--set JSON` changes the
case's spec keys (tx/bench/tx_side.py), e.g. a tune's kernels. The first call
(compilation's warmup) is not in the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

MARK = 'STEP_FAULTS '
TX_OWN = "tx's tunables"


def _worker(case: str, calls: int, per_call: int | None, spec_set: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from tx.bench.cases import SUITE  # pylint: disable=g-import-not-at-top
  from tx.bench.tuned import step_config  # pylint: disable=g-import-not-at-top
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  from tx.runs import tune, tune_step  # pylint: disable=g-import-not-at-top
  from tx.timing import resident_bytes  # pylint: disable=g-import-not-at-top
  spec = next((c.spec for c in SUITE if c.name == case), None)
  if spec is None:
    raise SystemExit(f'unknown case {case!r}: pick one of '
                     + ', '.join(c.name for c in SUITE if 'train' in c.kinds))
  spec = dict(spec, **json.loads(spec_set))
  cfg = tune.one_device_config(step_config(spec))
  train = {'steps_per_call': per_call} if per_call else {}
  compiled, state, batch, cfg, _ = tune_step.compiled_step({'config': to_dict(cfg),
                                                       'train_overrides': train})
  temp = compiled.memory_analysis().temp_size_in_bytes
  rows = []
  for _ in range(calls):
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    rss = resident_bytes()
    rows.append({'step_s': seconds / cfg.train.per_call,
                 'faults': after.ru_minflt - before.ru_minflt,
                 'system_s': after.ru_stime - before.ru_stime, 'rss_gb': rss / 1e9,
                 'peak_rss_gb': after.ru_maxrss * 1024 / 1e9})
  print(MARK + json.dumps({'temp_bytes': temp, 'per_call': cfg.train.per_call, 'calls': rows}),
        flush=True)


def variant_env(variant: str) -> dict[str, str]:
  """The environment settings of a variant: its `key=value` pairs (colon-separated) whose
  key starts with `glibc.` set on top of tx's GLIBC_TUNABLES, the others (e.g.
  OMP_WAIT_POLICY=PASSIVE) as environment variables."""
  from tx import malloc_tuning  # pylint: disable=g-import-not-at-top
  bad = [t for t in variant.split(':') if t and '=' not in t]
  if bad:
    raise SystemExit(f'--variants: {bad[0]!r} is not KEY=VALUE; write e.g. '
                     'glibc.malloc.top_pad=67108864 or OMP_WAIT_POLICY=PASSIVE')
  pairs = dict(t.split('=', 1) for t in variant.split(':') if t)
  tunables = dict(t.split('=') for t in malloc_tuning.TUNABLES.split(':'))
  tunables.update((k, v) for k, v in pairs.items() if k.startswith('glibc.'))
  env = {k: v for k, v in pairs.items() if not k.startswith('glibc.')}
  env['GLIBC_TUNABLES'] = ':'.join(f'{k}={v}' for k, v in tunables.items())
  return env


def _run(case: str, calls: int, variant: str, threads: int, per_call: int | None,
         spec_set: str) -> dict:
  env = dict(os.environ, TX_MALLOC_TUNING='0', JAX_PLATFORMS='cpu', OMP_NUM_THREADS=str(threads),
             MKL_NUM_THREADS=str(threads), TX_TUNE='0')
  env.update(variant_env(variant))
  per_call_args = ['--per-call', str(per_call)] if per_call else []
  proc = subprocess.run([sys.executable, __file__, case, '--worker', '--calls', str(calls),
                         '--set', spec_set, *per_call_args],
                        env=env, capture_output=True, text=True, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith(MARK)]
  if proc.returncode or not lines:
    raise SystemExit(f'{case} with {variant!r} failed: {proc.stderr.strip()[-1500:]}')
  return json.loads(lines[-1][len(MARK):])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('case', nargs='?', default='bert_6l_torch_kernels_4_per_call')
  parser.add_argument('--calls', type=int, default=6)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--threads', type=int, default=2)
  parser.add_argument('--per-call', type=int, default=None,
                      help="steps a call (default: the case's own)")
  parser.add_argument('--variants', nargs='+',
                      default=['', f'glibc.malloc.trim_threshold={256 << 20}'],
                      help="tunables set on top of tx's, e.g. glibc.malloc.arena_max=1, and "
                           "environment variables, e.g. OMP_WAIT_POLICY=PASSIVE ('' = tx's)")
  parser.add_argument('--set', default='{}', metavar='JSON',
                      help='spec keys set on the case, e.g. \'{"attention_impl": "torch"}\'')
  parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  try:
    if not isinstance(json.loads(args.set), dict):
      raise ValueError('not an object')
  except ValueError as e:
    raise SystemExit(f'--set {args.set!r}: not a JSON object of spec keys ({e})') from None
  if args.worker:
    _worker(args.case, args.calls, args.per_call, args.set)
    return
  medians: dict[str, list[float]] = {v: [] for v in args.variants}
  for r in range(args.rounds):  # every other round in reverse: no variant always runs first
    for variant in args.variants[::-1] if r % 2 else args.variants:
      result = _run(args.case, args.calls, variant, args.threads, args.per_call, args.set)
      steady = result['calls'][1:]
      median = statistics.median(c['step_s'] for c in steady)
      medians[variant].append(median)
      print(f'round {r + 1}, {variant or TX_OWN} ({args.case}, temp '
            f'{result["temp_bytes"] / 1e9:.2f} GB, {result["per_call"]} steps a call): median '
            f'{median:.3f} s a step; per call: faults '
            f'{statistics.median(c["faults"] for c in steady):,.0f}, system '
            f'{statistics.median(c["system_s"] for c in steady):.2f} s, RSS after '
            + ' '.join(f'{c["rss_gb"]:.2f}' for c in result['calls'])
            + f' GB, peak {result["calls"][-1]["peak_rss_gb"]:.2f} GB', flush=True)
  for variant, values in medians.items():
    print(f'{variant or TX_OWN}: s a step, round medians '
          + ' '.join(f'{v:.3f}' for v in values))


if __name__ == '__main__':
  main()
