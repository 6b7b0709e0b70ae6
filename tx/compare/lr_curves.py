"""Learning-rate sensitivity curves (Wortsman et al. 2023, "Small-scale proxies for
large-scale Transformer training instabilities"): pure functions of plain lists, no I/O.

A curve is a loss (lower is better) measured at each value x of a swept key (typically
optim.learning_rate) for several seeds. The definitions `tx compare --x` reports:

- capping: every run counts as min(value, cap), where cap is the run's loss at
  initialisation, else the mean loss at init of the curve's other runs, else a fallback the
  caller passes (1.1 x the largest finite value on the plot). A run that diverged, or whose
  value is missing or non-finite, counts as exactly its cap (Wortsman: min(loss, init loss)).
- best x: the argmin over the grid of the seed-mean capped curve (ties: the smaller x). The
  spread of the best x is min..max of each seed's own argmin.
- best loss: the capped values at the best x, mean +- std over seeds.
- LR sensitivity: per seed, the mean over the grid of the capped values minus their minimum
  over the grid; then mean +- std over seeds. Seeds missing a grid point (unfinished runs)
  are left out of the per-seed numbers.
- basin width: log10(x_hi) - log10(x_lo) in decades, over the contiguous run of grid points
  around the best x whose seed-mean capped loss is within `tol` (0.1 nats) of the best
  mean; 0 when only the best point qualifies; None on a linear axis (some x <= 0). A basin
  that reaches the end of the grid is a lower bound (`Curve.at_edge`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Hashable, Sequence

from tx.compare import stats

BASIN_TOL = 0.1  # nats: how far above the best mean loss still counts as the basin
FALLBACK_FACTOR = 1.1  # the cap without a known loss at init: max finite value x this


@dataclasses.dataclass(frozen=True)
class Point:
  """One run: its x, seed, metric value (None when missing), whether training diverged
  (summary status 'diverged'), and its loss at initialisation (None when unknown)."""
  x: float
  seed: Hashable
  value: float | None
  diverged: bool = False
  init_loss: float | None = None

  @property
  def failed(self) -> bool:
    """Diverged, or ended without a finite value: drawn and counted at its cap."""
    return self.diverged or self.value is None or not math.isfinite(self.value)


@dataclasses.dataclass(frozen=True)
class Curve:
  """One curve's grid statistics (x ascending; values capped) and its summary numbers."""
  label: str
  xs: list[float]
  mean: list[float]  # seed-mean capped value per x
  low: list[float]  # min over seeds per x
  high: list[float]  # max over seeds per x
  runs: list[int]  # runs per x
  failed: list[int]  # diverged / non-finite runs per x
  points: list[tuple[float, float, bool]]  # (x, capped value, failed) per run, for drawing
  best_x: float
  best_x_seeds: tuple[float, float] | None  # min, max of the complete seeds' own argmins
  best_values: list[float]  # capped values at best_x, one per run there
  sensitivities: list[float]  # one per seed with the whole grid
  basin: tuple[float, float]  # x_lo, x_hi
  basin_width: float | None  # decades; None on a linear axis
  at_edge: bool  # the basin reaches the end of the grid: its width is a lower bound
  log_x: bool

  @property
  def best_loss(self) -> stats.Summary:
    """Mean +- std over seeds of the capped value at the best x."""
    return stats.summarize(self.best_values)

  @property
  def sensitivity(self) -> stats.Summary | None:
    """Mean +- std over seeds of the LR sensitivity; None when no seed has the whole grid."""
    return stats.summarize(self.sensitivities) if self.sensitivities else None


def fallback_cap(points: Sequence[Point]) -> float | None:
  """1.1 x the largest finite value among `points` (every curve on the plot); None if none."""
  finite = [p.value for p in points if not p.failed]
  return FALLBACK_FACTOR * max(finite) if finite else None


