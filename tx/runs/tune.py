"""`tx tune`: XLA:CPU settings chosen by timing the run's own training step, cached per host.

    tx tune mt_multi30k_en_de                  # times each candidate, caches the fastest
    tx train mt_multi30k_en_de --workdir runs/mt    # uses the cached choice (one line says so)
    tx train ... --tune                        # tunes first when nothing is cached, or
                                               # times the candidates added since
    TX_TUNE=0 tx train ...                     # opt out: XLA's defaults (or your XLA_FLAGS)

Which XLA:CPU settings win depends on the CPU (benchmarks/NOTES.md: what wins on the AMD
EPYC loses on the Intel Xeon) and on the step's shapes, so tx measures instead of keeping a
table of hosts. Each candidate in `CANDIDATES` (a set of XLA flags), each of
`MODEL_CANDIDATES` that applies (torch's CPU attention kernel, torch's GEMM for the dense
layers, torch's norms), and, where the config leaves train.steps_per_call to tx, each of
these again at PER_CALL steps per compiled call, compiles the experiment's
real training step (its model, optimizer, dropout and batch shapes, on synthetic tokens) in a
fresh process, as `tx bench` does, and times `steps` steps after `warmup`, in `rounds`
rounds of rotating order (one pass is at the mercy of machine noise). A setting and its
PER_CALL twin share one process (`tune_step.time_twins`: timed in turn, in blocks), so
that the choice of steps per call is free of the drift between processes, which on the
project's hosts can exceed what 4 steps per call is worth. The fastest median
over the rounds is kept if it beats XLA's defaults by more than `margin` (3 %) and was
faster than them in every round; else the defaults. A setting's PER_CALL twin is held to
the same rule against the defaults' own twin as well (`baselines`): its gain over that twin
is the setting's, not the calls'. So a candidate that was slower than one of its baselines
in a round is not timed in the rounds after it: it cannot be chosen. Where several
candidates qualify within `margin` of the fastest (by the median or by the fastest round),
those alone get `rounds` more rounds (a runoff), and the same rule on all their rounds picks
one. The choice is cached as one JSON
file per (CPU model and ISA, CPU count, jax and jaxlib versions, step signature) under
$TX_CACHE_DIR/tune (default $XDG_CACHE_HOME/tx/tune or ~/.cache/tx/tune), so another host
kind, another jax or another model shape is measured afresh. An entry measured before a
candidate was added to tx (or changed) is brought up to date by the next `tx tune` (or
`tx train --tune`, `tx bench --tune`): the new candidates are timed against the entry's
choice and XLA's defaults, with their twins, not the whole set again (`update_set`); `tx
train` without --tune uses such an entry and says which candidates it lacks. The flag and
the model settings are timed apart; where a flag setting beats the defaults, the fastest one
is then timed under each model setting that ran faster than them (`crossed`: torch's
kernels, say, with the flags that speed up XLA's remaining ops), the same way, as an update.
A mesh of simulated devices is timed as one device with the whole batch (the same work on the
same cores). One measurement per entry at a time: the processes of a job on one host (`tx train
--tune` in each) wait for the first one's choice (a lock file beside the entry) instead of
timing on the same cores at once.

`tx train` looks the run up before JAX starts its backend and appends the chosen flags to
XLA_FLAGS; a flag you already set in XLA_FLAGS wins over the cached one. A chosen model
setting (model.attention_impl, model.matmul_impl or model.norm_impl) replaces it only where
the config left it 'auto', and a chosen train.steps_per_call only where the config left it
None; in a multi-process job every process takes process 0's (hosts may have cached
different choices, and every process must compile the same program). TX_TUNE=0 (or
`tx train --no-tune`) turns the lookup off; `tx tune --force` measures again (with
`--candidates`, those alone, keeping the entry's record of the rest).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

# name -> XLA flags. 'default' must stay first: it is the baseline every choice is against.
CANDIDATES = {
    'default': '',
    'onednn': '--xla_cpu_use_onednn=true',
    # oneDNN's fusions for the dots (its AMX / avx512_bf16 GEMMs), YNNPACK out of their way
    'onednn_dots': ('--xla_cpu_experimental_onednn_fusion_type=dot '
                    '--xla_cpu_experimental_ynn_fusion_type='),
    # the same, with YNNPACK kept for the reductions: without it XLA rewrites a bias
    # gradient's column sum into a reduce-window, 17x slower (benchmarks/NOTES.md, attempt 97)
    'onednn_dots_ynn_reduce': ('--xla_cpu_experimental_onednn_fusion_type=dot '
                               '--xla_cpu_experimental_ynn_fusion_type=reduce'),
    'ynn_dots_only': '--xla_cpu_experimental_ynn_fusion_type=dot',
    'ynn_off': '--xla_cpu_experimental_ynn_fusion_type=',
}
# name -> model settings timed beside the flags where `model_candidates` says they apply.
# torch_attention: PyTorch's CPU flash kernel in the step (tx/ops/torch_attention.py), which
# can beat XLA:CPU's one-core batched products (benchmarks/NOTES.md, attempt 47).
# torch_matmul: the dense layers' products in PyTorch's CPU GEMM (tx/ops/torch_matmul.py),
# ahead of XLA's on the Intel AMX host, most of all in bf16 (attempt 48);
# torch_attention_matmul: both, where both apply. For bf16 / f16 models,
# torch_float32_matmul: the products in torch's float32 GEMM on widened operands (the same
# arithmetic; hosts with avx512_bf16 but no AMX multiply bf16 slower than float32, attempt
# 99), and torch_float32_attention_matmul with torch's attention in float32 too. The norms
# in torch's kernels (tx/ops/torch_norm.py) are timed with every other torch kernel that
# applies: torch_attention_matmul_norm, or torch_matmul_norm where attention does not apply.
# torch_block_matmul(_norm): the same with self-attention's projections and kernel in one
# callback each way (tx/ops/torch_attention_block.py), where nothing comes between them.
MODEL_CANDIDATES = {
    'torch_attention': {'model': {'attention_impl': 'torch'}},
    'torch_matmul': {'model': {'matmul_impl': 'torch'}},
    'torch_attention_matmul': {'model': {'attention_impl': 'torch', 'matmul_impl': 'torch'}},
    'torch_matmul_norm': {'model': {'matmul_impl': 'torch', 'norm_impl': 'torch'}},
    'torch_attention_matmul_norm': {'model': {'attention_impl': 'torch', 'matmul_impl': 'torch',
                                              'norm_impl': 'torch'}},
    'torch_block_matmul': {'model': {'attention_impl': 'torch_block', 'matmul_impl': 'torch'}},
    'torch_block_matmul_norm': {'model': {'attention_impl': 'torch_block', 'matmul_impl': 'torch',
                                          'norm_impl': 'torch'}},
    'torch_float32_matmul': {'model': {'matmul_impl': 'torch_float32'}},
    'torch_float32_attention_matmul': {'model': {'attention_impl': 'torch_float32',
                                                 'matmul_impl': 'torch_float32'}},
}
# train.steps_per_call timed beside 1 where the config leaves it to tx (None): XLA's defaults
# and each model candidate, PER_CALL steps per compiled call. On the CPU a call's scratch
# buffer is mapped and faulted in afresh on every call (benchmarks/NOTES.md, attempt 51).
PER_CALL = 4
PER_CALL_SUFFIX = f'_{PER_CALL}_per_call'
OPT_OUT = 'TX_TUNE'
WORKER = 'tx.runs.tune_step:time_step'  # the measuring processes (tx/runs/tune_step.py)
TWIN_WORKER = 'tx.runs.tune_step:time_twins'


def cache_dir(env=None) -> Path:
  """Where the choices live: $TX_CACHE_DIR/tune, else $XDG_CACHE_HOME/tx/tune, ~/.cache/tx/tune."""
  env = os.environ if env is None else env
  if env.get('TX_CACHE_DIR'):
    return Path(env['TX_CACHE_DIR']) / 'tune'
  base = env.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return Path(base) / 'tx' / 'tune'


def host_key(host: dict) -> dict:
  """The parts of a `tx.bench.host.probe` record that decide which settings win."""
  keys = ('vendor', 'model_name', 'family', 'model', 'stepping', 'isa_level', 'usable_cpus',
          'jax', 'jaxlib')
  return {k: host.get(k) for k in keys} | {'isa': dict(sorted((host.get('isa') or {}).items()))}


def model_candidates(cfg, host: dict | None = None) -> dict:
  """The MODEL_CANDIDATES that may replace what `cfg`'s model left to tx (torch installed):
  torch_attention where attention_impl is 'auto', the compute dtype float32 or bfloat16 and
  the model needs nothing torch's kernel lacks (an attention bias, soft-cap or dropout);
  torch_matmul where matmul_impl is 'auto' and the compute dtype is float32, or bfloat16 on
  a `host` (a `tx.bench.host.probe` record) not known to lack bf16 arithmetic (torch
  emulates a bf16 GEMM there, many times slower than XLA's); torch_attention_matmul where
  both apply; where norm_impl is 'auto' too (and the norms LayerNorms), the candidate with
  every one of them and torch's norms (torch_attention_matmul_norm, or torch_matmul_norm
  where attention does not apply); where torch_attention_matmul applies and self-attention
  has nothing between its projections and the kernel (`torch_block_fuses`), the same with
  attention_impl='torch_block' (torch_block_matmul, or torch_block_matmul_norm with the
  norms); for a bf16 / f16 model where matmul_impl is 'auto' (on
  any host: float32 arithmetic is everywhere), torch_float32_matmul, and
  torch_float32_attention_matmul (both kernels in float32) where torch's attention would
  apply in float32."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from tx.bench import host as host_lib  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec('torch') is None:
    return {}
  model, out = cfg.model, {}
  attention = model.attention_impl == 'auto' and not model.torch_attention_conflict
  if attention and model.dtype in ('float32', 'bfloat16'):  # torch's kernel takes no float16
    out['torch_attention'] = MODEL_CANDIDATES['torch_attention']
  if model.matmul_impl == 'auto' and (model.dtype == 'float32' or (
      model.dtype == 'bfloat16' and host_lib.has_bf16_arithmetic(host) is not False)):
    out['torch_matmul'] = MODEL_CANDIDATES['torch_matmul']
  if len(out) == 2:
    out['torch_attention_matmul'] = MODEL_CANDIDATES['torch_attention_matmul']
  norms = model.norm_impl == 'auto' and model.norm == 'layernorm'
  if 'torch_matmul' in out and norms:
    name = 'torch_attention_matmul_norm' if len(out) > 1 else 'torch_matmul_norm'
    out[name] = MODEL_CANDIDATES[name]
  if 'torch_attention_matmul' in out and model.torch_block_fuses:
    name = 'torch_block_matmul_norm' if norms else 'torch_block_matmul'
    out[name] = MODEL_CANDIDATES[name]
  if model.matmul_impl == 'auto' and model.dtype in ('bfloat16', 'float16'):
    out['torch_float32_matmul'] = MODEL_CANDIDATES['torch_float32_matmul']
    if attention:
      name = 'torch_float32_attention_matmul'
      out[name] = MODEL_CANDIDATES[name]
  return out


