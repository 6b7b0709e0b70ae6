"""Experiments (and, later, sweeps) registered by name.

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

Built-in experiments live in the top-level `experiments/` package and register on import.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Callable

from tx.config.base import ConfigError, override
from tx.config.experiment import ExperimentConfig


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  fn: Callable[[], ExperimentConfig]
  description: str
  doc: str


_EXPERIMENTS: dict[str, Entry] = {}
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
