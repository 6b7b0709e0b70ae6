"""The comparison table: per variant, seeds, mean +- std of the final and best eval metric,
cost columns, and the difference to the baseline with Welch's 95% t-interval.

`build` computes rows from a Collection; `markdown` and `write_csv` render them.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

from tx.compare import stats
from tx.compare.runs import Collection, flat
from tx.config.base import ConfigError

_HIGHER_IS_BETTER = ('accuracy', 'bleu', 'chrf')


@dataclasses.dataclass
class Row:
  """One variant's line of the table."""
  variant: str
  n: int  # finished runs that have the metric
  planned: int  # runs known for the variant (finished or not)
  failed: int
  metric: stats.Summary | None
  best: stats.Summary | None
  params: int | None  # mean over seeds (the same for every seed)
  tokens_per_s: float | None
  wall_time_s: float | None
  diff: float | None  # mean(variant) - mean(baseline)
  interval: stats.Interval | None
  verdict: str  # baseline | better | worse | within noise | n/a


@dataclasses.dataclass
class Table:
  """Rows plus what they measure."""
  rows: list[Row]
  metric: str
  best_metric: str | None
  baseline: str
  higher_is_better: bool


def metric_value(summary: dict, key: str) -> float | None:
  """The number at dotted `key` of a summary (`eval.loss`, `eval.extrapolation.256`)."""
  values = flat(summary)
  value = values.get(key, values.get(key + '.perplexity'))
  if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
    return float(value)
  return None


def resolve_metric(collection: Collection, metric: str) -> str:
  """`metric` as a summary key; a bare name (`bits_per_byte`) means `eval.<name>`."""
  summaries = [r.summary for r in collection.runs if r.summary]
  if not summaries:
    raise ConfigError('no finished runs yet (no summary.json); wait for a run to finish or '
                      'check the directories')
  for key in (metric, f'eval.{metric}'):
    if any(metric_value(s, key) is not None for s in summaries):
      return key
  available = sorted({k for s in summaries for k, v in flat(s).items()
                      if k.startswith(('eval.', 'best_eval.')) and isinstance(v, (int, float))})
  raise ConfigError(f'--metric {metric}: no run has it; available: {", ".join(available)}')


def higher_is_better(metric: str) -> bool:
  """Accuracy, BLEU and chrF go up; losses, perplexities and bits per byte go down."""
  return any(word in metric.lower() for word in _HIGHER_IS_BETTER)


def _mean_of(values: list) -> float | None:
  values = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
  return stats.mean(values) if values else None


def _round(x: float | None) -> int | None:
  return None if x is None else int(round(x))


def build(collection: Collection, metric: str, baseline: str) -> Table:
  """The table for `metric` with differences to `baseline` (a variant name)."""
  up = higher_is_better(metric)
  best_metric = 'best_' + metric if metric.startswith('eval.') else None
  by_variant = {v: [r for r in collection.runs if r.variant == v] for v in collection.variants}
  values = {v: [x for r in runs if r.summary and (x := metric_value(r.summary, metric)) is not None]
            for v, runs in by_variant.items()}
  base_values = values.get(baseline, [])
  rows = []
  for v, runs in by_variant.items():
    done = [r.summary for r in runs if r.summary]
    xs = values[v]
    best = [x for s in done if best_metric and (x := metric_value(s, best_metric)) is not None]
    diff = interval = None
    if v == baseline:
      verdict = 'baseline'
    elif xs and base_values:
      diff = stats.mean(xs) - stats.mean(base_values)
      interval = stats.welch_interval(xs, base_values)
      if interval is None:
        verdict = 'n/a (1 seed)'
      elif not interval.excludes_zero:
        verdict = 'within noise'
      else:
        verdict = 'better' if (interval.diff > 0) == up else 'worse'
    else:
      verdict = 'n/a'
    rows.append(Row(
        variant=v, n=len(xs), planned=len(runs), failed=sum(bool(r.error) for r in runs),
        metric=stats.summarize(xs) if xs else None, best=stats.summarize(best) if best else None,
        params=_round(_mean_of([s.get('params') for s in done])),
        tokens_per_s=_mean_of([s.get('tokens_per_s') for s in done]),
        wall_time_s=_mean_of([s.get('wall_time_s') for s in done]),
        diff=diff, interval=interval, verdict=verdict))
  return Table(rows, metric, best_metric, baseline, up)