def per_call_candidates(cfg, candidates: dict) -> dict:
  """Each candidate in `candidates` (XLA's defaults, the flag and the model settings) again
  with train.steps_per_call=PER_CALL, named '<name>_4_per_call'; none where the config sets
  train.steps_per_call itself. A flag setting needs its twin as much as the others: a
  K-step call maps its scratch buffer once for K steps (gpt_6l_bf16 under onednn_dots on
  Intel model 207: 1.23-1.30x faster at 4 steps a call; benchmarks/NOTES.md, attempt 95)."""
  if cfg.train.steps_per_call is not None:
    return {}
  return {f'{name}{PER_CALL_SUFFIX}': _with_per_call(candidate)
          for name, candidate in candidates.items() if not name.endswith(PER_CALL_SUFFIX)}


def _with_per_call(candidate) -> dict:
  flags, model, train = _setting(candidate)
  return {'xla_flags': flags, 'model': model, 'train': dict(train, steps_per_call=PER_CALL)}


def known_candidates() -> dict:
  """Every candidate `tx tune --candidates` may name: each flag and model setting, each model
  setting under each flag setting ('<model>_<flags>', as `crossed` names its pairs), and the
  PER_CALL twin of each."""
  pairs = {f'{model}_{flags}': {'xla_flags': CANDIDATES[flags],
                                'model': dict(MODEL_CANDIDATES[model]['model'])}
           for model in MODEL_CANDIDATES for flags in CANDIDATES if CANDIDATES[flags]}
  named = CANDIDATES | MODEL_CANDIDATES | pairs
  return named | {f'{name}{PER_CALL_SUFFIX}': _with_per_call(c) for name, c in named.items()}


