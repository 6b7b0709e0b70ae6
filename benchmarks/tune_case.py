"""`tx tune` on a `tx bench` case's training step: which XLA:CPU setting (and whether torch's
kernels, and several steps per call) wins on this host at the suite's own shapes.

  python benchmarks/tune_case.py gpt_6l --threads 2 --rounds 1 --steps 2 --warmup 1

Prints the per-candidate step times and the choice; `--candidates` times a subset. Always
measures, so repeated calls on one host are comparable: without `--candidates` the cache
entry is rewritten; with them, as `tx tune --force --candidates`, the entry keeps its record
of the others (its candidates, and its earlier measurement).
"""
import argparse
import json

from tx.bench.cases import SUITE
from tx.bench.tuned import step_config
from tx.runs import tune


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('case', choices=[c.name for c in SUITE if 'train' in c.kinds])
  parser.add_argument('--threads', type=int, default=2)
  parser.add_argument('--rounds', type=int, default=1)
  parser.add_argument('--steps', type=int, default=2)
  parser.add_argument('--warmup', type=int, default=1)
  parser.add_argument('--candidates', nargs='+')
  args = parser.parse_args()
  spec = next(c.spec for c in SUITE if c.name == args.case)
  cfg = step_config(spec)  # steps_per_call left to tune unless the case sets it
  everything = tune.known_candidates()
  candidates = ({n: everything[n] for n in args.candidates} if args.candidates else None)
  entry = tune.tune(cfg, candidates=candidates, steps=args.steps, warmup=args.warmup,
                    rounds=args.rounds, threads=args.threads, force=True)
  print(json.dumps({'case': args.case, 'choice': entry['choice'], 'timings': entry['timings'],
                    'rounds_timings': entry['rounds_timings'], 'skipped': entry['skipped'],
                    'runoff': entry['runoff'],
                    'failed': entry['failed'], 'host': entry['host']}, indent=1))


if __name__ == '__main__':
  main()
