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

Where experiments come from (all register on import, in this order):
- the built-ins, the `tx.experiments` package;
- installed packages that declare an entry point in the group `tx.experiments`
  (`[project.entry-points."tx.experiments"] mine = "my_project.experiments"`);
- `TX_EXPERIMENTS` (os.pathsep-separated), then `--experiments` on the command line
  (`load_user`): a .py file or an importable module each.
A name registered by two different sources is an error naming both. A resolved
`config.json` (a run directory's) is an experiment too: `tx train path/config.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import pkgutil
import sys
from pathlib import Path
from typing import Callable

from tx.config.base import ConfigError, override
from tx.config.experiment import ExperimentConfig
from tx.sweep.axes import axis, cases, lr_grid, product, zip_  # noqa: F401  (the sweep language)
from tx.sweep.spec import Sweep, make_sweep


ENTRY_POINT_GROUP = 'tx.experiments'
ENV_VAR = 'TX_EXPERIMENTS'


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  fn: Callable[[], ExperimentConfig]
  description: str
  doc: str
  origin: str = ''  # the file (or module) that registered it


_EXPERIMENTS: dict[str, Entry] = {}
_SWEEPS: dict[str, Sweep] = {}
_SWEEP_ORIGINS: dict[str, str] = {}
_LOADED = False
_USER_SOURCES: list[str] = []  # loaded by load_user, in order


def experiment(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
  """Registers `fn` under its function name (a second registration of a name is an error)."""
  name = fn.__name__
  origin = _origin_of(fn)
  if name in _EXPERIMENTS and not _same_function(_EXPERIMENTS[name].fn, fn):
    raise ConfigError(f'experiment {name!r} is registered twice: in {_EXPERIMENTS[name].origin} '
                      f'and in {origin}; rename one of them')
  doc = (fn.__doc__ or '').strip()
  _EXPERIMENTS[name] = Entry(name, fn, doc.splitlines()[0] if doc else '', doc, origin)
  return fn


def load_builtin() -> None:
  """Imports the built-in experiments (`tx.experiments`), the installed packages' entry
  points (group `tx.experiments`) and the sources named in $TX_EXPERIMENTS, once."""
  global _LOADED
  if _LOADED:
    return
  _LOADED = True
  package = importlib.import_module('tx.experiments')
  for info in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f'tx.experiments.{info.name}')
  for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
    try:
      point.load()
    except ConfigError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f'entry point {point.name} = {point.value} (group {ENTRY_POINT_GROUP}) '
                        f'failed to import: {type(e).__name__}: {e}') from e
  for source in filter(None, os.environ.get(ENV_VAR, '').split(os.pathsep)):
    load_user(source, via=f'${ENV_VAR}')


def load_user(source: str, *, via: str = '--experiments') -> None:
  """Registers the experiments and sweeps of `source`: a .py file or an importable module.

  Loading the same source twice is a no-op; ConfigError (one line) when it cannot be found
  or fails to import.
  """
  load_builtin()
  key = str(Path(source).resolve()) if source.endswith('.py') else source
  if key in _USER_SOURCES:
    return
  _USER_SOURCES.append(key)
  try:
    if source.endswith('.py') or os.sep in source:
      _import_file(Path(source))
    else:
      importlib.import_module(source)
  except ConfigError:
    raise
  except ModuleNotFoundError as e:
    if e.name and source.startswith(e.name):
      raise ConfigError(f'{via}: {source!r} is neither a .py file nor an importable module; '
                        'pass a path to a .py file or a module on sys.path') from None
    raise ConfigError(f'{via} {source}: import failed: {e}') from e
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f'{via} {source}: import failed: {type(e).__name__}: {e}') from e


def _import_file(path: Path) -> None:
  if not path.is_file():
    raise ConfigError(f'--experiments: {path} does not exist; pass a .py file that registers '
                      'experiments, or an importable module')
  path = path.resolve()
  name = f'tx_user_experiments_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}'
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # dataclasses and pickling look the module up by name
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise


def _origin_of(obj) -> str:
  try:
    return inspect.getsourcefile(obj) or obj.__module__
  except TypeError:
    return getattr(obj, '__module__', '?')


def _same_function(a, b) -> bool:
  """True for one definition imported twice (a module reloaded): same file, same line."""
  return a is b or (_origin_of(a) == _origin_of(b) and
                    a.__code__.co_firstlineno == b.__code__.co_firstlineno)


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
  origin = _caller_file()
  if name in _SWEEPS and _SWEEPS[name] != s:
    raise ConfigError(f'sweep {name!r} is registered twice: in {_SWEEP_ORIGINS[name]} and in '
                      f'{origin}; rename one of them')
  _SWEEPS[name] = s
  _SWEEP_ORIGINS[name] = origin
  return s


def _caller_file() -> str:
  frame = inspect.currentframe()
  outer = frame.f_back.f_back if frame and frame.f_back else None
  return outer.f_code.co_filename if outer else '?'


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
