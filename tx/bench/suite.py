"""`tx bench`: runs the cases of tx/bench/cases.py, prints a table, writes JSON (`--json`, or
a new runs/bench/bench-<time>.json; after every case too, marked 'partial', so a run cut short
keeps what it measured).

    tx bench                         # the full suite (~14 min on 2 CPU cores)
    tx bench --only gpt_6l compile   # cases whose name contains a pattern
    tx bench --quick --json q.json   # toy sizes, seconds: checks the machinery
    tx bench --no-peers              # tx only (no torch needed)
    tx bench --only bert --ablate-attention   # + each side's step with attention stubbed out
    tx bench --only gpt_baby --rounds 5     # 5 rounds, tx and the peer in turn: the ratio's spread
    tx bench --platform gpu          # the GPU suite (cases.GPU) on the first CUDA device
    tx bench --peer-compile          # the training peers' forward + loss through torch.compile
    tx bench --only bert_6l --tune   # tx trains each case with `tx tune`'s choice for its step
    tx bench --only bert_6l --profile   # where each side's step spends its time, by category

Every measurement runs in its own process pinned to `--threads` threads (2, or the CPUs
the process may use where fewer; tx and the peer alike), one after the other, so ratios
are taken side by side on the same machine state.
These hosts are noisy (a minute of a neighbour's load moves one process's number by a
third): with `--rounds N` each training and decoding measurement is taken N times, tx and
the peer in turn, and the report gives each side's median and the range of the N paired
ratios, and counts the rounds in which each target held. By default the order alternates
round by round (tx first, then the peer first: tx, peer, peer, tx, ...), so that whatever
favours the first or the second process of a pair falls on both sides alike; the report gives
the geometric mean of the rounds each side ran first, apart, so an order effect shows
(`--order tx-first`: tx first in every round, as runs before the option did).
The float32 and bf16 matmul ceilings are measured at the start and at the end (and torch's,
once, when peers run: `report.ceiling_arithmetic` says whether 1.5x the peer is within
reach of the two GEMM ceilings); MFU divides
model FLOPs per second (tx/train/flops.py: 6·N·tokens + attention; the peer's by the same
formula for the same architecture) by the larger of the two medians.
The report and the JSON (`machine.host`) name the host: CPU model, ISA flags, caches,
memory, XLA_FLAGS and versions (tx/bench/host.py).

A case measures tx's defaults unless its spec names a setting. With `--tune`, tx's side of
every training case takes what `tx tune` chose for that step on this host (tx/bench/tuned.py:
the cached choice, timed first where none is cached, so a first run costs a tune per case),
and the report names each choice; the peers are unchanged.

With `--platform gpu` every measurement runs on the first GPU (jax with JAX_PLATFORMS=cuda,
torch on 'cuda'); the ceilings are 8192^3 products, the CPU-only diagnoses (the step's
products and attention timed alone) are skipped, the report adds MFU against the GPU's
datasheet bf16 peak where it knows the GPU, and issue 9's / 24's targets (CPU targets) are
not judged.
"""

from __future__ import annotations

import fnmatch
import json
import os
import platform
import sys
import time

from tx.bench import cases as cases_lib
from tx.bench import host
from tx.bench import report
from tx.bench.worker import BenchError, run_isolated, thread_env
from tx.errors import UserError

TX = 'tx.bench.tx_side'
PEERS = 'tx.bench.torch_peers'
SUITE_THREADS = 2  # the threads of a measurement unless told (`default_threads`)


def _matches(name: str, patterns) -> bool:
  return not patterns or any(p in name or fnmatch.fnmatch(name, p) for p in patterns)


def select(quick: bool, only=None, platform: str = 'cpu') -> tuple[cases_lib.Case, ...]:
  """The cases to run; an `only` pattern that matches nothing is an error."""
  pool = cases_lib.QUICK if quick else cases_lib.GPU if platform == 'gpu' else cases_lib.SUITE
  chosen = tuple(c for c in pool if _matches(c.name, only))
  if not chosen:
    names = ', '.join(c.name for c in pool)
    raise ValueError(f'--only {" ".join(only)} matches no case; cases: {names}')
  return chosen


def torch_available() -> bool:
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import  (optional (the interop extra); heavy)
    import transformers  # pylint: disable=g-import-not-at-top,unused-import  (optional (the interop extra); heavy)
  except ImportError:
    return False
  return True