def caps(points: Sequence[Point], fallback: float | None) -> list[float]:
  """Each point's cap: its own init loss, else the mean init loss of the others, else
  `fallback`; with none of them, inf for a finished run and ValueError for a failed one."""
  known = [p.init_loss for p in points if p.init_loss is not None]
  curve_init = stats.mean(known) if known else fallback
  if curve_init is None and any(p.init_loss is None and p.failed for p in points):
    raise ValueError('a failed run, no loss at init and no finite value to cap at')
  default = math.inf if curve_init is None else curve_init
  return [p.init_loss if p.init_loss is not None else default for p in points]


def capped(points: Sequence[Point], fallback: float | None) -> list[float]:
  """min(value, cap) per point; the cap itself for a failed point."""
  return [c if p.failed else min(p.value, c) for p, c in zip(points, caps(points, fallback))]


def sensitivity(values: Sequence[float]) -> float:
  """Wortsman's LR sensitivity of one seed's capped grid: mean(values) - min(values)."""
  return stats.mean(list(values)) - min(values)


def argmin(values: Sequence[float]) -> int:
  """Index of the smallest value (the first on ties)."""
  return min(range(len(values)), key=lambda i: (values[i], i))


def basin(means: Sequence[float], best: int, tol: float = BASIN_TOL) -> tuple[int, int]:
  """(first, last) index of the contiguous grid points around `best` with
  means[i] <= means[best] + tol."""
  limit = means[best] + tol
  lo = hi = best
  while lo > 0 and means[lo - 1] <= limit:
    lo -= 1
  while hi < len(means) - 1 and means[hi + 1] <= limit:
    hi += 1
  return lo, hi


def basin_width(xs: Sequence[float], means: Sequence[float],
                tol: float = BASIN_TOL) -> float | None:
  """Decades of x spanned by the basin around the argmin of `means`; None if some x <= 0."""
  if min(xs) <= 0:
    return None
  lo, hi = basin(means, argmin(means), tol)
  return math.log10(xs[hi]) - math.log10(xs[lo])


def analyze(label: str, points: Sequence[Point], fallback: float | None,
            tol: float = BASIN_TOL) -> Curve:
  """Grid statistics and summary numbers of one curve (see the module docstring)."""
  if not points:
    raise ValueError(f'curve {label}: no points')
  values = capped(points, fallback)
  xs = sorted({p.x for p in points})
  at_x = {x: [v for p, v in zip(points, values) if p.x == x] for x in xs}
  mean = [stats.mean(at_x[x]) for x in xs]
  best = argmin(mean)
  lo, hi = basin(mean, best, tol)
  log_x = xs[0] > 0
  by_seed: dict[Hashable, dict[float, float]] = {}
  for p, v in zip(points, values):
    by_seed.setdefault(p.seed, {})[p.x] = v
  complete = [[grid[x] for x in xs] for grid in by_seed.values() if len(grid) == len(xs)]
  seed_best = [xs[argmin(row)] for row in complete]
  return Curve(
      label=label, xs=xs, mean=mean, low=[min(at_x[x]) for x in xs],
      high=[max(at_x[x]) for x in xs], runs=[len(at_x[x]) for x in xs],
      failed=[sum(p.failed for p in points if p.x == x) for x in xs],
      points=[(p.x, v, p.failed) for p, v in zip(points, values)],
      best_x=xs[best], best_x_seeds=(min(seed_best), max(seed_best)) if seed_best else None,
      best_values=at_x[xs[best]], sensitivities=[sensitivity(row) for row in complete],
      basin=(xs[lo], xs[hi]),
      basin_width=math.log10(xs[hi]) - math.log10(xs[lo]) if log_x else None,
      at_edge=(lo == 0 or hi == len(xs) - 1) and len(xs) > 1, log_x=log_x)


def differences(curve: Curve, base: Curve,
                confidence: float = 0.95) -> tuple[stats.Interval | None, stats.Interval | None]:
  """Welch intervals for curve - base of (best loss, LR sensitivity) over seeds; None for a
  side with fewer than two seeds."""
  return (stats.welch_interval(curve.best_values, base.best_values, confidence),
          stats.welch_interval(curve.sensitivities, base.sensitivities, confidence))