def _setting(candidate) -> tuple[str, dict, dict]:
  """(XLA flags, model overrides, train overrides) of a candidate: a flags string, or
  {'xla_flags', 'model', 'train'}."""
  if isinstance(candidate, str):
    return candidate, {}, {}
  return (candidate.get('xla_flags', ''), dict(candidate.get('model', {})),
          dict(candidate.get('train', {})))


def with_choice(cfg, entry: dict | None, say=print, torch_everywhere: bool | None = None):
  """`cfg` with the model and training-loop settings of a cached choice (`apply`'s entry)
  where the config left them to tx: model settings where each is 'auto', steps_per_call where
  it is None; torch's kernels only where PyTorch is installed (in this process, or where
  `torch_everywhere` says so: in every process of a job). `cfg` itself where nothing applies."""
  model = (entry or {}).get('model_overrides') or {}
  train = (entry or {}).get('train_overrides') or {}
  if any(getattr(cfg.model, k) != 'auto' for k in model):
    model = {}
  where = 'this environment' if torch_everywhere is None else 'a process of this job'
  if not (has_torch() if torch_everywhere is None else torch_everywhere):
    model = _without_torch(model, (entry or {}).get('choice'), say, where)
  if any(getattr(cfg.train, k) is not None for k in train):
    train = {}
  if not model and not train:
    return cfg
  said = ', '.join([f'model.{k}={v}' for k, v in model.items()]
                   + [f'train.{k}={v}' for k, v in train.items()])
  say(f'tx: {said}, chosen by `tx tune` on this host for this step; {OPT_OUT}=0 turns this off')
  return cfg.replace(model=cfg.model.replace(**model), train=cfg.train.replace(**train))


