"""Statistics over seeds and rounds: mean, sample std, Welch's t-interval for a difference of
means, and a t-interval for the geometric mean of paired ratios (`tx bench`'s rounds).

Pure functions of lists of floats (no file I/O), so they can be tested against hand
computations and scipy. With fewer than two seeds on either side there is no spread to
estimate, and the interval is None ('n/a' in tables).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Summary:
  """n, mean, sample standard deviation (ddof=1; None for n < 2), min and max."""
  n: int
  mean: float
  std: float | None
  min: float
  max: float


@dataclasses.dataclass(frozen=True)
class Interval:
  """`diff` = mean(a) - mean(b) with its confidence interval [low, high]."""
  diff: float
  low: float
  high: float
  df: float
  confidence: float

  @property
  def excludes_zero(self) -> bool:
    """True when the interval lies entirely above or entirely below 0."""
    return self.low > 0 or self.high < 0


def mean(xs: Sequence[float]) -> float:
  """Arithmetic mean (ValueError on an empty sequence)."""
  if not xs:
    raise ValueError('mean of no values')
  return math.fsum(xs) / len(xs)


def std(xs: Sequence[float]) -> float | None:
  """Sample standard deviation (n - 1 in the denominator); None for fewer than 2 values."""
  if len(xs) < 2:
    return None
  m = mean(xs)
  return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def summarize(xs: Sequence[float]) -> Summary:
  """n, mean, std, min, max of `xs` (which must not be empty)."""
  xs = [float(x) for x in xs]
  return Summary(len(xs), mean(xs), std(xs), min(xs), max(xs))


def t_quantile(p: float, df: float) -> float:
  """The p-quantile of Student's t distribution with `df` degrees of freedom."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  (heavy: kept off start-up)
  return float(stats.t.ppf(p, df))


def welch_interval(a: Sequence[float], b: Sequence[float],
                   confidence: float = 0.95) -> Interval | None:
  """Welch's t-interval for mean(a) - mean(b) (unequal variances); None if n < 2 on a side.

  se = sqrt(s_a^2/n_a + s_b^2/n_b); df by Welch-Satterthwaite
  (se^4 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))); interval = diff +- t * se.
  """
  if len(a) < 2 or len(b) < 2:
    return None
  na, nb = len(a), len(b)
  va, vb = std(a) ** 2 / na, std(b) ** 2 / nb
  diff = mean(a) - mean(b)
  se = math.sqrt(va + vb)
  if se == 0:  # identical values within each side: no spread, the interval is a point
    return Interval(diff, diff, diff, float(na + nb - 2), confidence)
  df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
  half = t_quantile(0.5 + confidence / 2, df) * se
  return Interval(diff, diff - half, diff + half, df, confidence)


def ratio_interval(ratios: Sequence[float], confidence: float = 0.95) -> Interval | None:
  """The geometric mean of paired ratios (round i's a / round i's b, measured side by side)
  with a t-interval, both as ratios: the mean and interval of log(ratio), exponentiated.
  `diff` is the geometric mean, [low, high] its interval, `df` = n - 1. Logs make 0.8x and
  1.25x equally far from 1. Treats the rounds as independent draws; None for fewer than
  2 ratios, ValueError on a ratio that is not positive."""
  if any(not r > 0 for r in ratios):
    raise ValueError(f'ratios must be positive, got {list(ratios)}')
  if len(ratios) < 2:
    return None
  logs = [math.log(r) for r in ratios]
  center, spread = mean(logs), std(logs) / math.sqrt(len(logs))
  half = t_quantile(0.5 + confidence / 2, len(logs) - 1) * spread if spread else 0.0
  return Interval(math.exp(center), math.exp(center - half), math.exp(center + half),
                  float(len(logs) - 1), confidence)
