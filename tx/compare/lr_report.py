"""`tx compare DIR --x KEY`: a metric against a swept numeric key (a learning-rate sweep),
one curve per value of the other varying keys, summarised as in Wortsman et al. 2023.

`build` turns a Collection into curves (tx/compare/lr_curves.py has the definitions);
`markdown_table`, `legend` and `write_csv` render them (lr_curves.md / lr_curves.csv).

What a run contributes: x = its flat config's KEY; the value = the summary metric. Summary
`status: 'diverged'`, a NaN / missing metric, or a sweep.json run entry with status
'diverged at step N' (or, from older sweeps, an error: the runner recorded only
non-finite-loss stops) mark it failed. Its loss at init is summary `init_loss`;
older summaries lack it, and then ln(model.vocab_size) stands in (the loss of a uniform
prediction), which the legend says.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

from tx.compare import lr_curves, stats
from tx.compare.lr_curves import Curve, Point
from tx.compare.runs import IGNORED_KEYS, Collection, RunData, group
from tx.compare.table import higher_is_better, metric_value, num
from tx.config.base import ConfigError


@dataclasses.dataclass
class Report:
  """The curves of one `--x` comparison and their differences to the baseline curve."""
  key: str
  metric: str
  curves: list[Curve]
  baseline: str  # a curve label
  diffs: dict[str, tuple[stats.Interval | None, stats.Interval | None]]  # (best, sensitivity)
  init_from_vocab: int  # runs whose loss at init is ln(model.vocab_size)
  capped_by_init: bool  # False: the cap is 1.1 x the largest finite value (not a loss metric)
  skipped: int  # runs without a summary (unfinished) or without KEY in their config


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numeric_varying(runs: list[RunData]) -> list[str]:
  keys = sorted({k for r in runs for k, v in r.config.items() if _is_number(v)} - IGNORED_KEYS)
  return [k for k in keys if len({r.config.get(k) for r in runs if k in r.config}) > 1]


def check_key(collection: Collection, key: str) -> None:
  """ConfigError unless `key` is a numeric config key taking several values."""
  runs = [r for r in collection.runs if r.config]
  values = {r.config[key] for r in runs if key in r.config and r.config[key] is not None}
  choices = ', '.join(_numeric_varying(runs)) or 'none'
  if not values:
    raise ConfigError(f'--x {key}: no run\'s config.json has it; numeric keys that vary: {choices}')
  if not all(_is_number(v) for v in values):
    raise ConfigError(f'--x {key}: not numeric ({", ".join(sorted(map(str, values)))}); '
                      f'numeric keys that vary: {choices}')
  if len(values) < 2:
    raise ConfigError(f'--x {key}: every run has the same value ({next(iter(values))}); '
                      f'pass a key that varies: {choices}')


def _init_loss(r: RunData, use_init: bool) -> tuple[float | None, bool]:
  """(the run's loss at init or None, whether it is the ln(vocab_size) stand-in)."""
  if not use_init:
    return None, False
  init = (r.summary or {}).get('init_loss')
  if _is_number(init) and math.isfinite(init):
    return float(init), False
  vocab = r.config.get('model.vocab_size')
  if _is_number(vocab) and vocab > 1:
    return math.log(vocab), True
  return None, False


def _point(r: RunData, key: str, metric: str, use_init: bool) -> tuple[Point | None, bool]:
  x = r.config.get(key)
  swept_diverged = bool(r.error) or str(r.status or '').startswith('diverged')
  if not _is_number(x) or (r.summary is None and not swept_diverged):
    return None, False
  init, from_vocab = _init_loss(r, use_init)
  summary = r.summary or {}
  value = metric_value(summary, metric) if summary else None
  diverged = swept_diverged or summary.get('status') == 'diverged'
  seed = r.seed if r.seed is not None else id(r)
  return Point(float(x), seed, value, diverged, init), from_vocab


def build(collection: Collection, key: str, metric: str, baseline_variant: str) -> Report:
  """The curves of `metric` against config `key`; the baseline curve is the one holding
  `baseline_variant`, else the first."""
  check_key(collection, key)
  if higher_is_better(metric):
    raise ConfigError(f'--x {key} --metric {metric}: LR curves need a loss (lower is better); '
                      'use --metric eval.loss or best_eval.loss')
  use_init = metric.split('.')[-1] == 'loss'
  runs = [r for r in collection.runs if key in r.config]
  # Curves: runs grouped by their config without `key` (train.seed is ignored by group too).
  proxies = [dataclasses.replace(r, config={k: v for k, v in r.config.items() if k != key})
             for r in runs]
  labels = group(proxies)
  points: dict[str, list[Point]] = {label: [] for label in labels}
  holds_baseline: dict[str, bool] = {}
  skipped, from_vocab = len(collection.runs) - len(runs), 0
  for r, proxy in zip(runs, proxies):
    p, vocab = _point(r, key, metric, use_init)
    if p is None:
      skipped += 1
      continue
    points[proxy.variant].append(p)
    from_vocab += vocab
    if r.variant == baseline_variant:
      holds_baseline[proxy.variant] = True
  points = {label: ps for label, ps in points.items() if ps}
  if not points:
    raise ConfigError(f'--x {key}: no finished or diverged runs yet; wait for runs to finish')
  everything = [p for ps in points.values() for p in ps]
  fallback = lr_curves.fallback_cap(everything)
  try:
    curves = [lr_curves.analyze(label, ps, fallback) for label, ps in points.items()]
  except ValueError:
    raise ConfigError(f'--x {key}: every run failed and none records its loss at init; '
                      'nothing to plot') from None
  if max(len(c.xs) for c in curves) < 2:
    raise ConfigError(f'--x {key}: each curve has one value of {key} (other keys change with '
                      'it); sweep it with axis() in a product(), not in a zip_()')
  base = next((c for c in curves if holds_baseline.get(c.label)), curves[0])
  diffs = {c.label: lr_curves.differences(c, base) for c in curves if c is not base}
  return Report(key, metric, curves, base.label, diffs, from_vocab, use_init, skipped)


# ----------------------------------------------------------------------------- rendering

def _x(x: float) -> str:
  return f'{x:.3g}'


def _mean_std(s: stats.Summary | None) -> str:
  if s is None:
    return '-'
  return num(s.mean) + (f' ± {num(s.std)}' if s.std is not None else '')


def _interval(label: str, report: Report, which: int) -> str:
  if label == report.baseline:
    return '(baseline)'
  ci = report.diffs[label][which]
  if ci is None:
    return 'n/a'
  mark = ' *' if ci.excludes_zero else ''
  return f'{num(ci.diff, True)} [{num(ci.low, True)}, {num(ci.high, True)}]{mark}'


def _best_x(c: Curve) -> str:
  text = _x(c.best_x)
  if c.best_x_seeds and c.best_x_seeds[0] != c.best_x_seeds[1]:
    text += f' ({_x(c.best_x_seeds[0])}..{_x(c.best_x_seeds[1])})'
  if c.best_x in (c.xs[0], c.xs[-1]) and len(c.xs) > 1:
    text += ' (grid edge)'
  return text


def _basin(c: Curve) -> str:
  if c.basin_width is None:
    return '-'
  return ('≥ ' if c.at_edge else '') + f'{c.basin_width:.2f} ({_x(c.basin[0])}..{_x(c.basin[1])})'


def _diverged(c: Curve) -> str:
  cells = [f'{_x(x)}: {f}/{n}' for x, f, n in zip(c.xs, c.failed, c.runs) if f]
  return ', '.join(cells) or '0'


def markdown_table(report: Report) -> str:
  """One row per curve, GitHub Markdown."""
  m = report.metric
  head = ['curve', 'seeds', f'best {report.key} (seed argmins)', f'best {m} (mean ± std)',
          'Δ best [95% CI]', 'LR sensitivity (mean ± std)', 'Δ sensitivity [95% CI]',
          'basin (decades)', 'diverged at x']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '|'.join('---' for _ in head) + '|']
  for c in report.curves:
    cells = [f'`{c.label}`', str(len(c.sensitivities)) if c.sensitivities else '0 complete',
             _best_x(c), _mean_std(c.best_loss), _interval(c.label, report, 0),
             _mean_std(c.sensitivity), _interval(c.label, report, 1), _basin(c), _diverged(c)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def legend(report: Report) -> str:
  """How to read the table: the definitions, and where each cap came from."""
  cap = ('min(value, the run\'s loss at init)' if report.capped_by_init else
         f'min(value, {lr_curves.FALLBACK_FACTOR} x the largest finite value)')
  text = (
      f'{report.metric} against {report.key}; lower is better. Every run counts as {cap}; '
      'runs that diverged or ended non-finite count as that cap (× in the plot). '
      f'Best {report.key}: argmin of the seed-mean curve, with the range of each seed\'s own '
      'argmin. LR sensitivity (Wortsman et al. 2023): per seed, mean over the grid minus the '
      'minimum over the grid, then mean ± std over seeds (seeds with the whole grid). Basin: '
      f'decades of {report.key} over the contiguous grid points around the best whose mean is '
      f'within {lr_curves.BASIN_TOL} of the best (≥: it reaches the grid\'s end). Δ = curve − '
      f'baseline (`{report.baseline}`) with Welch\'s 95% t-interval over seeds; * excludes 0.')
  if report.init_from_vocab:
    text += (f' {report.init_from_vocab} run(s) have no init_loss in summary.json (older '
             'runs): their loss at init is taken as ln(model.vocab_size).')
  if report.skipped:
    text += f' {report.skipped} unfinished run(s) left out.'
  return text


def write_csv(report: Report, path: Path) -> None:
  """One line per curve with raw numbers."""
  fields = ['curve', 'seeds', 'best_x', 'best_x_seed_min', 'best_x_seed_max', 'best_mean',
            'best_std', 'sensitivity_mean', 'sensitivity_std', 'basin_lo', 'basin_hi',
            'basin_decades', 'basin_at_edge', 'diverged', 'baseline', 'best_diff', 'best_ci_low',
            'best_ci_high', 'sensitivity_diff', 'sensitivity_ci_low', 'sensitivity_ci_high']
  with open(path, 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for c in report.curves:
      best, sens = c.best_loss, c.sensitivity
      row = {'curve': c.label, 'seeds': len(c.sensitivities), 'best_x': c.best_x,
             'best_mean': best.mean, 'best_std': best.std, 'basin_lo': c.basin[0],
             'basin_hi': c.basin[1], 'basin_decades': c.basin_width, 'basin_at_edge': c.at_edge,
             'diverged': ';'.join(f'{x!r}:{n}' for x, n in zip(c.xs, c.failed) if n),
             'baseline': report.baseline}
      if c.best_x_seeds:
        row.update(best_x_seed_min=c.best_x_seeds[0], best_x_seed_max=c.best_x_seeds[1])
      if sens:
        row.update(sensitivity_mean=sens.mean, sensitivity_std=sens.std)
      for name, ci in zip(('best', 'sensitivity'), report.diffs.get(c.label, (None, None))):
        if ci:
          row.update({f'{name}_diff': ci.diff, f'{name}_ci_low': ci.low,
                      f'{name}_ci_high': ci.high})
      w.writerow({k: ('' if v is None else v) for k, v in row.items()})