def has_torch() -> bool:
  """Whether PyTorch is installed here (without importing it)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  return importlib.util.find_spec('torch') is not None


def _without_torch(model: dict, choice, say, where: str) -> dict:
  """A choice's model settings less those that run PyTorch's kernels, for `where` has no
  PyTorch (a tune cache shared with an environment that had it: the entry's key is the host,
  jax and the step, not the packages), with a line saying so: XLA's kernels train the same
  model, where torch's would fail at the first step."""
  needs_torch = [k for k, v in model.items() if str(v).startswith('torch')]
  if needs_torch:
    say(f"tx: `tx tune`'s choice {choice!r} runs PyTorch's kernels "
        f"({', '.join(f'model.{k}={model[k]}' for k in needs_torch)}) and {where} has no "
        "PyTorch: XLA's kernels instead; pip install -e '.[interop]' to use the choice, or "
        '`tx tune --force` to choose again here')
  return {k: v for k, v in model.items() if k not in needs_torch}


def one_device_config(cfg):
  """`cfg` as it is timed: vocabulary resolved as `tx plan` does, one device."""
  from tx.runs.plan import check  # pylint: disable=g-import-not-at-top
  one = cfg.replace(mesh=cfg.mesh.replace(data=1, fsdp=1, tensor=1))
  return check(one)


def step_signature(cfg) -> dict:
  """What the compiled step depends on: model, optimizer, task, batch shapes, step options."""
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  from tx.data.shapes import batch_shapes  # pylint: disable=g-import-not-at-top
  from tx.tasks import make_task  # pylint: disable=g-import-not-at-top
  cfg = one_device_config(cfg)
  shapes = batch_shapes(cfg.data, make_task(cfg).name, cfg.train.batch_size)
  return {'model': to_dict(cfg.model), 'optim': to_dict(cfg.optim), 'task': to_dict(cfg.task),
          'batch': {k: [list(shape), str(dtype)] for k, (shape, dtype) in sorted(shapes.items())},
          'nan_policy': cfg.train.nan_policy, 'diagnostics': cfg.train.diagnostics,
          # set by the user (a config that leaves it to tx has per-call candidates timed)
          **({'steps_per_call': cfg.train.steps_per_call}
             if cfg.train.steps_per_call is not None else {})}


