"""PNG plots for `tx compare` (matplotlib's Agg canvas; no pyplot, no display needed).

- eval metric vs step and vs wall-clock time: one line per variant, the mean over seeds,
  with the min-max spread over seeds shaded. Time is measured from each run's first
  metrics.jsonl row. At a step only some seeds have reached (a sweep still running), the
  mean is over the seeds that have it.
- perplexity vs evaluation length (summary `eval.extrapolation`), log-scale y, one line
  per variant with mean +- std error bars over seeds.
- `--curves KEY`: any per-step metrics.jsonl column vs step, drawn like the eval curves.
- `--x KEY`: the summary metric vs a swept config key (tx/compare/lr_report.py), one line
  per curve (the seed mean of the capped values), min-max shaded, failed runs as x.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tx.compare.lr_curves import Curve
from tx.compare.runs import Collection, metric_rows
from tx.config.base import ConfigError


def _figure():
  # heavy: kept off start-up
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(7, 4.5), dpi=110)
  return fig, fig.subplots()


def _style(variant: str, baseline: str) -> dict:
  return {'color': 'black', 'linestyle': '--'} if variant == baseline else {}


def _eval_series(path: Path, key: str) -> dict[int, tuple[float, float]]:
  """{step: (seconds since the run's first row, value)}; a repeated step keeps its last row
  (rows logged again after a resume)."""
  rows = metric_rows(path)
  if not rows:
    return {}
  t0 = min(r.get('time', 0.0) for r in rows)
  return {int(r['step']): (r.get('time', t0) - t0, float(r[key]))
          for r in rows if isinstance(r.get(key), (int, float)) and 'step' in r
          and math.isfinite(r[key])}


def curve_key(collection: Collection, metric: str) -> str:
  """The metrics.jsonl column to plot: `eval/<name>` for `--metric eval.<name>` when logged,
  else `eval/loss`."""
  if metric.startswith('eval.'):
    key = 'eval/' + metric[len('eval.'):]
    if any(key in row for r in collection.runs for row in metric_rows(r.dir)):
      return key
  return 'eval/loss'


def _draw_variants(collection: Collection, key: str, baseline: str, axes) -> bool:
  """Mean over seeds of `key` per variant on (ax, 'step' | 'time') pairs; False if none."""
  drawn = False
  for variant in collection.variants:
    series = [s for r in collection.runs if r.variant == variant
              and (s := _eval_series(r.dir, key))]
    if not series:
      continue
    steps = sorted({step for s in series for step in s})
    values = [[s[step][1] for s in series if step in s] for step in steps]
    times = [np.mean([s[step][0] for s in series if step in s]) for step in steps]
    mean = np.array([np.mean(v) for v in values])
    low = np.array([np.min(v) for v in values])
    high = np.array([np.max(v) for v in values])
    label = f'{variant} (n={len(series)})'
    style = _style(variant, baseline)
    for ax, which in axes:
      x = steps if which == 'step' else times
      line, = ax.plot(x, mean, marker='.', label=label, **style)
      if len(series) > 1:
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    drawn = True
  return drawn


def curves(collection: Collection, key: str, baseline: str, out: Path) -> list[Path]:
  """`<key>_vs_step.png` and `<key>_vs_time.png` in `out`; [] when no run logged `key`."""
  step_fig, step_ax = _figure()
  time_fig, time_ax = _figure()
  if not _draw_variants(collection, key, baseline, ((step_ax, 'step'), (time_ax, 'time'))):
    return []
  name = key.replace('/', '_')
  paths = []
  for fig, ax, xlabel, suffix in ((step_fig, step_ax, 'step', 'step'),
                                  (time_fig, time_ax, 'wall-clock time (s)', 'time')):
    paths.append(_save_series(fig, ax, key, xlabel, suffix, out / f'{name}_vs_{suffix}.png'))
  return paths


def _save_series(fig, ax, key: str, xlabel: str, against: str, path: Path) -> Path:
  """Labels, grid and legend of a per-variant series plot, written to `path`."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(key)
  ax.set_title(f'{key} vs {against}: mean over seeds, min-max shaded')
  ax.grid(alpha=0.3)
  ax.legend(fontsize='small')
  fig.tight_layout()
  fig.savefig(path)
  return path


def _extrapolation(summary: dict | None) -> dict[int, float]:
  table = ((summary or {}).get('eval') or {}).get('extrapolation') or {}
  out = {}
  for length, value in table.items():
    if isinstance(value, dict):
      value = value.get('perplexity')
    try:
      out[int(length)] = float(value)
    except (TypeError, ValueError):
      continue
  return out


def extrapolation(collection: Collection, baseline: str, out: Path) -> list[Path]:
  """`extrapolation.png` (perplexity vs evaluation length); [] when no summary has it."""
  fig, ax = _figure()
  drawn = False
  for variant in collection.variants:
    tables = [t for r in collection.runs if r.variant == variant
              and (t := _extrapolation(r.summary))]
    if not tables:
      continue
    lengths = sorted({n for t in tables for n in t})
    values = [[t[n] for t in tables if n in t] for n in lengths]
    mean = [np.mean(v) for v in values]
    err = [np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in values]
    ax.errorbar(lengths, mean, yerr=err, marker='o', capsize=3,
                label=f'{variant} (n={len(tables)})', **_style(variant, baseline))
    drawn = True
  if not drawn:
    return []
  # heavy: kept off start-up
  from matplotlib.ticker import (  # pylint: disable=g-import-not-at-top
      NullFormatter, ScalarFormatter)
  ax.set_yscale('log')
  ax.set_xscale('log', base=2)
  ax.set_xticks(sorted({n for r in collection.runs for n in _extrapolation(r.summary)}))
  ax.xaxis.set_major_formatter(ScalarFormatter())
  ax.xaxis.set_minor_formatter(NullFormatter())
  ax.set_xlabel('evaluation length (tokens)')
  ax.set_ylabel('perplexity (log scale)')
  ax.set_title('length extrapolation: mean ± std over seeds')
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize='small')
  fig.tight_layout()
  path = out / 'extrapolation.png'
  fig.savefig(path)
  return [path]


def step_curves(collection: Collection, keys: list[str], baseline: str, out: Path) -> list[Path]:
  """`curve_<key>.png` per metrics.jsonl column in `keys` (`/` -> `_`) vs step: one line per
  variant, mean over seeds, min-max shaded. ConfigError for a key no run logged."""
  logged: set[str] = set()
  for r in collection.runs:
    for row in metric_rows(r.dir):
      logged.update(k for k, v in row.items() if isinstance(v, (int, float))
                    and not isinstance(v, bool))
  logged -= {'step', 'time'}
  missing = [k for k in keys if k not in logged]
  if missing:
    raise ConfigError(f'--curves {" ".join(missing)}: no run logged it in metrics.jsonl; '
                      f'logged: {", ".join(sorted(logged)) or "nothing yet"}')
  paths = []
  for key in dict.fromkeys(keys):
    fig, ax = _figure()
    _draw_variants(collection, key, baseline, ((ax, 'step'),))
    paths.append(_save_series(fig, ax, key, 'step', 'step',
                              out / f'curve_{key.replace("/", "_")}.png'))
  return paths


def metric_vs_x(curves_: list[Curve], key: str, metric: str, baseline: str,
                out: Path) -> Path:
  """`<metric>_vs_<key>.png`: per curve the seed mean of the capped metric against `key`
  (log x unless some x <= 0), min-max over seeds shaded, failed runs as x at their cap, the
  best x circled."""
  fig, ax = _figure()
  for c in curves_:
    style = _style(c.label, baseline)
    line, = ax.plot(c.xs, c.mean, marker='.', label=f'{c.label} (best {c.best_x:.3g})', **style)
    color = line.get_color()
    if max(c.runs) > 1:
      ax.fill_between(c.xs, c.low, c.high, color=color, alpha=0.2, linewidth=0)
    failed = [(x, v) for x, v, f in c.points if f]
    if failed:
      ax.scatter(*zip(*failed), marker='x', color=color, s=40, zorder=3)
    ax.scatter([c.best_x], [c.mean[c.xs.index(c.best_x)]], s=90, facecolors='none',
               edgecolors=color, zorder=3)
  if all(c.log_x for c in curves_):
    ax.set_xscale('log')
  ax.set_xlabel(key + (' (log scale)' if all(c.log_x for c in curves_) else ''))
  ax.set_ylabel(f'{metric} (capped)')
  ax.set_title(f'{metric} vs {key}\nmean over seeds, min-max shaded, × = diverged (at its cap)',
               fontsize='medium')
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize='small')
  fig.tight_layout()
  path = out / f'{metric}_vs_{key}.png'.replace('/', '_')
  fig.savefig(path)
  return path
