"""Experiments and sweeps registered by name.

An experiment is a function returning a full, validated ExperimentConfig; its docstring
opens with one line of description, then the command and the expected result.

    @experiment
    def lm_tiny():
      \"\"\"A tiny LM. ...\"\"\"
      return ExperimentConfig(...)

    @experiment
    def lm_tiny_rope():
      \"\"\"lm_tiny with RoPE.\"\"\"
      return derive('lm_tiny', {'model.position': 'rope'})   # variants derive, never copy

A sweep is a base experiment x axes of overrides x seeds (the language: tx/sweep/axes.py):

    sweep('ablate_positions', base='lm_tiny', seeds=3,
          axes=axis('model.position', ['sinusoidal', 'rope', 'alibi']),
          baseline={'model.position': 'sinusoidal'}, description='...')

Built-in experiments and sweeps live in the top-level `experiments/` package and register
on import.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Callable

from tx.config.base import ConfigError, override
from tx.config.experiment import ExperimentConfig
from tx.sweep.axes import axis, cases, lr_grid, product, zip_  # noqa: F401  (the sweep language)
from tx.sweep.spec import Sweep, make_sweep


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  fn: Callable[[], ExperimentConfig]
  description: str
  doc: str


_EXPERIMENTS: dict[str, Entry] = {}
_SWEEPS: dict[str, Sweep] = {}
_LOADED = False


def experiment(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
  """Registers `fn` under its function name (a second registration of a name is an error)."""
  name = fn.__name__
  if name in _EXPERIMENTS and _EXPERIMENTS[name].fn is not fn:
    raise ValueError(f'experiment {name!r} is registered twice')
  doc = (fn.__doc__ or '').strip()
  _EXPERIMENTS[name] = Entry(name, fn, doc.splitlines()[0] if doc else '', doc)
  return fn


def load_builtin() -> None:
  """Imports every module of the `experiments` package (they register on import)."""
  global _LOADED
  if _LOADED:
    return
  _LOADED = True
  try:
    package = importlib.import_module('experiments')
  except ImportError:
    return
  for info in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f'experiments.{info.name}')


def names() -> list[str]:
  load_builtin()
  return sorted(_EXPERIMENTS)


def entry(name: str) -> Entry:
  load_builtin()
  if name not in _EXPERIMENTS:
    known = ', '.join(sorted(_EXPERIMENTS)) or 'none'
    raise ConfigError(f'experiment {name!r} is not registered; known experiments: {known} '
                      '(see `tx list`)')
  return _EXPERIMENTS[name]


def get(name: str, overrides: dict | None = None) -> ExperimentConfig:
  """The named experiment's config with its name set and `overrides` applied."""
  cfg = entry(name).fn().replace(name=name)
  return override(cfg, overrides) if overrides else cfg


def derive(base: str, overrides: dict) -> ExperimentConfig:
  """A variant of a registered experiment: the base config plus dotted overrides."""
  return override(entry(base).fn(), overrides)


def sweep(name: str, *, base: str, axes=None, seeds=1, baseline=None,
          overrides: dict | None = None, description: str = '') -> Sweep:
  """Registers and returns the sweep `name`: experiment `base` x `axes` x `seeds`.

  axes: axis(...), product(...), zip_(...), cases(...) or a list of them (their product);
  seeds: a count or a list of offsets added to the base train.seed; baseline: the
  overrides (or the name) of the variant others are compared with (default: the first);
  overrides: applied to every variant. Configs are validated when the sweep is planned.
  """
  s = make_sweep(name, base=base, axes=axes, seeds=seeds, baseline=baseline,
                 overrides=overrides, description=description)
  if name in _SWEEPS and _SWEEPS[name] != s:
    raise ValueError(f'sweep {name!r} is registered twice')
  _SWEEPS[name] = s
  return s


def sweep_names() -> list[str]:
  """Names of the registered sweeps, sorted."""
  load_builtin()
  return sorted(_SWEEPS)


def get_sweep(name: str) -> Sweep:
  """The registered sweep `name` (ConfigError listing the known sweeps otherwise)."""
  load_builtin()
  if name not in _SWEEPS:
    known = ', '.join(sorted(_SWEEPS)) or 'none'
    hint = f'; {name} is an experiment: use `tx train {name}`' if name in _EXPERIMENTS else ''
    raise ConfigError(f'sweep {name!r} is not registered; known sweeps: {known} '
                      f'(see `tx list`){hint}')
  return _SWEEPS[name]