def _digest(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def entry_path(cfg, host: dict, env=None) -> Path:
  """The cache file of `cfg`'s step on `host` (a `tx.bench.host.probe` record)."""
  key = host_key(host)
  slug = '-'.join(str(key[k]).replace(' ', '_') for k in ('model_name', 'isa_level', 'jax'))
  return cache_dir(env) / f'{slug}-{_digest([key, step_signature(cfg)])}.json'


def lookup(cfg, host: dict, env=None) -> dict | None:
  """The cached choice for `cfg` on `host`, or None (nothing cached, or unreadable)."""
  path = entry_path(cfg, host, env)
  try:
    return json.loads(path.read_text(encoding='utf-8'))
  except (OSError, ValueError):
    return None


def merge_flags(current: str, chosen: str) -> str:
  """`current` XLA_FLAGS plus the `chosen` ones whose flag name `current` does not set."""
  have = {f.split('=')[0] for f in current.split()}
  extra = [f for f in chosen.split() if f.split('=')[0] not in have]
  return ' '.join(current.split() + extra)


def choose(timings: dict[str, float], margin: float,
           rounds: dict[str, list[float]] | None = None) -> str:
  """The fastest candidate (by its median in `timings`), but 'default' unless that one is
  more than `margin` (a fraction) faster and, where `rounds` gives each candidate's time per
  round, faster than the defaults in every round: a setting has to beat the machine's noise
  to replace XLA's defaults."""
  if 'default' not in timings:
    return min(timings, key=timings.get)
  candidates = winners(timings, margin, rounds)
  return min(candidates, key=timings.get) if candidates else 'default'


def winners(timings: dict[str, float], margin: float,
            rounds: dict[str, list[float]] | None = None) -> list[str]:
  """The candidates other than 'default' that `choose` may keep: more than `margin` faster
  than each of their `baselines`' medians and faster than them in every round both were
  timed in (`rounds`, each candidate's times from the first round on). All of them without
  defaults."""
  if 'default' not in timings:
    return list(timings)
  rounds = rounds or {}

  def beats(name, base):
    paired = zip(rounds.get(name, []), rounds.get(base, []))
    return timings[name] < timings[base] * (1.0 - margin) and all(t < b for t, b in paired)

  return [n for n in timings
          if n != 'default' and all(beats(n, base) for base in baselines(n, timings))]


def baselines(name: str, measured) -> list[str]:
  """What candidate `name` must beat to be chosen, of the names in `measured`: XLA's
  defaults and, for a setting's PER_CALL twin, the defaults' own twin too (at the same steps
  per call, what is left of its gain is the setting's). None for the defaults."""
  if name == 'default':
    return []
  per_call = 'default' + PER_CALL_SUFFIX
  twin = name.endswith(PER_CALL_SUFFIX) and name != per_call and per_call in measured
  return ['default', per_call] if twin else ['default']


def measurements(entry: dict) -> list[dict]:
  """The entry's measurements, oldest first: the ones it updated ('earlier', each with its
  own 'earlier') and then its own."""
  chain = [entry]
  while chain[-1].get('earlier'):
    chain.append(chain[-1]['earlier'])
  return chain[::-1]


def crossed(entry: dict, candidates: dict) -> dict:
  """The fastest flag setting's XLA flags under each model setting that ran faster than XLA's
  defaults: candidates named '<model setting>_<flag setting>', each with its PER_CALL twin
  where `candidates` hold the defaults' twin, those not in `candidates` already. The flag
  setting must beat the defaults (`winners`); a model setting qualifies where it or its twin
  had a lower median than its `baselines`; each by the latest measurement of it (the entry, or
  any it updated). The settings are timed apart, yet the flags act on the XLA ops that
  torch's kernels leave, so the best pair need not hold the fastest model setting: where the
  flags make XLA's GEMMs as fast as torch's, torch's attention alone may gain more under them
  than torch's attention and GEMM (benchmarks/NOTES.md, attempt 102). A model setting behind
  the defaults is not paired: the flags speed up only XLA's ops, so its pair would trail the
  flag setting alone. {} where no flag setting beats the defaults, or no model setting does."""
  flag_gains, model_times = {}, {}
  for measured in measurements(entry):  # the latest measurement of a name wins
    timings = measured.get('timings') or {}
    kept = set(winners(timings, entry.get('margin', 0.03), measured.get('rounds_timings')))
    kept -= set(measured.get('skipped') or {})
    for name in timings:
      flag_gains.pop(name, None)
      model_times.pop(name, None)
      if name not in candidates or 'default' not in timings:
        continue
      flags, model, _ = _setting(candidates[name])
      if flags and not model and name in kept:
        flag_gains[name] = timings['default'] / timings[name]
      elif model and not flags and all(timings[name] < timings[base]
                                       for base in baselines(name, timings)):
        model_times[name] = timings[name] / timings['default']
  with_flags = max(flag_gains, key=flag_gains.get, default=None)
  if not with_flags:
    return {}
  flags_name = with_flags.removesuffix(PER_CALL_SUFFIX)
  out = {}
  for with_model in sorted(model_times, key=model_times.get):  # the fastest first
    name = f'{with_model.removesuffix(PER_CALL_SUFFIX)}_{flags_name}'
    pair = {'xla_flags': _setting(candidates[with_flags])[0],
            'model': _setting(candidates[with_model])[1]}
    out.setdefault(name, pair)
    if 'default' + PER_CALL_SUFFIX in candidates:
      out.setdefault(name + PER_CALL_SUFFIX, _with_per_call(pair))
  new = set(untimed({'candidates': candidates}, out))
  return {name: pair for name, pair in out.items() if name in new}


def tune(cfg, *, candidates=None, steps: int = 5, warmup: int = 2, rounds: int = 2,
         margin: float = 0.03, threads: int | None = None, force: bool = False, say=print,
         env=None) -> dict:
  """Times `cfg`'s step under each candidate (name -> XLA flags; default `CANDIDATES`) in
  fresh processes, `rounds` times in a rotating order (a candidate that lost a round to one
  of its `baselines` is skipped after it; near ties get a runoff: see the module's
  docstring), and keeps `choose(median per candidate, margin, times per round)`. Writes and
  returns the cache entry: {'choice', 'xla_flags', 'timings': {name: median s/step over its
  rounds}, 'rounds_timings', 'skipped': {name: round lost}, 'runoff': [names], 'failed':
  {name: why}, 'host', 'signature', ...}. A cached entry is returned as it is unless `force`,
  or brought up to date where it lacks some of `candidates`; `force` with named `candidates`
  times those again and keeps the entry's record of the others (its candidates, and its
  measurement as 'earlier'). With the default candidates, the fastest flag setting is then
  timed under each model setting ahead of the defaults, where it beats them (`crossed`), as an
  update of the entry."""
  from tx.bench import host as host_lib  # pylint: disable=g-import-not-at-top
  from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
  env = dict(os.environ if env is None else env)
  host = host_lib.probe(env)
  cross = candidates is None  # named candidates are timed as they are
  candidates = dict(default_candidates(cfg, host) if candidates is None else candidates)
  if not candidates:
    raise ConfigError('tx tune: no candidate settings to time')
  if steps < 1 or warmup < 0 or rounds < 1 or not 0 <= margin < 1:
    raise ConfigError('tx tune: --steps and --rounds must be >= 1, --warmup >= 0 and --margin '
                      f'in [0, 1) (got {steps}, {rounds}, {warmup}, {margin})')
  path = entry_path(cfg, host, env)
  measure = lambda timed, **kw: _measure(cfg, host, path, timed, steps, warmup, rounds, margin,
                                         threads, say, env, **kw)
  with _measuring(path, say):
    cached = lookup(cfg, host, env)
    if cached is None or (force and cross):
      entry, considered = measure(candidates), candidates
    elif force:  # the named ones again, beside the entry's record of the others
      considered = cached.get('candidates', {}) | candidates
      entry = measure(candidates, considered=considered, earlier=cached)
    else:
      # the entry's record stays whole where a few candidates are asked for
      considered = candidates | {name: setting for name, setting in
                                 cached.get('candidates', {}).items() if name not in candidates}
      entry, new = cached, untimed(cached, candidates)
      if new:
        entry = _update(entry, considered, new, measure, say, f'the cached choice '
                        f'{cached["choice"]!r} ({cached.get("measured_at")}) predates')
    pair = crossed(entry, considered) if cross else {}
    if pair:
      entry = _update(entry, considered | pair, list(pair), measure, say,
                      'the fastest flag setting under each model setting ahead of the '
                      'defaults:')
    elif entry is cached:
      say(f'tx tune: cached choice {cached["choice"]!r} ({path}); --force measures again')
    return entry


def _update(entry: dict, considered: dict, new: list[str], measure, say, why: str) -> dict:
  """`entry` brought up to date with the `new` names of `considered` (`update_set`)."""
  timed = update_set(entry, considered, new)
  say(f'tx tune: {why} {", ".join(new)}; timing {", ".join(timed)}')
  return measure(timed, considered=considered, earlier=entry)


def default_candidates(cfg, host: dict) -> dict:
  """What `tune` times when not told: CANDIDATES, the `model_candidates` that apply and, where
  the config leaves steps per call to tx, the `per_call_candidates` of them all."""
  candidates = CANDIDATES | model_candidates(cfg, host)
  return candidates | per_call_candidates(cfg, candidates)


def untimed(entry: dict, candidates: dict) -> list[str]:
  """The names in `candidates` that a cache `entry` did not consider with the same setting
  (added to tx after it was measured, or changed): a choice among the others may lose to them."""
  known = json.loads(json.dumps(entry.get('candidates') or {}))
  return [name for name, setting in candidates.items()
          if known.get(name, None) != json.loads(json.dumps(setting))]


def update_set(entry: dict, candidates: dict, new: list[str]) -> dict:
  """The candidates that bring a cache `entry` up to date with `candidates`: the `new` ones,
  the entry's choice and XLA's defaults (the baseline), each with its per-call twin, timed
  side by side afresh; the rest lost to the entry's choice when it was measured. All of
  `candidates` where the entry's choice or the defaults are not among them."""
  if entry.get('choice') not in candidates or 'default' not in candidates:
    return candidates
  names = {'default', entry['choice'], *new}
  names |= {twin for name in names if (twin := _twin(name, candidates))}
  return {name: setting for name, setting in candidates.items() if name in names}


@contextlib.contextmanager
def _measuring(path: Path, say):
  """Holds an exclusive lock beside the cache entry `path` while its step is measured: the
  processes of one job on one host (`tx train --tune` in each) measure once, not all at
  once on the same cores; the others wait and read the first one's entry."""
  from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path.with_suffix('.lock'), 'a',  # pylint: disable=consider-using-with
                encoding='utf-8')
  except OSError as e:
    raise ConfigError(f'tx tune: cannot write its cache in {path.parent} ({e.strerror or e}); '
                      'set TX_CACHE_DIR to a writable folder') from None
  with lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      say('tx tune: another process is timing this step on this host; waiting for its choice')
      fcntl.flock(lock, fcntl.LOCK_EX)
    yield


