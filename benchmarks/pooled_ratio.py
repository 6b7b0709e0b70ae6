"""tx / peer over the paired rounds of several runs pooled: one geometric mean and 95 % interval.

  python benchmarks/pooled_ratio.py runs/bench/*/*.json
  python benchmarks/pooled_ratio.py runs/bench/*/*.json --case bert_6l --bound 1.0

Reads `tx bench --rounds N` JSON documents (every training and decoding row with paired
rounds) and `benchmarks/width_sweep.py --json` files (each width's training rounds, as
'<case> d<width>', or the case's name at its own width), and pools the paired ratios of each
(case, metric, tx's setting): tx's setting is its kernels, steps per call and XLA flags as the
run trained (the case's spec with the run's `tx tune` choice), so rounds of different settings
are never pooled. One session's host speed moves both sides of a pair, which is why the
ratios pool across sessions where the tokens/s do not. Prints, per group, the rounds, how
many runs they came from, the geometric mean and its t-interval on the logs
(`tx.compare.stats.ratio_interval`: the rounds taken as independent draws), then, over two
runs or more, the same with the runs as the draws (each run's geometric mean: the rounds of
one session share its host's speed, so this wider interval is the cautious one), and, with
`--bound`, whether the interval lies all above, all below, or either side of it, and for one
either side, how many rounds (or runs) at the same mean and spread would settle it. With
`--by-order`, each group is split by the side that ran first in its rounds (recorded since
`tx bench --order`; older runs ran tx first in every round), and the ratio of the two
groups' geometric means is printed with its Welch interval: an order effect where it
excludes 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path


SETTINGS = ('attention_impl', 'matmul_impl', 'norm_impl', 'steps_per_call', 'grad_accum_steps')


def setting(spec: dict, flags: str = '') -> str:
  """The label of tx's setting: the spec's kernel and loop keys, and the XLA flags."""
  parts = [f'{k}={spec[k]}' for k in SETTINGS if spec.get(k, 'auto') != 'auto']
  return ' '.join(parts + ([flags] if flags else [])) or 'defaults'


def bench_rounds(doc: dict):
  """(case, metric, setting, [tx / peer per round]) for each paired row of a `tx bench` JSON;
  the setting is the case's spec, with the run's `tx tune` choice for training rows (`tx
  bench --tune` tunes the training step only: decoding runs the case's spec either way)."""
  for r in doc.get('rows', []):
    if r.get('ratio_rounds'):
      case = doc['cases'].get(r['case']) or {}
      tuned = (case.get('tuned') or {}) if r['metric'].startswith('train') else {}
      spec = {**case.get('spec', {}), **(tuned.get('model_overrides') or {}),
              **(tuned.get('train_overrides') or {})}
      first = r.get('first_rounds') or ['tx'] * len(r['ratio_rounds'])  # older: tx first
      yield (r['case'], r['metric'], setting(spec, tuned.get('xla_flags') or ''),
             r['ratio_rounds'], first)


def sweep_rounds(doc: dict):
  """The same for a `width_sweep.py --json` file: each width's training rounds, named
  '<case> d<width>', or '<case>' at the case's own width (the suite's measurement)."""
  from tx.bench import cases  # pylint: disable=g-import-not-at-top
  own = {c.name: c.spec.get('d_model') for c in cases.SUITE}.get(doc['case'])
  for width, pairs in doc['runs'].items():
    tx = (doc.get('tx') or {}).get(width) or {'spec': doc.get('tx_spec') or {}}  # or older files
    name = doc['case'] if str(own) == width else f'{doc["case"]} d{width}'
    yield (name, 'train tokens/s', setting(tx['spec'], (tx.get('env') or {}).get('XLA_FLAGS', '')),
           [p['tx']['tokens_per_s'] / p['peer']['tokens_per_s'] for p in pairs],
           [p.get('first', 'tx') for p in pairs])


def pooled(paths: list[str], by_order: bool = False) -> dict:
  """{(case, metric, setting): {'ratios': [...], 'files': [...]}} over the readable files;
  `by_order`: keyed (case, metric, setting + ', <side> first') instead, a group per side that
  ran first in the rounds."""
  groups = {}
  for path in paths:
    try:
      doc = json.loads(Path(path).read_text(encoding='utf-8'))
    except (OSError, ValueError) as e:
      raise SystemExit(f'{path}: not a readable JSON document ({e}); pass `tx bench --json` '
                       'or `width_sweep.py --json` files') from None
    if 'rows' in doc and 'cases' in doc:
      found = bench_rounds(doc)
    elif isinstance(doc.get('runs'), dict) and 'case' in doc:
      found = sweep_rounds(doc)
    else:
      continue  # another JSON beside the runs (a profile, a tune entry)
    for case, metric, label, ratios, first in found:
      for side in ('tx', 'peer') if by_order else (None,):
        kept = [r for r, f in zip(ratios, first) if side in (None, f)]
        if not kept:
          continue
        key = (case, metric, f'{label}, {side} first' if side else label)
        group = groups.setdefault(key, {'ratios': [], 'files': [], 'runs': []})
        group['ratios'] += kept
        group['files'].append(path)
        group['runs'].append(kept)
  return groups


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('files', nargs='+')
  parser.add_argument('--case', help='only cases whose name starts with this')
  parser.add_argument('--bound', type=float, help="say where each interval lies against it")
  parser.add_argument('--by-order', action='store_true',
                      help='split each group by the side that ran first in its rounds')
  args = parser.parse_args(argv)
  from tx.compare import stats  # pylint: disable=g-import-not-at-top
  groups = pooled(args.files, by_order=args.by_order)
  shown = {k: g for k, g in sorted(groups.items())
           if not args.case or k[0].startswith(args.case)}
  if not shown:
    raise SystemExit('no paired rounds in these files (`tx bench --rounds 2` or more, or '
                     '`width_sweep.py --json`)' + (f' for {args.case!r}' if args.case else ''))
  for (case, metric, setting), group in shown.items():
    ratios, interval = group['ratios'], stats.ratio_interval(group['ratios'])
    runs = len(group['files'])
    line = (f'{case} {metric} [{setting}]: {len(ratios)} rounds from {runs} '
            f'run{"s" if runs > 1 else ""}, tx/peer {min(ratios):.2f}-{max(ratios):.2f}x')
    if interval:
      line += f', geometric mean {_interval(interval, args.bound)}'
      line += _to_settle(ratios, interval, args.bound, 'rounds')
    # the runs as the draws (each run's geometric mean): rounds of one session share its
    # host's speed, so this interval is the wider, more cautious one across sessions
    by_run = stats.ratio_interval([geometric_mean(r) for r in group['runs']])
    if by_run and runs > 1:
      line += f'; runs as draws {_interval(by_run, args.bound)}'
      line += _to_settle([geometric_mean(r) for r in group['runs']], by_run, args.bound, 'runs')
    print(line)
  for (case, metric, setting), group in shown.items():  # --by-order: each pair of groups
    other = (case, metric, setting.replace(', tx first', ', peer first'))
    if setting.endswith(', tx first') and other in shown:
      logs = [[math.log(r) for r in g['ratios']] for g in (group, shown[other])]
      effect = stats.welch_interval(*logs)
      if effect:
        print(f'{case} {metric} [{setting[:-len(", tx first")]}]: order effect (tx first / '
              f'peer first) {_interval(_exp(effect), 1.0)} (Welch, on the logs)')
  return 0


def _exp(interval):
  """An interval on the logs as ratios."""
  return dataclasses.replace(interval, diff=math.exp(interval.diff), low=math.exp(interval.low),
                             high=math.exp(interval.high))


def geometric_mean(ratios: list[float]) -> float:
  """exp(mean(log r)) of positive ratios [n] (one run's rounds): a scalar."""
  return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def draws_to_settle(ratios: list[float], bound: float, most: int = 100_000) -> int | None:
  """How many draws like `ratios` [n] (positive; n >= 2) would put the 95 % interval of
  their geometric mean wholly on one side of `bound`, were their mean and spread of logs to
  hold: the least N with t(0.975, N - 1) · sd / sqrt(N) < |mean - log(bound)|. None where that
  takes more than `most` (a mean at the bound: more draws cannot settle it)."""
  from tx.compare import stats  # pylint: disable=g-import-not-at-top
  logs = [math.log(r) for r in ratios]
  gap, sd = abs(stats.mean(logs) - math.log(bound)), stats.std(logs) or 0.0
  half = lambda n: stats.t_quantile(0.975, n - 1) * sd / math.sqrt(n)
  if gap == 0 or half(most) >= gap:
    return None
  low, high = 2, most  # half(n) falls with n: the least n with half(n) < gap, by bisection
  while low < high:
    mid = (low + high) // 2
    low, high = (low, mid) if half(mid) < gap else (mid + 1, high)
  return low


def _to_settle(ratios: list[float], interval, bound: float | None, draws: str) -> str:
  """' (~N rounds would settle it ...)' where the interval straddles `bound`, else ''."""
  if bound is None or not interval.low <= bound <= interval.high:
    return ''
  n = draws_to_settle(ratios, bound)
  return (f' (a mean this close to {bound} would take over 100,000 {draws} to settle)'
          if n is None else f' (~{n:,} {draws} would settle it, were mean and spread to hold)')


def _interval(interval, bound: float | None) -> str:
  """'0.939x, 95 % interval 0.908-0.971x' (+ ' (all below 1.0)' with a bound)."""
  text = f'{interval.diff:.3f}x, 95 % interval {interval.low:.3f}-{interval.high:.3f}x'
  if bound is None:
    return text
  return text + (' (all above' if interval.low > bound else ' (all below'
                 if interval.high < bound else ' (either side of') + f' {bound})'


if __name__ == '__main__':
  raise SystemExit(main())