def num(x: float | None, signed: bool = False) -> str:
  """A metric value for humans: 4 decimals, thousands separators above 1000."""
  if x is None:
    return '-'
  sign = '+' if signed else ''
  return f'{x:{sign},.0f}' if abs(x) >= 1000 else f'{x:{sign}.4f}'


def _mean_std(s: stats.Summary | None) -> str:
  if s is None:
    return '-'
  return num(s.mean) + (f' ± {num(s.std)}' if s.std is not None else '')


def _diff_cell(row: Row) -> str:
  if row.verdict == 'baseline':
    return '(baseline)'
  if row.diff is None:
    return 'n/a'
  if row.interval is None:
    return f'{num(row.diff, True)} (CI n/a)'
  mark = ' *' if row.interval.excludes_zero else ''
  return (f'{num(row.diff, True)} '
          f'[{num(row.interval.low, True)}, {num(row.interval.high, True)}]{mark}')


def _seeds_cell(row: Row) -> str:
  text = str(row.n) if row.n == row.planned else f'{row.n}/{row.planned}'
  return text + (f' ({row.failed} failed)' if row.failed else '')


def _count(x: float | None) -> str:
  return '-' if x is None else f'{x:,.0f}'


def _seconds(x: float | None) -> str:
  if x is None:
    return '-'
  return f'{x:.0f}s' if x < 120 else f'{x / 60:.1f}min'


def markdown_table(table: Table) -> str:
  """The table as GitHub Markdown."""
  head = ['variant', 'seeds', f'{table.metric} (mean ± std)']
  if table.best_metric:
    head.append(table.best_metric)
  head += ['Δ vs baseline [95% CI]', 'verdict', 'params', 'tokens/s', 'wall time']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '|'.join('---' for _ in head) + '|']
  for r in table.rows:
    cells = [f'`{r.variant}`', _seeds_cell(r), _mean_std(r.metric)]
    if table.best_metric:
      cells.append(_mean_std(r.best))
    cells += [_diff_cell(r), r.verdict, _count(r.params), _count(r.tokens_per_s),
              _seconds(r.wall_time_s)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def legend(table: Table) -> str:
  """One paragraph saying how to read the table."""
  direction = 'higher' if table.higher_is_better else 'lower'
  return (f'{table.metric}: {direction} is better; mean ± sample std over seeds (final eval). '
          f'Δ = variant − baseline (`{table.baseline}`) with Welch\'s 95% t-interval over the '
          'seed values; * marks an interval that excludes 0 (a difference larger than seed '
          'noise); with one seed on either side there is no interval (n/a).')


def write_csv(table: Table, path: Path) -> None:
  """One line per variant with raw numbers (no formatting)."""
  m, b = table.metric, table.best_metric
  fields = ['variant', 'seeds', 'planned', 'failed', f'{m}_mean', f'{m}_std', f'{m}_min',
            f'{m}_max']
  if b:
    fields += [f'{b}_mean', f'{b}_std']
  fields += ['baseline', 'diff', 'ci_low', 'ci_high', 'df', 'excludes_zero', 'verdict',
             'params', 'tokens_per_s', 'wall_time_s']
  with open(path, 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for r in table.rows:
      row = {'variant': r.variant, 'seeds': r.n, 'planned': r.planned, 'failed': r.failed,
             'baseline': table.baseline, 'diff': r.diff, 'verdict': r.verdict,
             'params': r.params, 'tokens_per_s': r.tokens_per_s, 'wall_time_s': r.wall_time_s}
      if r.metric:
        row.update({f'{m}_mean': r.metric.mean, f'{m}_std': r.metric.std,
                    f'{m}_min': r.metric.min, f'{m}_max': r.metric.max})
      if b and r.best:
        row.update({f'{b}_mean': r.best.mean, f'{b}_std': r.best.std})
      if r.interval:
        row.update({'ci_low': r.interval.low, 'ci_high': r.interval.high, 'df': r.interval.df,
                    'excludes_zero': r.interval.excludes_zero})
      w.writerow({k: ('' if v is None else v) for k, v in row.items()})