def _measure(cfg, host, path, candidates, steps, warmup, rounds, margin, threads, say, env,
             considered=None, earlier=None):
  """Times every candidate (see `tune`), writes the entry to `path` and returns it. An update
  (`update_set`) times a part of the `considered` candidates, and keeps the `earlier`
  entry's measurement beside its own."""
  from tx.bench.worker import BenchError, run_isolated  # pylint: disable=g-import-not-at-top
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
  threads = threads or host.get('usable_cpus') or os.cpu_count() or 1
  spec = {'config': to_dict(one_device_config(cfg)), 'steps': steps, 'warmup': warmup}
  runs, failed, details = {}, {}, {}
  own = ' '.join(f for f in env.get('XLA_FLAGS', '').split()  # one device per measurement
                 if not f.startswith('--xla_force_host_platform_device_count'))
  names = list(candidates)
  skipped = {}  # name -> the round it lost to one of its baselines in

  def time_group(group: list[str], label: str) -> None:
    """Times `group` (one candidate, or a candidate and its per-call twin) in one process."""
    flags, model, _ = _setting(candidates[group[0]])
    trains = [_setting(candidates[name])[2] for name in group]
    job = (WORKER, dict(spec, model_overrides=model, train_overrides=trains[0]))
    if len(group) > 1:
      job = (TWIN_WORKER, dict(spec, model_overrides=model, train_variants=trains))
    try:
      result = run_isolated(*job, threads=threads, env={'XLA_FLAGS': merge_flags(own, flags)})
    except BenchError as e:
      for name in group:
        failed[name] = str(e)
        say(f'tx tune: {name}: failed ({e})')
      return
    together = f' (one process with {", ".join(group)})' if len(group) > 1 else ''
    for name, one, train in zip(group, result.get('variants', [result]), trains):
      runs.setdefault(name, []).append(one['step_time_s'])
      details[name] = one
      say(f'tx tune: {label} {name:<22} {one["step_time_s"] * 1e3:9.1f} ms/step '
          f'(compile {one["compile_s"]:.1f}s) {_described(flags, model, train)}{together}')

  def due(name: str) -> bool:
    """Whether `name` may still be chosen: not failed, and not slower than one of its
    `baselines` in a round (`choose` needs a win in every round), which skips it from then
    on."""
    if name in failed or name in skipped:
      return False
    lost = None if 'default' in failed else _lost_a_round(
        runs, name, baselines(name, [n for n in runs if n not in failed]))
    if lost is not None:
      skipped[name] = lost[0] + 1
      to = 'the defaults' if lost[1] == 'default' else lost[1]
      say(f'tx tune: {name} is slower than {to} in round {lost[0] + 1}; not timed again')
    return lost is None

  def time_round(round_names: list[str], label: str) -> None:
    timed = set()
    for name in round_names:
      if name in timed or not due(name):
        continue
      twin = _twin(name, candidates)
      group = [name] + ([twin] if twin in round_names and twin not in timed and due(twin)
                        else [])
      time_group(group, label)
      timed.update(group)

  for r in range(rounds):
    time_round(_rotated(names, r), f'round {r + 1}')
  medians = lambda: {n: statistics.median(t) for n, t in runs.items() if n not in failed}
  timings = medians()
  if not timings:
    raise ConfigError(f'tx tune: every candidate failed: {failed}')
  choice = choose(timings, margin, runs)
  runoff = [n for n in winners(timings, margin, runs) if _near(n, choice, timings, runs, margin)]
  if len(runoff) > 1:  # a near tie: more rounds for those only, then the rule on all rounds
    say(f'tx tune: {", ".join(runoff)} within {margin:.0%} of each other; '
        f'{rounds} more round(s) of those')
    for r in range(rounds):
      time_round(_rotated(runoff, r), f'runoff {r + 1}')
    timings = medians()
    choice = choose(timings, margin, runs)
  else:
    runoff = []
  flags, model, train = _setting(candidates[choice])
  entry = {'choice': choice, 'xla_flags': flags, 'model_overrides': model,
           'train_overrides': train, 'timings': timings,
           'rounds_timings': runs, 'failed': failed, 'skipped': skipped, 'runoff': runoff,
           'details': details,
           'candidates': considered or candidates, 'steps': steps, 'warmup': warmup,
           'rounds': rounds,
           'margin': margin, 'threads': threads, 'experiment': cfg.name,
           'host': host_key(host), 'signature': step_signature(cfg),
           'measured_at': time.strftime('%Y-%m-%dT%H:%M:%S%z')}
  if earlier:  # a chain: an update times a few names, the whole set stays on record
    entry['earlier'] = {k: earlier.get(k) for k in ('choice', 'timings', 'skipped', 'failed',
                                                    'measured_at', 'earlier')
                        if earlier.get(k) is not None}
  partial = path.with_suffix('.partial')
  partial.write_text(json.dumps(entry, indent=1, sort_keys=True), encoding='utf-8')
  partial.replace(path)  # a reader sees the whole entry or none
  base = timings.get('default')
  gain = f', {base / timings[choice]:.2f}x the defaults' if base else ''
  say(f'tx tune: chose {choice!r}{gain}; cached in {path}')
  return entry


