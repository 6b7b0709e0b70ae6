"""torch.mm at tx's operand layouts against the same products at the peer's own layouts.

  python benchmarks/gemm_layouts.py [--case bert_6l] [--rounds 6] [--threads 2]

`tx bench`'s GEMM table times torch's kernel at the layouts tx's step computes in
(`tx.bench.cases.step_gemms`). The peers' layers multiply in other layouts: BERT's
nn.Linear keeps its weight [out, in] (the forward product takes it transposed, the input
gradient does not, the weight gradient is gradᵀ · x with gradᵀ a strided view), GPT-2's
Conv1D keeps it [in, out] (as tx does) and takes xᵀ as a strided view in the weight gradient
where tx multiplies a transposed copy. This script times each product of a case's step both
ways in rounds that alternate which layout runs first, and prints per product the median
GFLOP/s of each and the geometric mean of peer / tx over the rounds with its 95 % interval,
then the same for the dense products of a whole step (each product's FLOPs times its count
per step): whether the table's torch column, taken at tx's layouts, would read differently
at the peer's. The attention projection's input and weight gradients are timed as products
of their own here (`step_gemms` stands them in by its forward rate).
"""

from __future__ import annotations

import argparse
import statistics

from tx.bench import cases
from tx.compare import stats
from tx.timing import sample_seconds


def products(spec: dict) -> list[tuple]:
  """(label, m, k, n, tx's right operand transposed, times per step) of the case's step,
  with the attention projection split into its forward, input and weight gradients."""
  out = []
  for label, m, k, n, transposed, times in cases.step_gemms(spec):
    if label == 'attention projection':
      per = times // 3
      out += [('projection, forward', m, k, n, False, per),
              ('projection, input gradient', m, n, k, True, per),
              ('projection, weight gradient', k, m, n, False, per)]
    else:
      out.append((label, m, k, n, transposed, times))
  return out


def operands(torch, label: str, m: int, k: int, n: int, transposed: bool, layout: str,
             family: str):
  """The two operands of one product, [m, k] and [k, n] as torch.mm sees them, in tx's
  layout or the peer's (`family` 'encoder': nn.Linear, 'decoder': GPT-2's Conv1D). For a
  weight gradient the peer's product is the transposed one (gradᵀ · x, [n, m] x [m, k]
  read as its own [n, k] x [k, m]) under nn.Linear; its FLOPs are the same."""
  rand = torch.randn
  if layout == 'tx':
    return rand(m, k), (rand(n, k).t() if transposed else rand(k, n))
  weight_gradient, forward = 'weight gradient' in label, 'forward' in label
  if family == 'decoder':  # Conv1D: tx's layouts but xᵀ a view in the weight gradient
    if weight_gradient:
      return rand(k, m).t(), rand(k, n)
    return rand(m, k), (rand(n, k).t() if transposed else rand(k, n))
  if weight_gradient:  # nn.Linear: gradᵀ [n, k-rows] as a view, times x
    return rand(k, n).t(), rand(k, m)
  return rand(m, k), (rand(n, k).t() if forward else rand(k, n))


def rate(torch, a, b, reps: int) -> float:
  """Median FLOP/s of `reps` timed samples of torch.mm(a, b)."""
  flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
  return statistics.median(flops / s for s in sample_seconds(lambda: torch.mm(a, b),
                                                             lambda _: None, reps))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--case', default='bert_6l', help='a decoder or encoder case of the suite')
  parser.add_argument('--rounds', type=int, default=6)
  parser.add_argument('--reps', type=int, default=5, help='timed samples per product a round')
  parser.add_argument('--threads', type=int, default=2)
  args = parser.parse_args(argv)
  if min(args.rounds, args.reps, args.threads) < 1:
    raise SystemExit('--rounds, --reps and --threads must be at least 1')
  spec = next((c.spec for c in cases.SUITE if c.name == args.case), None)
  if spec is None or spec.get('family') not in ('decoder', 'encoder'):
    raise SystemExit(f'--case {args.case}: not a decoder or encoder case of tx.bench.cases.SUITE')
  import torch  # pylint: disable=g-import-not-at-top  (the interop extra)
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  shapes = products(spec)
  rates = {(p[0], side): [] for p in shapes for side in ('tx', 'peer')}
  step = {'tx': [], 'peer': []}
  for r in range(args.rounds):
    order = ('tx', 'peer') if r % 2 == 0 else ('peer', 'tx')
    seconds = dict.fromkeys(order, 0.0)
    for label, m, k, n, transposed, times in shapes:
      for side in order:
        x = rate(torch, *operands(torch, label, m, k, n, transposed, side, spec['family']),
                 args.reps)
        rates[label, side].append(x)
        seconds[side] += times * 2 * m * k * n / x
    for side in order:
      step[side].append(seconds[side])
    print(f'round {r + 1}: dense products of a step, tx layouts {seconds["tx"]:.3f} s, '
          f'peer layouts {seconds["peer"]:.3f} s', flush=True)
  family = 'nn.Linear' if spec['family'] == 'encoder' else 'Conv1D'
  print(f'\n{args.case}, torch.mm GFLOP/s, median over {args.rounds} rounds: tx layouts / '
        f'peer ({family}) layouts, peer / tx geometric mean (95 % interval)')
  for label, m, k, n, _, times in shapes:
    tx, peer = rates[label, 'tx'], rates[label, 'peer']
    print(f'  {label} [{m}x{k}]·[{k}x{n}] x{times}: {statistics.median(tx) / 1e9:.0f} / '
          f'{statistics.median(peer) / 1e9:.0f}, {_interval([p / t for p, t in zip(peer, tx)])}')
  print('  a step\'s dense products, tx layouts / peer layouts (seconds; the ratio is tx / peer '
        'seconds = peer / tx speed): '
        f'{statistics.median(step["tx"]):.3f} / {statistics.median(step["peer"]):.3f} s, '
        f'{_interval([t / p for t, p in zip(step["tx"], step["peer"])])}')


def _interval(ratios: list[float]) -> str:
  i = stats.ratio_interval(ratios)
  return f'{ratios[0]:.2f}x' if i is None else f'{i.diff:.2f}x ({i.low:.2f}-{i.high:.2f}x)'


if __name__ == '__main__':
  main()
