"""`tx profile EXPERIMENT`: where an experiment's training step spends its time on this host.

    tx profile mlm_shakespeare --set train.batch_size=16   # ms per step by category
    tx profile lm_shakespeare_char --no-tune --json p.json

It compiles the step `tx train` would run (the same config and overrides, with `tx tune`'s
cached choice for this host where there is one, unless --no-tune or TX_TUNE=0), feeds it
synthetic batches of its shapes on one device, and profiles a few calls in a fresh process
pinned to `--threads`: milliseconds per step in the dense GEMMs, attention, the norms, the
optimizer and the rest, the step with and without the profiler, its system time and page
faults, and each category's costliest ops (tx/bench/profile.py, the engine of `tx bench
--profile`, which also profiles the PyTorch peers of its cases).
"""

from __future__ import annotations

import json
import os
import sys

from tx.errors import UserError


def cli(args, resolve) -> int:
  """`tx profile` (arguments parsed in tx/cli.py; `resolve(name, overrides)` -> config)."""
  from tx.bench import host, profile  # pylint: disable=g-import-not-at-top
  from tx.bench.suite import machine  # pylint: disable=g-import-not-at-top
  from tx.bench.worker import BenchError, run_isolated  # pylint: disable=g-import-not-at-top
  from tx.config.base import parse_overrides, to_dict  # pylint: disable=g-import-not-at-top
  from tx.runs import tune  # pylint: disable=g-import-not-at-top
  if args.calls < 1 or args.top < 1:
    raise UserError(f'--calls and --top must be >= 1, got {args.calls} and {args.top}')
  if args.threads is not None and args.threads < 1:
    raise UserError(f'--threads must be >= 1, got {args.threads}')
  if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
    raise UserError(f'--json {args.json}: its directory does not exist; create it or pass '
                    'another path')
  cfg = resolve(args.experiment, parse_overrides(args.set))
  say = lambda m: print(m, file=sys.stderr, flush=True)
  flags, entry = os.environ.get('XLA_FLAGS', ''), None
  if not args.no_tune and os.environ.get(tune.OPT_OUT) != '0':
    entry = tune.lookup(cfg, host.probe(), dict(os.environ))
  if entry and entry.get('xla_flags'):  # for the worker's XLA (this process starts none)
    flags = tune.merge_flags(flags, entry['xla_flags'])
    say(f'tx: XLA settings {entry["choice"]!r} ({entry["xla_flags"]}), chosen by `tx tune` '
        f'on this host for this step; --no-tune turns this off')
  cfg = tune.with_choice(cfg, entry, say=say)
  threads = args.threads or host.probe().get('usable_cpus') or os.cpu_count() or 1
  spec = {'config': to_dict(tune.one_device_config(cfg)),
          'profile_calls': args.calls, 'profile_top': args.top}
  try:
    result = run_isolated('tx.bench.profile:experiment_step', spec, threads=threads,
                          env={'XLA_FLAGS': flags})
  except BenchError as e:
    raise UserError(f'tx profile: the step failed to run: {e}') from None
  doc = {'machine': machine(threads), 'cases': {cfg.name: {'tx': result}}}
  print(profile.table(doc))
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump(doc, f, indent=1)
    print(f'wrote {args.json}')
  return 0