def _near(name: str, choice: str, timings: dict, runs: dict, margin: float) -> bool:
  """Whether `name` is a near tie of `choice`: within `margin` of it by the median or by the
  fastest round. With two rounds a median is a mean, and one slow round (the machine's, as
  often as the setting's) can put the faster setting outside the margin (NOTES attempt 113)."""
  fastest = lambda n: min(runs.get(n) or [timings[n]])
  return (timings[name] <= timings[choice] * (1 + margin)
          or fastest(name) <= fastest(choice) * (1 + margin))


def _rotated(names: list[str], r: int) -> list[str]:
  """Round r's order: each round starts one candidate later."""
  return names[r % len(names):] + names[:r % len(names)]


def _twin(name: str, candidates: dict) -> str | None:
  """The candidate in `candidates` that differs from `name` only in running PER_CALL steps
  per call (its `_4_per_call` twin, or the one it is the twin of), None if there is none:
  `tune` times the two in one process (`tune_step.time_twins`)."""
  base = name.removesuffix(PER_CALL_SUFFIX)
  one, four = (base, name) if base != name else (name, name + PER_CALL_SUFFIX)
  if one not in candidates or four not in candidates:
    return None
  (flags, model, train), four_setting = _setting(candidates[one]), _setting(candidates[four])
  if four_setting != (flags, model, dict(train, steps_per_call=PER_CALL)):
    return None
  return four if name == one else one


