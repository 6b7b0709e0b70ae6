"""`tx sweep`: run every variant x seed of a sweep into WORKDIR/<variant>/seed_<k>.

Runs go one after another in this process (`tx.runs.train_run`, quiet). A run whose
summary.json exists is done and skipped; one with a config.json or checkpoints but no
summary is partial and resumes (train resumes by itself). `WORKDIR/sweep.json` records
the sweep (name, base, axes, seeds, baseline, runs with overrides and dirs) for
`tx compare`. `--dry-run` and `--commands` print the plan and write nothing; `--slurm`
writes an sbatch array script instead of running (tx/sweep/slurm.py). Like `tx train`, the
sweep applies the XLA settings `tx tune` cached for this host (the first run's step, since
XLA reads its flags once per process; `--tune` measures them first, `--no-tune` or
TX_TUNE=0 keeps XLA's defaults).

A partial run whose config.json differs from the plan (say, another `--set`) is refused
before anything runs, since resuming it would mix two configs; a done run that differs is
skipped with a warning naming the keys. A run that diverges (a non-finite loss: Post-LN
without warmup at a high learning rate, say) is a data point, not a failure: training
writes its summary.json with status 'diverged' and `diverged_at`, sweep.json records
"diverged at step N", the sweep counts it as done and goes on, and `tx compare` draws it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tx.config.base import ConfigError, flatten_dict, parse_overrides
from tx.runs.training import train_run
from tx.sweep.spec import Resolver, Run, Sweep, plan, select
from tx.train import run_dir
from tx.train.errors import NonFiniteError

SWEEP_JSON = 'sweep.json'
# Filled in by training from the data (the tokenizer), so never a difference in config.
_RESOLVED_KEYS = {'model.vocab_size'}


def status(run: Run) -> str:
  """'done' (summary.json), 'partial' (started: config, metrics or checkpoints) or 'new'."""
  if (run.dir / 'summary.json').exists():
    return 'done'
  if any((run.dir / f).exists() for f in ('config.json', 'metrics.jsonl', 'checkpoints')):
    return 'partial'
  return 'new'


_flat = flatten_dict


def config_diff(run: Run) -> list[str]:
  """`key: was -> planned` for each key where the run's config.json differs from the plan."""
  path = run.dir / 'config.json'
  if not path.exists():
    return []
  try:
    old = _flat(json.loads(path.read_text()))
  except (OSError, ValueError):
    return [f'{path} is unreadable']
  new = _flat(json.loads(json.dumps(run_dir.config_dict(run.config, run.dir))))
  keys = sorted((set(old) | set(new)) - _RESOLVED_KEYS)
  return [f'{k}: {old.get(k)!r} -> {new.get(k)!r}' for k in keys if old.get(k) != new.get(k)]


def _jsonable(v: Any):
  if isinstance(v, tuple):
    return [_jsonable(x) for x in v]
  if isinstance(v, dict):
    return {k: _jsonable(x) for k, x in v.items()}
  return v


def record(sweep: Sweep, runs: list[Run], workdir: Path, extra: dict) -> dict:
  """sweep.json's content for `runs`, merged with what `workdir/sweep.json` already holds."""
  path = workdir / SWEEP_JSON
  old: dict = {}
  if path.exists():
    old = run_dir.read_json(path, prefix='--workdir: ', fix='restore it from a copy, or delete '
                            'it (tx sweep writes it again; finished runs are kept)')
    if old.get('name') != sweep.name:
      raise ConfigError(f'--workdir: {workdir} holds sweep {old.get("name")!r}, not '
                        f'{sweep.name!r}; use another --workdir')
  entries = {e['dir']: e for e in old.get('runs', [])}
  for r in runs:
    rel = str(r.dir.relative_to(workdir))
    entries[rel] = dict(entries.get(rel, {}), variant=r.variant, seed=r.seed, dir=rel,
                        overrides=_jsonable(r.overrides))
  seeds = sorted({e['seed'] for e in entries.values()})
  return {
      'name': sweep.name, 'base': sweep.base, 'description': sweep.description,
      'axes': sweep.axes.spec, 'overrides': _jsonable(dict(sweep.overrides)),
      'set': _jsonable(extra), 'seeds': seeds, 'baseline': sweep.baseline,
      'variants': [{'name': v.name, 'overrides': _jsonable(v.overrides)}
                   for v in sweep.variants],
      'runs': sorted(entries.values(), key=lambda e: (_order(sweep, e['variant']), e['seed'])),
  }


