"""Finding runs for `tx compare` and grouping them into variants.

A directory holding `sweep.json` is a sweep: its variants, seeds and baseline come from
there. Any other directory holding `summary.json` or `config.json` is a run. Runs found
outside sweeps are grouped by experiment name plus the config keys that differ between
runs of that experiment (`train.seed` and cache locations excepted), and the groups are
named like sweep variants (`position=rope`), so `tx compare` works on runs launched by
hand or from `tx sweep --commands` lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from tx.config.base import ConfigError, flatten_dict
from tx.sweep.names import short_keys, variant_name

SWEEP_JSON, SUMMARY, CONFIG, METRICS = 'sweep.json', 'summary.json', 'config.json', 'metrics.jsonl'
# Keys that never define a variant: the seed (that is what we average over), where data is
# cached or read from, and values filled in from the data.
IGNORED_KEYS = {'name', 'train.seed', 'data.data_dir', 'data.raw_dir', 'model.vocab_size'}
_SKIP_DIRS = {'checkpoints', 'tensorboard'}


@dataclasses.dataclass
class RunData:
  """One run directory: its summary (None until finished), flat config, variant and seed."""
  dir: Path
  summary: dict | None
  config: dict
  variant: str = ''
  seed: int | None = None
  error: str | None = None  # why a sweep run stopped (from sweep.json)
  status: str | None = None  # sweep.json's run status, e.g. 'diverged at step 120'

  @property
  def experiment(self) -> str:
    """The experiment name from summary.json, else config.json."""
    return (self.summary or {}).get('experiment') or self.config.get('name') or 'unnamed'


@dataclasses.dataclass
class Collection:
  """The runs to compare, their variants in display order, and the sweeps' baseline."""
  runs: list[RunData]
  variants: list[str]
  baseline: str | None
  sweeps: list[dict]
  roots: list[Path]


flat = flatten_dict


def _read(path: Path):
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    raise ConfigError(f'{path}: unreadable JSON; remove or repair it') from None


def load_run(path: Path) -> RunData:
  """A run directory's summary.json (if finished) and flattened config.json."""
  summary = _read(path / SUMMARY) if (path / SUMMARY).exists() else None
  config = flat(_read(path / CONFIG)) if (path / CONFIG).exists() else {}
  return RunData(dir=path, summary=summary, config=config,
                 seed=config.get('train.seed'))


def metric_rows(path: Path) -> list[dict]:
  """metrics.jsonl as dicts ([] when absent); an unparsable (half-written) line is skipped."""
  file = Path(path) / METRICS
  if not file.exists():
    return []
  rows = []
  for line in file.read_text(encoding='utf-8', errors='replace').splitlines():
    try:
      rows.append(json.loads(line))
    except ValueError:
      continue
  return rows


def _walk(root: Path) -> tuple[list[Path], list[Path]]:
  """(sweep dirs, run dirs) at or below root; neither is searched further inside."""
  sweeps, runs = [], []
  for here, dirs, files in os.walk(root):
    if SWEEP_JSON in files:
      sweeps.append(Path(here))
      dirs[:] = []
    elif SUMMARY in files or CONFIG in files:
      runs.append(Path(here))
      dirs[:] = []
    else:
      dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith('.'))
  return sweeps, runs


def _sweep_runs(path: Path) -> tuple[dict, list[RunData]]:
  data = _read(path / SWEEP_JSON)
  runs = []
  for e in data.get('runs', []):
    r = load_run(path / e['dir'])
    r.variant, r.seed, r.error = e['variant'], e.get('seed'), e.get('error')
    r.status = e.get('status')
    runs.append(r)
  return data, runs


def group(runs: list[RunData]) -> list[str]:
  """Names each run's variant from its experiment and differing config keys; returns the
  variant names in first-seen order."""
  by_exp: dict[str, list[RunData]] = {}
  for r in runs:
    by_exp.setdefault(r.experiment, []).append(r)
  for exp, members in by_exp.items():
    keys = sorted({k for r in members for k in r.config} - IGNORED_KEYS)
    differing = [k for k in keys
                 if len({json.dumps(r.config.get(k), sort_keys=True) for r in members}) > 1]
    short = short_keys(differing)
    for r in members:
      name = variant_name({k: r.config.get(k) for k in differing}, short) if differing else ''
      if len(by_exp) > 1 or not name:
        name = f'{exp}:{name}' if name else exp
      r.variant = name
  return list(dict.fromkeys(r.variant for r in runs))


def collect(dirs: list[str | Path]) -> Collection:
  """Every run under `dirs` (sweep dirs, run dirs or parents), grouped into variants."""
  sweeps: list[tuple[Path, dict, list[RunData]]] = []
  loose: list[RunData] = []
  roots = []
  for d in dirs:
    root = Path(d)
    if not root.is_dir():
      raise ConfigError(f'{root}: no such directory; pass a sweep --workdir or run directories')
    roots.append(root)
    found_sweeps, found_runs = _walk(root)
    if not found_sweeps and not found_runs:
      raise ConfigError(f'{root}: no runs found (no sweep.json, summary.json or config.json at or '
                        'below it); pass a `tx sweep --workdir` or `tx train --workdir` directory')
    for s in found_sweeps:
      data, runs = _sweep_runs(s)
      sweeps.append((s, data, runs))
    loose += [load_run(p) for p in found_runs]
  variants: list[str] = []
  prefix = len(sweeps) + bool(loose) > 1
  for path, data, runs in sweeps:
    for r in runs:
      if prefix:
        r.variant = f'{data.get("name", path.name)}/{r.variant}'
    variants += list(dict.fromkeys(r.variant for r in runs))
  variants += group(loose)
  baseline = None
  if len(sweeps) == 1 and not loose:
    baseline = sweeps[0][1].get('baseline')
  all_runs = [r for _, _, runs in sweeps for r in runs] + loose
  return Collection(runs=all_runs, variants=list(dict.fromkeys(variants)), baseline=baseline,
                    sweeps=[data for _, data, _ in sweeps], roots=roots)


def pick_baseline(collection: Collection, requested: str | None) -> str:
  """`--baseline` (an exact variant name, else a unique substring), the sweep's baseline, or
  the first variant."""
  names = collection.variants
  if requested is None:
    return collection.baseline if collection.baseline in names else names[0]
  if requested in names:
    return requested
  hits = [n for n in names if requested in n]
  if len(hits) == 1:
    return hits[0]
  what = 'matches no variant' if not hits else f'matches several variants ({", ".join(hits)})'
  raise ConfigError(f'--baseline {requested}: {what}; variants are {", ".join(names)}')