def _lost_a_round(runs: dict[str, list[float]], name: str,
                  against: list[str]) -> tuple[int, str] | None:
  """The first round (0-based) in which `name` was not faster than one of the candidates
  `against`, and that candidate; None if none: `runs` holds each candidate's s/step per
  round, from round 0, with no gaps."""
  lost = [(i, base) for base in against
          for i, (t, b) in enumerate(zip(runs.get(name, []), runs.get(base, []))) if t >= b]
  return min(lost) if lost else None


def _described(flags: str, model: dict, train: dict) -> str:
  return ' '.join([flags] * bool(flags) + [f'model.{k}={v}' for k, v in model.items()]
                  + [f'train.{k}={v}' for k, v in train.items()]) or '(XLA defaults)'


def apply(cfg, *, env=None, say=print, tune_if_missing: bool = False) -> dict | None:
  """Before JAX starts its backend: appends the cached choice's flags to env['XLA_FLAGS']
  (default os.environ) and returns the entry; None when TX_TUNE=0, nothing is cached (and
  not `tune_if_missing`), the choice is the defaults, or the backend already started. An
  entry measured before some of today's candidates is used as it is, with a line saying so,
  or brought up to date first (`tune`) with `tune_if_missing`."""
  from tx.bench import host as host_lib  # pylint: disable=g-import-not-at-top
  env = os.environ if env is None else env
  if env.get(OPT_OUT) == '0':
    return None
  host = host_lib.probe(env)
  entry = lookup(cfg, host, env)
  new = untimed(entry, default_candidates(cfg, host)) if entry else []
  if (entry is None or new) and tune_if_missing:
    entry, new = tune(cfg, say=say, env=env), []
  applied = _apply_flags(entry, env, say)
  if new and applied is not None:
    more = f' and {len(new) - 3} more' if len(new) > 3 else ''
    say(f'tx: that `tx tune` choice was measured before {", ".join(new[:3])}{more}; '
        '`tx tune` (or --tune) times them against it')
  return applied


def _apply_flags(entry: dict | None, env, say) -> dict | None:
  """`apply`'s work on the entry it found: its flags appended to env['XLA_FLAGS']."""
  from tx import compat  # pylint: disable=g-import-not-at-top
  if entry is None or not entry.get('xla_flags'):
    return entry if entry else None
  if compat.backends_started():
    say('tx: the tuned XLA settings were not applied: the JAX backend had already started')
    return None
  env['XLA_FLAGS'] = merge_flags(env.get('XLA_FLAGS', ''), entry['xla_flags'])
  say(f'tx: XLA settings {entry["choice"]!r} ({entry["xla_flags"]}), chosen by `tx tune` '
      f'on this host for this step; {OPT_OUT}=0 turns this off')
  return entry


def cli(args, resolve) -> int:
  """`tx tune` (arguments parsed in tx/cli.py; `resolve(name, overrides)` -> config)."""
  from tx.config.base import parse_overrides  # pylint: disable=g-import-not-at-top
  cfg = resolve(args.experiment, parse_overrides(args.set))
  candidates = None
  if args.candidates:
    known = known_candidates()
    unknown = [c for c in args.candidates if c not in known]
    if unknown:
      from tx.errors import UserError  # pylint: disable=g-import-not-at-top
      raise UserError(f'--candidates: unknown {", ".join(unknown)}; name a flag setting '
                      f'({", ".join(CANDIDATES)}), a model setting ({", ".join(MODEL_CANDIDATES)}),'
                      f' a model setting under flags (<model>_<flags>), or any of these with '
                      f'{PER_CALL_SUFFIX}')
    candidates = {c: known[c] for c in args.candidates}
  say = lambda m: print(m, file=sys.stderr, flush=True)
  _say_bf16_hint(cfg, say)
  entry = tune(cfg, candidates=candidates, steps=args.steps, warmup=args.warmup,
               rounds=args.rounds, margin=args.margin, force=args.force, say=say)
  print(json.dumps({k: entry.get(k) for k in ('choice', 'xla_flags', 'model_overrides',
                                                'train_overrides', 'timings', 'skipped',
                                                'runoff', 'failed')},
                   indent=1))
  return 0


def _say_bf16_hint(cfg, say) -> None:
  """Before a bf16 step is measured (the longest tune): `bf16_hint`'s line where this CPU's
  bf16 GEMMs are no faster than its float32 ones, so the user can tune float32 instead."""
  if str(cfg.model.dtype) != 'bfloat16':
    return
  import jax  # pylint: disable=g-import-not-at-top
  from tx.train import bf16_hint, flops  # pylint: disable=g-import-not-at-top
  hint = bf16_hint.check(cfg.model.dtype, jax.devices()[0].platform,
                         flops.measure_matmul_ceiling(bf16_hint.BF16))
  if hint:
    say(f'tx tune: {hint}')
