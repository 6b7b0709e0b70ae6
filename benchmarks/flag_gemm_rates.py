"""A case's dense products under several XLA flag sets (and torch.mm), a process per set.

  python benchmarks/flag_gemm_rates.py --case bert_6l --rounds 2 \
      --flags defaults= --flags onednn_dots=--xla_cpu_experimental_onednn_fusion_type=dot \
      --flags 'xnn_dots=--xla_cpu_experimental_xnn_fusion_type=dot' [--torch]

XLA:CPU's flags pick the kernels a product runs in (XLA's own, YNNPACK's, oneDNN's,
XNNPACK's) and are read once per process, so each set is timed in a fresh process of its
own, under tx's glibc tunables, in rounds that alternate the sets' order (the project's
hosts move by a fifth within minutes: benchmarks/NOTES.md, attempt 105). Each process
times every product of the case's step at tx's operand layouts (`tx.train.flops.gemm_rates`,
the attention projection split into its three products as in benchmarks/gemm_layouts.py)
and returns each one's median and fastest sample. Printed: per product the median over the
rounds of each set's median GFLOP/s, and the seconds a step's dense products take at each
set's rates with the geometric mean against the first set (95 % interval over rounds).
`--torch` adds torch.mm at the same layouts as one more set. A rate check, not a step
timing: whether a flag set is worth a `tx tune` candidate on this host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from tx.bench import cases
from tx.compare import stats

_TORCH = 'torch.mm'


def _spec(case: str) -> dict:
  spec = next((c.spec for c in cases.SUITE if c.name == case), None)
  if spec is None or spec.get('family') not in ('decoder', 'encoder'):
    raise SystemExit(f'--case {case}: not a decoder or encoder case of tx.bench.cases.SUITE')
  return spec


def _gemm_layouts():
  """benchmarks/gemm_layouts.py, this script's neighbour (the step's products, torch's
  operands at tx's layouts)."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import gemm_layouts  # pylint: disable=g-import-not-at-top
  return gemm_layouts


def products(case: str) -> list[tuple]:
  """(label, m, k, n, right operand transposed, times per step) of the case's products."""
  return _gemm_layouts().products(_spec(case))


def _measure(case: str, reps: int, threads: int, use_torch: bool) -> dict:
  """{label: [median FLOP/s, fastest FLOP/s]} of every product of the case's step."""
  from tx.timing import sample_seconds  # pylint: disable=g-import-not-at-top
  spec, out = _spec(case), {}
  if use_torch:
    import torch  # pylint: disable=g-import-not-at-top  (the interop extra)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
  else:
    from tx.train import flops  # pylint: disable=g-import-not-at-top
  for label, m, k, n, transposed, _ in products(case):
    if use_torch:
      a, b = _gemm_layouts().operands(torch, label, m, k, n, transposed, 'tx', spec['family'])
      rates = [2 * m * k * n / s
               for s in sample_seconds(lambda: torch.mm(a, b), lambda _: None, reps)]
    else:
      rates = flops.gemm_rates('float32', m, k, n, rhs_transposed=transposed, reps=reps)
    out[label] = [statistics.median(rates), max(rates)]
  return out


def _run_set(args, name: str, flags: str) -> dict:
  from tx import malloc_tuning  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, GLIBC_TUNABLES=malloc_tuning.TUNABLES, XLA_FLAGS=flags,
             JAX_PLATFORMS='cpu')
  command = [sys.executable, os.path.abspath(__file__), '--case', args.case, '--reps',
             str(args.reps), '--threads', str(args.threads), '--worker']
  if name == _TORCH:
    command.append('--worker-torch')
  done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
  if done.returncode:
    raise SystemExit(f'flag set {name!r} ({flags!r}) failed:\n{done.stderr[-2000:]}')
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--case', default='bert_6l', help='a decoder or encoder case of the suite')
  parser.add_argument('--flags', action='append', metavar='NAME=XLA_FLAGS',
                      help="a name and the XLA_FLAGS of one set (NAME= for XLA's defaults)")
  parser.add_argument('--torch', action='store_true', help='torch.mm at the same layouts too')
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--reps', type=int, default=9, help='timed samples per product')
  parser.add_argument('--threads', type=int, default=2, help="torch's threads")
  parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--worker-torch', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    print(json.dumps(_measure(args.case, args.reps, args.threads, args.worker_torch)))
    return
  if min(args.rounds, args.reps, args.threads) < 1:
    raise SystemExit('--rounds, --reps and --threads must be at least 1')
  if any('=' not in f or f.startswith('=') for f in args.flags or []):
    raise SystemExit('--flags takes NAME=XLA_FLAGS, e.g. defaults= or onednn=--xla_cpu_use_onednn')
  sets = dict(f.split('=', 1) for f in args.flags or ['defaults='])
  if args.torch:
    sets[_TORCH] = ''
  if len(sets) < 2:
    raise SystemExit('name at least two flag sets (--flags NAME=XLA_FLAGS), or one and --torch')
  shapes = products(args.case)
  rates = {name: [] for name in sets}
  for r in range(args.rounds):
    for name in (list(sets) if r % 2 == 0 else list(sets)[::-1]):
      rates[name].append(_run_set(args, name, sets[name]))
    print(f'round {r + 1}: ' + ', '.join(
        f'{name} {_step_seconds(shapes, rates[name][-1]):.3f} s' for name in sets), flush=True)
  names, first = list(sets), list(sets)[0]
  print(f'\n{args.case}, GFLOP/s at tx\'s layouts, median over {args.rounds} rounds of each '
        f'process\'s median (fastest sample): {" / ".join(names)}')
  for label, m, k, n, _, times in shapes:
    cells = [f'{statistics.median(x[label][0] for x in rates[name]) / 1e9:.0f} '
             f'({max(x[label][1] for x in rates[name]) / 1e9:.0f})' for name in names]
    print(f'  {label} [{m}x{k}]·[{k}x{n}] x{times}: ' + ' / '.join(cells))
  print("  a step's dense products, seconds at each set's medians; against "
        f'{first} (time ratio, 95 % interval over rounds):')
  base = [_step_seconds(shapes, x) for x in rates[first]]
  for name in names:
    seconds = [_step_seconds(shapes, x) for x in rates[name]]
    ratios = [s / b for s, b in zip(seconds, base)]
    i = stats.ratio_interval(ratios)
    spread = f'{ratios[0]:.2f}x' if i is None else f'{i.diff:.2f}x ({i.low:.2f}-{i.high:.2f}x)'
    print(f'    {name}: {statistics.median(seconds):.3f} s, {spread}')


def _step_seconds(shapes: list[tuple], measured: dict) -> float:
  """A step's dense products at one process's median rates."""
  return sum(times * 2 * m * k * n / measured[label][0]
             for label, m, k, n, _, times in shapes)


if __name__ == '__main__':
  main()
