"""tx against its PyTorch peer on one `tx bench` case at several model widths, side by side.

  python benchmarks/width_sweep.py bert_6l --widths 384 768 --rounds 6
  python benchmarks/width_sweep.py bert_6l --widths 1024 --tune-each-width \
      --candidates default torch_matmul_4_per_call --tune-rounds 2

Each width is the case's spec with d_model set to it, heads = d_model / 64 and d_ff =
4 * d_model (768 is BERT-base's width); the rest (layers, context, batch, steps) is the
case's. tx trains with `tx tune`'s choice for the case's own step on this host (from the tune
cache, timed first where nothing is cached, as `tx bench --tune` does) unless `--defaults`;
with `--tune-each-width`, with the choice for each width's own step instead (a wider model's
products may want another GEMM), tuned like `tx tune` (`--candidates`, `--tune-steps`,
`--tune-warmup`, `--tune-rounds`) and cached per shape. The peer is the case's, unchanged.
Every measurement runs in its own process, tx and the peer round by round, each first in
every second round unless `--order tx-first` (as `tx bench --order`), so a slow minute of the
host moves both of a pair and an advantage of running second falls on both sides.
Per round it prints tokens/s a side and tx / peer; at the end, per width, the median ratio,
the ratio of the median tokens/s, and how many rounds reached 1.0x. `--json PATH` keeps the
runs. On the project's CPUs the peer's speed moves by a fifth to a third between processes
(benchmarks/NOTES.md, attempts 87 and 91), so read medians over several rounds, and the
paired ratios' geometric mean with its 95 % t-interval (on the logs).
"""

from __future__ import annotations

import argparse
import json
import statistics


