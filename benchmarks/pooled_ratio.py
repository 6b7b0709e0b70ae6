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
(`tx.compare.stats.ratio_interval`: the rounds taken as independent draws), and, with
`--bound`, whether the interval lies all above, all below, or either side of it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


SETTINGS = ('attention_impl', 'matmul_impl', 'norm_impl', 'steps_per_call', 'grad_accum_steps')


def setting(spec: dict, flags: str = '') -> str:
  """The label of tx's setting: the spec's kernel and loop keys, and the XLA flags."""
  parts = [f'{k}={spec[k]}' for k in SETTINGS if spec.get(k, 'auto') != 'auto']
  return ' '.join(parts + ([flags] if flags else [])) or 'defaults'


def bench_rounds(doc: dict):
  """(case, metric, setting, [tx / peer per round]) for each paired row of a `tx bench` JSON;
  the setting is the case's spec with the run's `tx tune` choice."""
  for r in doc.get('rows', []):
    if r.get('ratio_rounds'):
      case = doc['cases'].get(r['case']) or {}
      tuned = case.get('tuned') or {}
      spec = {**case.get('spec', {}), **(tuned.get('model_overrides') or {}),
              **(tuned.get('train_overrides') or {})}
      yield r['case'], r['metric'], setting(spec, tuned.get('xla_flags') or ''), r['ratio_rounds']


def sweep_rounds(doc: dict):
  """The same for a `width_sweep.py --json` file: each width's training rounds, named
  '<case> d<width>', or '<case>' at the case's own width (the suite's measurement)."""
  from tx.bench import cases  # pylint: disable=g-import-not-at-top
  own = {c.name: c.spec.get('d_model') for c in cases.SUITE}.get(doc['case'])
  for width, pairs in doc['runs'].items():
    tx = (doc.get('tx') or {}).get(width) or {'spec': doc.get('tx_spec') or {}}  # or older files
    name = doc['case'] if str(own) == width else f'{doc["case"]} d{width}'
    yield (name, 'train tokens/s', setting(tx['spec'], (tx.get('env') or {}).get('XLA_FLAGS', '')),
           [p['tx']['tokens_per_s'] / p['peer']['tokens_per_s'] for p in pairs])


def pooled(paths: list[str]) -> dict:
  """{(case, metric, setting): {'ratios': [...], 'files': [...]}} over the readable files."""
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
    for case, metric, setting, ratios in found:
      group = groups.setdefault((case, metric, setting), {'ratios': [], 'files': []})
      group['ratios'] += ratios
      group['files'].append(path)
  return groups


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('files', nargs='+')
  parser.add_argument('--case', help='only cases whose name starts with this')
  parser.add_argument('--bound', type=float, help="say where each interval lies against it")
  args = parser.parse_args(argv)
  from tx.compare import stats  # pylint: disable=g-import-not-at-top
  groups = pooled(args.files)
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
      line += (f', geometric mean {interval.diff:.3f}x, 95 % interval {interval.low:.3f}-'
               f'{interval.high:.3f}x')
      if args.bound is not None:
        line += (' (all above' if interval.low > args.bound else ' (all below'
                 if interval.high < args.bound else ' (either side of') + f' {args.bound})'
    print(line)
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