def _order(sweep: Sweep, variant: str) -> int:
  names = [v.name for v in sweep.variants]
  return names.index(variant) if variant in names else len(names)


def write_record(workdir: Path, data: dict) -> None:
  """Atomic write of sweep.json (a reader never sees half a file)."""
  workdir.mkdir(parents=True, exist_ok=True)
  tmp = workdir / f'.{SWEEP_JSON}.tmp'
  tmp.write_text(json.dumps(data, indent=2) + '\n')
  os.replace(tmp, workdir / SWEEP_JSON)


def print_plan(sweep: Sweep, runs: list[Run], out=print) -> None:
  """The plan as a table: variant, seed, dir, status (and config drift of started runs)."""
  statuses = [status(r) for r in runs]
  variants = list(dict.fromkeys(r.variant for r in runs))
  seeds = sorted({r.seed for r in runs})
  out(f'sweep {sweep.name}: base {sweep.base}, {len(variants)} variant(s) x {len(seeds)} '
      f'seed(s) = {len(runs)} run(s); baseline {sweep.baseline}')
  w_var = max(len('variant'), *(len(r.variant) for r in runs))
  w_dir = max(len('dir'), *(len(str(r.dir)) for r in runs))
  out(f'{"variant":<{w_var}}  seed  {"dir":<{w_dir}}  status')
  for r, st in zip(runs, statuses):
    diff = config_diff(r) if st != 'new' else []
    note = f' (config differs: {"; ".join(diff)})' if diff else ''
    out(f'{r.variant:<{w_var}}  {r.seed:<4}  {str(r.dir):<{w_dir}}  {st}{note}')
  counts = {s: statuses.count(s) for s in ('done', 'partial', 'new')}
  out(f'{len(runs)} run(s): {counts["done"]} done, {counts["partial"]} partial, '
      f'{counts["new"]} new')


def check_partials(runs: list[Run]) -> None:
  """Refuses (ConfigError) a partial run whose config.json differs from the plan."""
  for r in runs:
    if status(r) == 'partial':
      if (r.dir / run_dir.CONFIG).exists():  # a damaged one is named as such, not as a diff
        run_dir.read_json(r.dir / run_dir.CONFIG, fix='restore it from a copy, or remove the '
                          'run directory (tx sweep trains it again)')
      diff = config_diff(r)
      if diff:
        raise ConfigError(f'{r.dir}: this partial run was started with another config '
                          f'({diff[0]}); remove the directory or run with the same --set')