def widened(spec: dict, width: int) -> dict:
  """`spec` at model width `width`: heads of 64 dimensions, d_ff = 4 * width."""
  if width % 64:
    raise SystemExit(f'--widths: {width} is not a multiple of 64 (heads of 64 dimensions)')
  return dict(spec, d_model=width, heads=width // 64, d_ff=4 * width)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('case', help='a training case of `tx bench` (tx/bench/cases.py SUITE)')
  parser.add_argument('--widths', type=int, nargs='+', default=[384, 768])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--threads', type=int, default=2)
  parser.add_argument('--order', choices=('alternate', 'tx-first'), default='alternate',
                      help='which side runs first in each round (`tx bench --order`)')
  tuning = parser.add_mutually_exclusive_group()
  tuning.add_argument('--defaults', action='store_true', help="tx's defaults, not the tune's")
  tuning.add_argument('--tune-each-width', action='store_true',
                      help="each width's own tune, not the case's")
  parser.add_argument('--candidates', nargs='+', metavar='NAME',
                      help='with --tune-each-width: time only these (`tx tune --candidates`)')
  parser.add_argument('--tune-steps', type=int, default=5)
  parser.add_argument('--tune-warmup', type=int, default=2)
  parser.add_argument('--tune-rounds', type=int, default=2)
  parser.add_argument('--json', help='write every run here')
  args = parser.parse_args(argv)

  if args.rounds < 1:
    raise SystemExit(f'--rounds: {args.rounds}; give 1 or more')
  if min(args.tune_steps, args.tune_rounds) < 1 or args.tune_warmup < 0:
    raise SystemExit(f'--tune-steps {args.tune_steps}, --tune-rounds {args.tune_rounds}, '
                     f'--tune-warmup {args.tune_warmup}: give steps and rounds >= 1, warmup >= 0')
  if args.candidates and not args.tune_each_width:
    raise SystemExit('--candidates: only with --tune-each-width (the case\'s own tune is '
                     '`tx bench --tune`\'s)')
  for width in args.widths:  # a bad width fails before anything is measured
    widened({}, width)
  from tx.bench import cases, suite, tuned, worker  # pylint: disable=g-import-not-at-top
  from tx.compare import stats  # pylint: disable=g-import-not-at-top
  from tx.runs import tune  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(args.candidates or ()) - set(tune.known_candidates()))
  if unknown:
    raise SystemExit(f'--candidates: unknown {", ".join(unknown)}; one of '
                     f'{", ".join(tune.known_candidates())}')
  if not suite.torch_available():
    raise SystemExit('the peer needs torch and transformers: pip install -e ".[interop]"')
  by_name = {c.name: c for c in cases.SUITE}
  if args.case not in by_name or 'train' not in by_name[args.case].kinds:
    raise SystemExit(f'{args.case!r} is not a training case of `tx bench`; one of '
                     f'{", ".join(n for n, c in by_name.items() if "train" in c.kinds)}')
  case = by_name[args.case]
  known = tune.known_candidates()
  tune_args = {'candidates': {n: known[n] for n in args.candidates} if args.candidates else None,
               'steps': args.tune_steps, 'warmup': args.tune_warmup, 'rounds': args.tune_rounds}

  def tx_setting(spec: dict, label: str, **kwargs) -> tuple[dict, dict]:
    """(the spec tx trains with, run_isolated's env keyword) under the tune's choice."""
    spec, summary = tuned.choice(spec, threads=args.threads, say=print, **kwargs)
    print(f'{label}: tx trains with the tune\'s choice {summary["choice"]!r}', flush=True)
    return spec, {'env': {'XLA_FLAGS': summary['xla_flags']}} if summary['xla_flags'] else {}

  settings = {width: (widened(case.spec, width), {}) for width in args.widths}
  if args.tune_each_width:  # every width tuned before any is measured: no tune between pairs
    settings = {width: tx_setting(spec, f'd_model {width}', **tune_args)
                for width, (spec, _) in settings.items()}
  elif not args.defaults:
    spec, env = tx_setting(case.spec, case.name)
    settings = {width: (widened(spec, width), env) for width in args.widths}
  peer = f'tx.bench.torch_peers:{cases.PEER_TRAIN[case.spec["family"]]}'
  runs, choices = {}, {}
  for width in args.widths:
    tx_spec, tx_env = settings[width]
    choices[str(width)] = {'spec': tx_spec, **tx_env}
    sides = {'tx': ('tx.bench.tx_side:train', tx_spec, tx_env),
             'peer': (peer, widened(case.spec, width), {})}
    for i in range(args.rounds):
      first = suite.first_side(i, args.order)
      pair = {side: worker.run_isolated(sides[side][0], sides[side][1], threads=args.threads,
                                        **sides[side][2])
              for side in (first, 'peer' if first == 'tx' else 'tx')}
      runs.setdefault(str(width), []).append({'tx': pair['tx'], 'peer': pair['peer'],
                                              'first': first})
      tx, pe = pair['tx']['tokens_per_s'], pair['peer']['tokens_per_s']
      print(f'd_model {width}, round {i + 1}/{args.rounds}: tx {tx:,.0f}, peer {pe:,.0f} '
            f'tokens/s, {tx / pe:.3f}x', flush=True)
  for width, pairs in runs.items():
    tx = [p['tx']['tokens_per_s'] for p in pairs]
    pe = [p['peer']['tokens_per_s'] for p in pairs]
    ratios = [a / b for a, b in zip(tx, pe)]
    interval = stats.ratio_interval(ratios)
    print(f'd_model {width}: median {statistics.median(ratios):.3f}x '
          f'({min(ratios):.3f}-{max(ratios):.3f}), medians {statistics.median(tx):,.0f} / '
          f'{statistics.median(pe):,.0f} tokens/s = '
          f'{statistics.median(tx) / statistics.median(pe):.3f}x, '
          f'{sum(r >= 1 for r in ratios)} of {len(ratios)} rounds at 1.0x or more' +
          (f'; geometric mean {interval.diff:.3f}x, 95 % interval {interval.low:.3f}-'
           f'{interval.high:.3f}x' if interval else ''))
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump({'case': case.name, 'tx': choices, 'runs': runs}, f, indent=1)
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