def _median_run(runs: list[dict], metric: str) -> dict:
  """The run whose `metric` is the median of `runs` (the lower middle one for an even count),
  so every number reported from it comes from one real measurement."""
  ordered = sorted(runs, key=lambda r: r[metric])
  return ordered[(len(ordered) - 1) // 2]


def _rounds(out: dict, key: str, runs: dict[str, list], metric: str) -> None:
  """Stores each side's median run under f'{side}_{key}' and, for more than one round, the
  metric of every round, in the order run, under f'{side}_{key}_rounds', and which side ran
  first in each round under f'{key}_first_rounds'."""
  for side, side_runs in runs.items():
    if side == 'first':
      if len(side_runs) > 1:
        out[f'{key}_first_rounds'] = side_runs
      continue
    out[f'{side}_{key}'] = _median_run(side_runs, metric)
    if len(side_runs) > 1:
      out[f'{side}_{key}_rounds'] = [r[metric] for r in side_runs]


ORDERS = ('alternate', 'tx-first')


def first_side(round_index: int, order: str = 'alternate') -> str:
  """Which side runs first in round `round_index` (from 0): 'tx' in every round with
  'tx-first'; with 'alternate' 'tx' in even rounds and 'peer' in odd ones, so the sequence
  of processes reads tx, peer, peer, tx, tx, peer ... and a drift or an advantage of running
  second in a pair weighs on both sides alike."""
  if order not in ORDERS:
    raise ValueError(f'order {order!r}: one of {", ".join(ORDERS)}')
  return 'peer' if order == 'alternate' and round_index % 2 else 'tx'


def _side_by_side(tx_target: str, peer_target: str | None, spec: dict, *, threads: int,
                  rounds: int, say, label: str, metric: str, platform: str = 'cpu',
                  peer_extra: dict | None = None, tx_spec: dict | None = None,
                  tx_env: dict | None = None, order: str = 'alternate') -> dict[str, list]:
  """`rounds` rounds of tx and the peer (each in its own process), the side to go first in
  each round by `order` (`first_side`): {side: [run per round]} and, with a peer, 'first':
  [the side that ran first, per round]. `peer_extra` entries go into the peer's spec only
  (e.g. torch_compile); `tx_spec` (default `spec`) and `tx_env` (environment entries, e.g.
  XLA_FLAGS) are tx's side's only.

  Measuring the two sides round by round puts each pair of measurements side by side in
  time, so a noisy minute on the host moves both of a pair rather than one side's number."""
  runs = {'tx': []} | ({'peer': [], 'first': []} if peer_target else {})
  sides = {'tx': (tx_target, tx_spec or spec),
           'peer': (peer_target, {**spec, **(peer_extra or {})})}
  for i in range(rounds):
    tag = f' (round {i + 1}/{rounds})' if rounds > 1 else ''
    first = first_side(i, order) if peer_target else 'tx'
    if peer_target:
      runs['first'].append(first)
    for side in (first, 'peer' if first == 'tx' else 'tx'):
      target, s = sides[side]
      if target:
        env = {'env': tx_env} if side == 'tx' and tx_env else {}
        runs[side].append(run_isolated(target, s, threads=threads, platform=platform, **env))
        say(f'{label}: {side} {runs[side][-1][metric]:,.0f} tokens/s{tag}')
  return runs


def _tuned(case, threads: int, say) -> tuple[dict, dict | None, dict]:
  """(the spec entries, the environment (XLA_FLAGS) and the summary of `tx tune`'s choice
  for a case's training step on this host (`tuned.choice`))."""
  from tx.bench import tuned  # pylint: disable=g-import-not-at-top  (jax, flax: the worker's)
  from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    tuned_spec, summary = tuned.choice(case.spec, threads=threads, say=say)
  except ConfigError as e:  # every candidate failed: this case fails, the run goes on
    raise BenchError(str(e)) from None
  settings = {k: v for k, v in tuned_spec.items() if case.spec.get(k) != v}
  say(f'{case.name}: tx trains with `tx tune`\'s choice {summary["choice"]!r}')
  return settings, ({'XLA_FLAGS': summary['xla_flags']} if summary['xla_flags'] else None), summary


def profiles(cases, *, peers: bool = True, threads: int = SUITE_THREADS, say=print,
             tune: bool = False, calls: int = 2) -> dict:
  """`tx bench --profile`: each training case's step profiled by category, tx's side and the
  peer's, each in a measurement process of its own (tx/bench/profile.py); with `tune`, tx's
  side takes `tx tune`'s choice. Returns {'machine', 'cases': {name: {'tx', 'peer',
  'tuned'} or {'error'}}} for `profile.table`."""
  info = machine(threads)
  say(host.summary(info['host']))
  results = {}
  for case in cases:
    if 'train' not in case.kinds:
      continue
    spec = dict(case.spec, profile_calls=calls)
    try:
      out, env, settings = {}, {}, {}
      if tune:
        settings, tx_env, out['tuned'] = _tuned(case, threads, say)
        env = {'env': tx_env} if tx_env else {}
      out['tx'] = run_isolated('tx.bench.profile:tx_step', {**spec, **settings},
                               threads=threads, **env)
      say(f'{case.name}: tx profiled, {_categories(out["tx"])}')
      if peers and case.peer:
        out['peer'] = run_isolated('tx.bench.profile:peer_step',
                                   dict(spec, steps_per_call=settings.get(
                                       'steps_per_call', spec.get('steps_per_call'))),
                                   threads=threads)
        say(f'{case.name}: peer profiled, {_categories(out["peer"])}')
    except BenchError as e:
      say(f'{case.name}: FAILED: {e}')
      out = {'error': str(e)}
    results[case.name] = out
  if not results:
    raise UserError('--profile profiles training steps; --only selects no training case')
  return {'machine': info, 'cases': results}


def _categories(profiled: dict) -> str:
  """One progress line of a profile: the step and each category, ms."""
  return f'{profiled["unprofiled_step_s"] * 1e3:.0f} ms a step; ' + ', '.join(
      f'{k} {ms:.0f}' for k, ms in profiled['per_category_ms'].items())


def _measure_case(case, *, peers: bool, threads: int, say, ablate: bool = False,
                  rounds: int = 1, platform: str = 'cpu', peer_compile: bool = False,
                  tune: bool = False, bf16_host: bool | None = None,
                  order: str = 'alternate') -> dict:
  """One case's measurements: {'spec', 'note', 'tx_train', 'peer_train', ...}; with `tune`,
  tx's training runs take `tx tune`'s choice for the step (recorded under 'tuned').
  bf16_host False (a CPU without avx512_bf16 / AMX): a bf16 case measures tx only
  ('peer_skipped' says why), and one that puts torch's kernels in tx's step nothing
  ('skipped')."""
  out = {'spec': case.spec, 'note': case.note}
  spec = case.spec
  family = spec['family']
  with_peer = peers and case.peer
  no_bf16 = bf16_host is False and spec.get('dtype') == 'bfloat16'
  if no_bf16 and 'torch' in (spec.get('matmul_impl'), spec.get('attention_impl')):
    out['skipped'] = report.NO_BF16_TORCH
    say(f'{case.name}: {report.NO_BF16_TORCH}')
    return out
  if with_peer and no_bf16:
    # the peer's autocast emulates bf16 there (many times slower than tx's step), for a
    # ratio the report does not judge on such a host
    with_peer = False
    out['peer_skipped'] = report.NO_BF16_PEER
    say(f'{case.name}: {report.NO_BF16_PEER}')
  if 'compile' in case.kinds:
    out['tx_compile'] = run_isolated(f'{TX}:compile_time', spec, threads=threads,
                                     platform=platform)
    say(f'{case.name}: compiled in {out["tx_compile"]["compile_s"]:.1f}s')
  if 'train' in case.kinds:
    # with ablate, each side trains once more with its attention stubbed out (out = v)
    runs = [('', spec)] + ([('_ablated', dict(spec, ablate_attention=True))]
                           if ablate and family in ('decoder', 'encoder') else [])
    peer = f'{PEERS}:{cases_lib.PEER_TRAIN[family]}' if with_peer else None
    tuned_settings, tx_env = {}, None
    if tune:
      tuned_settings, tx_env, out['tuned'] = _tuned(case, threads, say)
    for suffix, s in runs:
      label = f'{case.name}{" without attention" if suffix else ""}'
      measured = _side_by_side(f'{TX}:train', peer, s, threads=threads, rounds=rounds,
                               say=say, label=label, metric='tokens_per_s', platform=platform,
                               peer_extra={'torch_compile': True} if peer_compile else None,
                               tx_spec={**s, **tuned_settings}, tx_env=tx_env, order=order)
      _rounds(out, f'train{suffix}', measured, 'tokens_per_s')
  for batch in case.decode_batches:
    peer = f'{PEERS}:{cases_lib.PEER_DECODE[family]}' if with_peer else None
    measured = _side_by_side(f'{TX}:decode', peer, dict(spec, batch=batch), threads=threads,
                             rounds=rounds, say=say, label=f'{case.name} decode batch {batch}',
                             metric='new_tokens_per_s', platform=platform, order=order)
    _rounds(out, f'decode_b{batch}', measured, 'new_tokens_per_s')
  return out


def _time_under_tuned_flags(case, result: dict, step_gemms: dict, ceiling_spec: dict,
                            threads: int) -> None:
  """Where `tx tune`'s choice for a case's step sets XLA flags (which may run its products in
  other kernels: oneDNN's, XLA's own without YNNPACK), the n^3 ceiling and the step's
  products timed alone again under those flags, in the case's dtype, into result['tuned']
  ('ceiling': {dtype: FLOP/s}, 'gemms': {label: {dtype: FLOP/s}}): the rates its step ran
  at, for `report.ceiling_arithmetic`."""
  flags = (result.get('tuned') or {}).get('xla_flags')
  key = case.spec.get('float32_case') or case.name  # a bf16 case: its float32 case's shapes
  products, dtype = step_gemms.get(key), case.spec.get('dtype', 'float32')
  if not flags or not products:
    return
  spec = dict(ceiling_spec, dtypes=(dtype,),
              gemms=[[f'{key}: {label}', m, k, n, t] for label, m, k, n, t, _ in products])
  try:
    rates = run_isolated(f'{TX}:ceiling', spec, threads=threads, env={'XLA_FLAGS': flags})
  except BenchError as e:  # the arithmetic keeps the run's own rates; the JSON says why
    result['tuned']['gemms_error'] = str(e)
    return
  result['tuned']['ceiling'] = {dtype: rates[f'{dtype}_flops']}
  result['tuned']['gemms'] = rates.get('gemms', {})
  result['tuned']['gemms_best'] = rates.get('gemms_best', {})


def run(cases, *, peers: bool = True, threads: int = SUITE_THREADS, say=print,
        ceiling_n: int = 2048, ablate_attention: bool = False, rounds: int = 1,
        platform: str = 'cpu', peer_compile: bool = False, tune: bool = False, on_case=None,
        order: str = 'alternate') -> dict:
  """Measures every case; returns the JSON document (machine with its host, ceilings, cases,
  targets, `gemms`: the decoder and encoder training steps' products timed alone by XLA and
  by torch at the end of the run, one right after the other, labelled 'case: product'
  (medians; `gemms_best`: each one's fastest sample),
  `step_gemms`: {case: [[product, m, k, n, times per step]]}, `attention`: {side: {case:
  {dtype: seconds}}} of one self-attention's forward and backward timed alone (as the
  products), and `step_attention`: {case: [batch, length, heads, head_dim, causal,
  layers]}). ablate_attention: each decoder and encoder case also trains with its
  attention replaced by a stand-in on both sides (cases' tx_train_ablated,
  peer_train_ablated): what attention costs inside each framework's step. rounds > 1:
  every training and decoding measurement runs that many times, tx and the peer in turn,
  which of them first by `order` (`first_side`; recorded per round, '*_first_rounds');
  each side's median run is reported, and every round's tokens/s is kept (`*_rounds`) for
  the spread of the ratio (`report.rounds_lines`). platform 'gpu': every measurement on the
  first GPU, without the products and attention timed alone (CPU diagnoses). peer_compile:
  the training peers run forward and loss through torch.compile (decoding stays eager).
  tune: tx's side of each training case trains with `tx tune`'s cached choice for its step
  (measured first where none is cached; `tuned.choice`), recorded in the case's 'tuned';
  where the choice sets XLA flags, that also holds the n³ ceiling ('ceiling' {dtype: FLOP/s})
  and the step's products ('gemms' and 'gemms_best', or 'gemms_error') timed again under them
  (`_time_under_tuned_flags`).
  on_case(doc): called after each case with the measurements so far ('partial': True), so
  that a run cut short (a time limit, a lent machine taken back) keeps what it measured."""
  start = time.time()
  info = machine(threads, platform)
  say(host.summary(info['host']))
  ceiling_spec = {'n': ceiling_n, 'repeats': 10}
  gpu = platform == 'gpu'
  step_gemms = {} if gpu else cases_lib.gemm_cases(cases)
  step_attention = {} if gpu else cases_lib.attention_cases(cases)
  parts = {'gemms': [[f'{case}: {label}', m, k, n, t] for case, products in step_gemms.items()
                     for label, m, k, n, t, _ in products],
           'attention': [[case, *shape] for case, shape in step_attention.items()]}
  try:
    ceilings = [run_isolated(f'{TX}:ceiling', ceiling_spec, threads=threads, platform=platform)]
  except BenchError as e:
    if gpu:  # the first measurement is the check that jax sees a GPU
      raise UserError(f'--platform gpu: the first GPU measurement failed ({e}); install a CUDA '
                      'build of jax, or leave --platform out') from None
    raise
  info['device'] = ceilings[0].pop('device', None)
  info['peer_compile'] = peer_compile
  info['tuned'] = tune
  say(f'matmul ceiling: {ceilings[0]["float32_flops"] / 1e9:.1f} GFLOP/s float32, '
      f'{ceilings[0]["bfloat16_flops"] / 1e9:.1f} bf16')
  results = {}
  bf16_host = None if gpu else host.has_bf16_arithmetic(info['host'])
  for case in cases:
    try:
      results[case.name] = _measure_case(case, peers=peers, threads=threads, say=say,
                                         ablate=ablate_attention, rounds=rounds,
                                         platform=platform, peer_compile=peer_compile,
                                         tune=tune, bf16_host=bf16_host, order=order)
    except BenchError as e:
      say(f'{case.name}: FAILED: {e}')
      results[case.name] = {'spec': case.spec, 'error': str(e)}
    if on_case:
      on_case({'machine': info, 'ceilings': ceilings, 'cases': results, 'rounds': rounds,
               'order': order, 'partial': True, 'wall_s': time.time() - start})
  for case in cases:
    _time_under_tuned_flags(case, results[case.name], step_gemms, ceiling_spec, threads)
  # the step's products and attention timed alone at the end, right before torch's: the
  # host's speed moves by a fifth within minutes (benchmarks/NOTES.md, attempt 105), so
  # columns timed a run apart would compare moments, not kernels
  ceilings.append(run_isolated(f'{TX}:ceiling', dict(ceiling_spec, **parts), threads=threads,
                               platform=platform))
  ceilings[-1].pop('device', None)
  gemm_rates = {'tx': ceilings[-1].pop('gemms', {})}
  gemm_best = {'tx': ceilings[-1].pop('gemms_best', {})}
  attention = {'tx': ceilings[-1].pop('attention', {})}
  ceiling = {d: max(c[f'{d}_flops'] for c in ceilings) for d in ('float32', 'bfloat16')}
  doc = {'machine': info, 'ceilings': ceilings, 'ceiling': ceiling,
         'cases': results, 'rounds': rounds, 'order': order, 'wall_s': time.time() - start}
  if peers and any(c.peer for c in cases):
    dtypes = ('float32',) if bf16_host is False else ('float32', 'bfloat16')
    peer = run_isolated(f'{PEERS}:ceiling', dict(ceiling_spec, **parts, dtypes=dtypes),
                        threads=threads, platform=platform)
    doc['peer_ceiling'] = {d: peer.get(f'{d}_flops') for d in ('float32', 'bfloat16')}
    gemm_rates['peer'] = peer.get('gemms', {})
    gemm_best['peer'] = peer.get('gemms_best', {})
    attention['peer'] = peer.get('attention', {})
    say(f'torch matmul ceiling: {peer["float32_flops"] / 1e9:.1f} GFLOP/s float32, ' + (
        f'{peer["bfloat16_flops"] / 1e9:.1f} bf16' if 'bfloat16' in dtypes
        else 'bf16 not timed (no bf16 arithmetic on this host)'))
  doc['gemms'], doc['gemms_best'] = gemm_rates, gemm_best
  doc['step_gemms'] = {case: [[label, m, k, n, count] for label, m, k, n, _, count in products]
                       for case, products in step_gemms.items()}
  doc['attention'] = attention
  doc['step_attention'] = {case: list(shape) for case, shape in step_attention.items()}
  doc['rows'] = report.rows(doc)
  doc['targets'] = report.targets(doc)
  return doc


def machine(threads: int, device_platform: str = 'cpu') -> dict:
  """Where the run measured: versions, thread count, the platform measured ('cpu' | 'gpu'),
  and `host` (tx/bench/host.py: CPU, ISA, caches, memory, the XLA_FLAGS every measurement
  gets). `run` adds 'device' (jax's device_kind) from the first measurement: this process
  does not start a backend, which on a GPU would take the memory the measurements need."""
  env = thread_env(threads, device_platform)
  probed = host.probe(env)
  info = {'platform': platform.platform(), 'processor': platform.processor(),
          'cpu_count': os.cpu_count(), 'threads': threads, 'python': sys.version.split()[0],
          'jax': probed['jax'], 'measured_on': device_platform,
          'glibc_tunables': env.get('GLIBC_TUNABLES', ''), 'host': probed}
  try:
    import torch  # pylint: disable=g-import-not-at-top  (optional (the interop extra); heavy)
    info['torch'] = torch.__version__
  except ImportError:
    pass
  return info


def default_threads(usable: int | None = None) -> int:
  """The threads of a measurement when --threads is not given: 2, the suite's protocol (its
  numbers compare across hosts), or the CPUs this process may use where fewer (`taskset -c
  0`): more threads than CPUs would time the contention. usable: None = this process's."""
  usable = host.probe().get('usable_cpus') if usable is None else usable
  return min(SUITE_THREADS, usable or SUITE_THREADS)


def cli(args) -> int:
  """`tx bench` (arguments parsed in tx/cli.py)."""
  try:
    chosen = select(args.quick, args.only, args.platform)
  except ValueError as e:
    raise UserError(str(e)) from None
  peers = not args.no_peers
  if args.peer_compile and not peers:
    raise UserError('--peer-compile compiles the PyTorch peers; drop --no-peers')
  if peers and not torch_available():
    raise UserError('the PyTorch peers need torch and transformers: pip install -e '
                    '".[interop]", or pass --no-peers')
  if args.json is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
    raise UserError(f'--json {args.json}: its directory does not exist; create it or pass '
                    'another path')
  if args.threads is None:
    args.threads = default_threads()
  if args.threads < 1:
    raise UserError(f'--threads must be >= 1, got {args.threads}')
  if args.rounds < 1:
    raise UserError(f'--rounds must be >= 1, got {args.rounds}')
  say = (lambda *a, **k: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
  gpu = args.platform == 'gpu'
  if args.tune and gpu:
    raise UserError('--tune times XLA:CPU settings; it applies to the CPU suite only (drop '
                    '--platform gpu or --tune)')
  if args.profile and (gpu or args.rounds > 1 or args.ablate_attention or args.peer_compile):
    raise UserError('--profile profiles one CPU step per side: drop --platform gpu, --rounds, '
                    '--ablate-attention and --peer-compile')
  if args.json is None:  # only once every argument checked out: nothing made for a refused run
    args.json = default_json_path(profile=args.profile)
  if args.profile:
    from tx.bench import profile  # pylint: disable=g-import-not-at-top
    doc = profiles(chosen, peers=peers, threads=args.threads, say=say, tune=args.tune)
    print(profile.table(doc))
    _write_json(args.json, doc)
    print(f'wrote {args.json}')
    return 0
  doc = run(chosen, peers=peers, threads=args.threads, say=say,
            ceiling_n=(1024 if args.quick else 8192) if gpu else 512 if args.quick else 2048,
            ablate_attention=args.ablate_attention, rounds=args.rounds, platform=args.platform,
            peer_compile=args.peer_compile, tune=args.tune, order=args.order,
            on_case=lambda partial: _write_json(args.json, partial))
  print(report.table(doc))
  _write_json(args.json, doc)
  print(f'wrote {args.json}')
  return 0


def default_json_path(profile: bool = False, folder: str = os.path.join('runs', 'bench')) -> str:
  """Where a run without --json writes: folder/bench[-profile]-YYYYmmdd-HHMMSS[-N].json.

  One new file per run (never an earlier run's), the folder created; runs/ is where `tx train`
  runs usually live, so results stay beside them and out of the repository's root.
  """
  os.makedirs(folder, exist_ok=True)
  stem = os.path.join(folder, f"bench{'-profile' if profile else ''}-"
                              f"{time.strftime('%Y%m%d-%H%M%S')}")
  path, n = f'{stem}.json', 1
  while os.path.exists(path):
    n += 1
    path = f'{stem}-{n}.json'
  return path


def _write_json(path: str, doc: dict) -> None:
  """Writes doc to path whole or not at all (a run killed mid-write keeps the last one)."""
  tmp = f'{path}.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(doc, f, indent=1)
  os.replace(tmp, path)
