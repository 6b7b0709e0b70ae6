"""The sweep language: axes of dotted overrides, combined by `product` and `zip_`.

    axis('model.position', ['rope', 'alibi'])                  # 2 variants
    product(axis('model.norm', [...]), axis('model.ffn', [...]))  # every combination
    zip_(axis('model.norm_position', ['pre', 'post']),
         axis('optim.warmup_steps', [0, 500]))                  # element-wise pairs
    cases({'model.moe.num_experts': 0},
          {'model.moe.num_experts': 4, 'model.moe.top_k': 2})   # hand-written variants
    axis('optim.learning_rate', lr_grid(1e-4, 3e-1))           # a log-spaced LR sweep

Every expression is an `Axes`: an ordered tuple of variants, each variant an ordered
tuple of (dotted key, value) pairs. `product` and `zip_` accept any `Axes`, so they
compose: `product(zip_(a, b), c)`. `a * b` is `product(a, b)`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Iterable, Mapping

from tx.config.base import ConfigError

Variant = tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class Axes:
  """An ordered list of variants plus a JSON description of how it was built."""
  variants: tuple[Variant, ...]
  spec: Any  # JSON-friendly: {'axis': key, 'values': [...]}, {'product': [...]}, ...

  @property
  def keys(self) -> tuple[str, ...]:
    """Every dotted key set by some variant, in first-seen order."""
    seen: dict[str, None] = {}
    for variant in self.variants:
      for key, _ in variant:
        seen.setdefault(key, None)
    return tuple(seen)

  def __len__(self) -> int:
    return len(self.variants)

  def __mul__(self, other: 'Axes') -> 'Axes':
    return product(self, other)


def _json_value(value):
  if isinstance(value, tuple):
    return [_json_value(v) for v in value]
  return value


def axis(key: str, values: Iterable[Any]) -> Axes:
  """One dotted key taking each of `values` in turn (one variant per value)."""
  values = list(values)
  if not isinstance(key, str) or not key:
    raise ConfigError(f'axis: the key must be a dotted config key such as model.position, '
                      f'got {key!r}')
  if not values:
    raise ConfigError(f'axis {key}: needs at least one value')
  return Axes(tuple(((key, v),) for v in values),
              {'axis': key, 'values': [_json_value(v) for v in values]})


def lr_grid(lo: float, hi: float, per_decade: int = 3) -> list[float]:
  """Log-spaced values lo, lo * 10**(1/per_decade), ... up to hi (kept when on the grid).

  Each value is rounded to 3 significant digits so variant names stay readable:
  lr_grid(1e-4, 3e-1) == [1e-4, 2.15e-4, 4.64e-4, 1e-3, ..., 1e-1, 2.15e-1]
  (Wortsman et al. 2023 sweep learning rates this way, 3 per decade).
  """
  for name, v in (('lo', lo), ('hi', hi)):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      raise ConfigError(f'lr_grid: {name} must be a finite number, got {v!r}')
  if lo <= 0:
    raise ConfigError(f'lr_grid: lo must be > 0 for a log-spaced grid, got {lo!r}; '
                      'pass e.g. lr_grid(1e-4, 1e-1)')
  if hi < lo:
    raise ConfigError(f'lr_grid: hi ({hi!r}) is below lo ({lo!r}); swap them')
  if isinstance(per_decade, bool) or not isinstance(per_decade, int) or per_decade < 1:
    raise ConfigError(f'lr_grid: per_decade must be an integer >= 1, got {per_decade!r}')
  # A small tolerance keeps hi itself when it lies on the grid despite float error.
  steps = math.floor(per_decade * math.log10(hi / lo) + 1e-9)
  values = [float(f'{lo * 10 ** (k / per_decade):.3g}') for k in range(steps + 1)]
  return list(dict.fromkeys(values))


def cases(*variants: Mapping[str, Any]) -> Axes:
  """Hand-written variants, each a dict of dotted overrides (may set different keys)."""
  if not variants:
    raise ConfigError('cases: needs at least one dict of overrides')
  for v in variants:
    if not isinstance(v, Mapping):
      raise ConfigError(f'cases: each case must be a dict of dotted overrides, got {v!r}')
  return Axes(tuple(tuple(v.items()) for v in variants),
              {'cases': [{k: _json_value(x) for k, x in v.items()} for v in variants]})


def _merge(parts: Iterable[Variant], how: str) -> Variant:
  merged: dict[str, Any] = {}
  for part in parts:
    for key, value in part:
      if key in merged:
        raise ConfigError(f'{how}: key {key} appears in two axes; give each key one axis '
                          '(use zip_ to vary keys together)')
      merged[key] = value
  return tuple(merged.items())


def _axes(items) -> list[Axes]:
  out = []
  for a in items:
    if not isinstance(a, Axes):
      raise ConfigError(f'expected axis(...), product(...), zip_(...) or cases(...), got {a!r}')
    out.append(a)
  return out


def product(*axes: Axes) -> Axes:
  """Every combination of the variants of `axes` (the first axis varies slowest)."""
  axes_ = _axes(axes)
  if not axes_:
    return Axes(((),), {'product': []})
  variants = tuple(_merge(combo, 'product') for combo in
                   itertools.product(*(a.variants for a in axes_)))
  return Axes(variants, {'product': [a.spec for a in axes_]})


def zip_(*axes: Axes) -> Axes:
  """The i-th variants of all `axes` together; the axes must have the same length."""
  axes_ = _axes(axes)
  if not axes_:
    raise ConfigError('zip_: needs at least one axis')
  lengths = {len(a) for a in axes_}
  if len(lengths) > 1:
    desc = ', '.join(f'{"/".join(a.keys)}: {len(a)}' for a in axes_)
    raise ConfigError(f'zip_: the axes have different lengths ({desc}); give each the same '
                      'number of values, or use product')
  variants = tuple(_merge(parts, 'zip_') for parts in zip(*(a.variants for a in axes_)))
  return Axes(variants, {'zip': [a.spec for a in axes_]})


def as_axes(axes) -> Axes:
  """`None` (just the base), one Axes, or a list of Axes (their product)."""
  if axes is None:
    return product()
  if isinstance(axes, Axes):
    return axes
  if isinstance(axes, (list, tuple)):
    return product(*axes)
  raise ConfigError(f'axes: expected axis(...), product(...), zip_(...), cases(...) or a list '
                    f'of them, got {axes!r}')