def run(sweep: Sweep, workdir, *, resolve: Resolver, seeds: int | None = None,
        extra: dict | None = None, only: list[str] | None = None,
        train_fn: Callable | None = None) -> int:
  """Runs the sweep (skipping done runs, resuming partial ones); returns the exit status:
  0, or 1 when some run stopped on a non-finite loss (recorded in sweep.json, others go on).

  resolve: (base, overrides) -> ExperimentConfig (see `plan`); train_fn: default
  `tx.runs.train_run` (training plus the end-of-run evaluations).
  """
  workdir = Path(workdir)
  extra = dict(extra or {})
  all_runs = plan(sweep, workdir, resolve=resolve, seeds=seeds, extra=extra)
  runs = select(all_runs, only, sweep)
  check_partials(runs)
  train_fn = train_fn or train_run
  data = record(sweep, all_runs, workdir, extra)
  write_record(workdir, data)
  entries = {e['dir']: e for e in data['runs']}
  statuses = [status(r) for r in runs]
  print(f'sweep {sweep.name}: {len(runs)} run(s) in {workdir}: {statuses.count("done")} done, '
        f'{statuses.count("partial")} partial, {statuses.count("new")} new', file=sys.stderr,
        flush=True)
  trained = skipped = diverged = 0
  for i, r in enumerate(runs):
    tag = f'[{i + 1}/{len(runs)}] {r.variant} seed_{r.seed}'
    st = status(r)
    if st == 'done':
      drift = config_diff(r)
      skipped += 1
      print(f'{tag}: done, skipped' + (f' (config differs: {"; ".join(drift)})' if drift else ''),
            file=sys.stderr, flush=True)
      continue
    print(f'{tag}: {"resuming" if st == "partial" else "training"} in {r.dir}', file=sys.stderr,
          flush=True)
    entry = entries[str(r.dir.relative_to(workdir))]
    t0 = time.time()
    try:
      result = train_fn(r.config, r.dir, quiet=True)
    except NonFiniteError as e:
      diverged += 1
      entry['status'] = _diverged_status(r, e)
      write_record(workdir, data)
      print(f'{tag}: {entry["status"]} ({e})', file=sys.stderr, flush=True)
      continue
    trained += 1
    if entry.pop('status', None) is not None:
      write_record(workdir, data)
    ev = result.summary.get('eval', {})
    print(f'{tag}: eval loss {ev.get("loss", float("nan")):.4f} in {time.time() - t0:.0f}s',
          flush=True)
  print(f'sweep {sweep.name}: {trained} trained, {diverged} diverged, {skipped} already done; '
        f'compare with: tx compare {workdir}', flush=True)
  return 0


def _diverged_status(run: Run, error: NonFiniteError) -> str:
  """'diverged at step N', N from the run's summary.json (else the error's first step)."""
  path = run.dir / run_dir.SUMMARY
  try:
    step = run_dir.read_json(path).get('diverged_at') if path.exists() else None
  except ConfigError:  # a damaged summary: the step named in the error instead
    step = None
  if step is None:
    words = str(error).split(':', 1)[0].split()
    step = words[1] if len(words) == 2 and words[0] == 'step' else '?'
  return f'diverged at step {step}'


def experiment_sources(args) -> list[str]:
  """The `--experiments` sources for printed `tx train` lines (a .py file made absolute)."""
  return [str(Path(x).resolve()) if x.endswith('.py') else x
          for x in getattr(args, 'experiments', None) or ()]


def cli(args, sweep: Sweep, resolve: Resolver) -> int:
  """`tx sweep SWEEP --workdir DIR [--seeds N] [--only P ...] [--dry-run | --commands]
  [--set k=v ...]`, with the registered `sweep` and the registry's `resolve`."""
  extra = parse_overrides(args.set)
  if args.seeds is not None and args.seeds < 1:
    raise ConfigError(f'--seeds: must be >= 1, got {args.seeds}')
  if args.dry_run or args.commands:
    runs = select(plan(sweep, args.workdir, resolve=resolve, seeds=args.seeds, extra=extra),
                  args.only, sweep)
    if args.commands:
      sources = experiment_sources(args)
      for r in runs:
        print(r.command(sweep.base, sources))
    else:
      print_plan(sweep, runs)
    return 0
  if not getattr(args, 'no_tune', False):
    _apply_tuning(sweep, args, resolve, extra)
  return run(sweep, args.workdir, resolve=resolve, seeds=args.seeds, extra=extra,
             only=args.only)


def _apply_tuning(sweep: Sweep, args, resolve: Resolver, extra: dict) -> None:
  """The `tx tune` choice cached for the first run's step (measured first with --tune):
  XLA's flags are read once per process, so that one choice holds for every run. A choice
  of model settings (`tune.MODEL_CANDIDATES`) or of train.steps_per_call is not applied: each
  run keeps its config."""
  runs = select(plan(sweep, args.workdir, resolve=resolve, seeds=args.seeds, extra=extra),
                args.only, sweep)
  if runs:
    from tx.runs import tune  # pylint: disable=g-import-not-at-top
    tune.apply(runs[0].config, tune_if_missing=getattr(args, 'tune', False))
