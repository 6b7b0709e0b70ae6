"""`Sweep`: a base experiment x axes of overrides x seeds, and its expansion into runs.

    s = make_sweep('ablate_positions', base='lm_shakespeare_small',
                   axes=axis('model.position', ['sinusoidal', 'rope', 'alibi']), seeds=3,
                   baseline={'model.position': 'sinusoidal'})
    runs = plan(s, 'runs/pos', resolve=registry.get)   # every config validated, nothing written

The sweep names its base experiment; `resolve` (the registry's `get`, or any function
(base, overrides) -> ExperimentConfig) turns names into configs, so tx.sweep never imports
the registry (which sits above it and builds sweeps).

Run k of a variant trains with `train.seed = base seed + k` into `WORKDIR/<variant>/seed_<k>`.
The config keeps the base experiment's name, so `tx train BASE --set ...` (see
`Run.command`) reproduces any run exactly.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import shlex
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tx.config.base import ConfigError, flatten, parse_literal
from tx.sweep.axes import Axes, as_axes
from tx.sweep.names import short_keys, variant_name

Resolver = Callable[[str, Mapping[str, Any]], Any]  # (base name, overrides) -> ExperimentConfig


@dataclasses.dataclass(frozen=True)
class Variant:
  """One point of the sweep: its name and the axis overrides that define it."""
  name: str
  overrides: dict


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A registered sweep (see `tx.registry.sweep`)."""
  name: str
  base: str
  axes: Axes
  seeds: tuple[int, ...]
  baseline: str  # a variant name
  overrides: tuple[tuple[str, Any], ...] = ()  # applied to every variant, before the axes
  description: str = ''

  @property
  def variants(self) -> list[Variant]:
    """The variants in axis order, each named from its overrides."""
    short = short_keys(self.axes.keys)
    return [Variant(variant_name(dict(v), short), dict(v)) for v in self.axes.variants]


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of a sweep: a variant and a seed, with its resolved config."""
  variant: str
  seed: int  # the k of seed_<k>
  dir: Path
  overrides: dict  # everything applied to the base experiment, train.seed included
  config: Any  # the validated ExperimentConfig

  def command(self, base: str, experiments: Sequence[str] = ()) -> str:
    """The `tx train` line that performs this run (`--experiments` for each source of
    user-registered experiments the base needs)."""
    sets = [f'{k}={cli_value(v)}' for k, v in self.overrides.items()]
    sources = [a for source in experiments for a in ('--experiments', source)]
    return shlex.join(['tx', 'train', base, *sources, '--workdir', str(self.dir), '--set',
                       *sets])


def cli_value(value: Any) -> str:
  """`value` as `--set key=VALUE` text that parses back to the same value."""
  if isinstance(value, str) and parse_literal(value) == value:
    return value
  return repr(value)


def _same(a, b) -> bool:
  norm = lambda v: parse_literal(v) if isinstance(v, str) else (
      list(v) if isinstance(v, tuple) else v)
  return norm(a) == norm(b)


def _seeds(seeds) -> tuple[int, ...]:
  if isinstance(seeds, int) and not isinstance(seeds, bool):
    if seeds < 1:
      raise ConfigError(f'seeds: must be >= 1, got {seeds}')
    return tuple(range(seeds))
  if isinstance(seeds, Sequence) and seeds and all(
      isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
    return tuple(dict.fromkeys(seeds))
  raise ConfigError(f'seeds: expected a count (3) or a list of seed offsets ([0, 1, 2]), '
                    f'got {seeds!r}')


def _baseline(name: str, variants: list[Variant], baseline) -> str:
  if baseline is None:
    return variants[0].name
  if isinstance(baseline, str):
    if baseline in {v.name for v in variants}:
      return baseline
    raise ConfigError(f'sweep {name}: baseline {baseline!r} is not a variant; variants are '
                      + ', '.join(v.name for v in variants))
  if isinstance(baseline, Mapping):
    hits = [v for v in variants if all(k in v.overrides and _same(v.overrides[k], x)
                                       for k, x in baseline.items())]
    if len(hits) == 1:
      return hits[0].name
    what = 'matches no variant' if not hits else 'matches several variants'
    raise ConfigError(f'sweep {name}: baseline {dict(baseline)} {what}; variants are '
                      + ', '.join(v.name for v in variants))
  raise ConfigError(f'sweep {name}: baseline must be a dict of overrides or a variant name, '
                    f'got {baseline!r}')


def make_sweep(name: str, *, base: str, axes=None, seeds=1, baseline=None,
               overrides: Mapping[str, Any] | None = None, description: str = '') -> Sweep:
  """Builds and checks a Sweep (names unique, baseline found); configs are checked by `plan`."""
  if not isinstance(base, str) or not base:
    raise ConfigError(f'sweep {name}: base must be the name of a registered experiment')
  axes_ = as_axes(axes)
  short = short_keys(axes_.keys)
  variants = [Variant(variant_name(dict(v), short), dict(v)) for v in axes_.variants]
  seen: dict[str, Variant] = {}
  for v in variants:
    if v.name in seen:
      raise ConfigError(f'sweep {name}: two variants are both named {v.name!r} '
                        f'({seen[v.name].overrides} and {v.overrides}); make their values differ')
    seen[v.name] = v
  return Sweep(name=name, base=base, axes=axes_, seeds=_seeds(seeds),
               baseline=_baseline(name, variants, baseline),
               overrides=tuple((overrides or {}).items()), description=description)


def matches(name: str, patterns: Sequence[str] | None) -> bool:
  """True when `name` contains any pattern: plain text (`rope`) or a glob (`post*rms`),
  both matched anywhere in the name (case-sensitive)."""
  if not patterns:
    return True
  return any(p in name or fnmatch.fnmatchcase(name, f'*{p}*') for p in patterns)


def plan(sweep: Sweep, workdir, *, resolve: Resolver, seeds: int | None = None,
         extra: Mapping[str, Any] | None = None) -> list[Run]:
  """Every run of `sweep` (variant x seed) with its config resolved and validated.

  `resolve(base, overrides)` turns the base experiment's name and a variant's overrides
  into a validated ExperimentConfig (`tx.registry.get`). `seeds` replaces the sweep's seed
  count and `extra` (`--set`) is applied to every run.
  Raises ConfigError naming the variant and key when any config is invalid, so a bad
  variant stops the sweep before anything runs.
  """
  extra = dict(extra or {})
  axis_keys = set(sweep.axes.keys)
  for key in extra:
    if key == 'train.seed':
      raise ConfigError('--set train.seed: the sweep sets train.seed per run (base seed + k); '
                        'use --seeds N instead')
    if key in axis_keys:
      raise ConfigError(f'--set {key}: {key} is an axis of sweep {sweep.name}; use --only to '
                        'pick its variants instead')
  offsets = sweep.seeds if seeds is None else _seeds(seeds)
  workdir = Path(workdir)
  runs = []
  for v in sweep.variants:
    overrides = {**dict(sweep.overrides), **v.overrides, **extra}
    try:
      cfg = resolve(sweep.base, overrides)
    except ConfigError as e:
      raise ConfigError(f'sweep {sweep.name}, variant {v.name}: {e}') from None
    values = flatten(cfg)  # the typed values (command-line --set text arrives as str)
    overrides = {k: values.get(k, x) for k, x in overrides.items()}
    for k in offsets:
      seed = cfg.train.seed + k
      runs.append(Run(variant=v.name, seed=k, dir=workdir / v.name / f'seed_{k}',
                      overrides={**overrides, 'train.seed': seed},
                      config=cfg.replace(train=cfg.train.replace(seed=seed))))
  return runs


def select(runs: list[Run], only: Sequence[str] | None, sweep: Sweep) -> list[Run]:
  """The runs whose variant matches `--only` (all of them without patterns)."""
  chosen = [r for r in runs if matches(r.variant, only)]
  if not chosen:
    raise ConfigError(f'--only {" ".join(only or [])}: matches no variant of {sweep.name}; '
                      'variants are ' + ', '.join(v.name for v in sweep.variants))
  return chosen
