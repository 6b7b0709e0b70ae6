"""`tx bench --profile`: where a training case's step spends its time, in tx and in the
PyTorch peer, side by side: milliseconds per step in the dense GEMMs, attention, the norms,
the optimizer and the rest, the step timed with and without the profiler, its system time
and page faults, and each category's costliest ops. It answers "which part of the step makes
one side slower on this host" (issue 24: what makes XLA lose on the Intel host).

tx (`tx_step`): `jax.profiler.trace` around `profile_calls` compiled calls, after warm ones
(until the process stops growing). Each thunk of the trace is matched with its instruction
in the optimized HLO and sorted by what it computes and where `op_name` puts it: a dot with
batch dimensions, or anything else under a self- or cross-attention layer but its
projections, is attention; a dot otherwise, or torch's GEMM callback
(tx/ops/torch_matmul.py), a dense GEMM; ops under a `*_norm` layer, torch's LayerNorm
callbacks among them (tx/ops/torch_norm.py), the norms; ops outside the model's forward and
backward the optimizer (and clipping).
A category's time is the wall time during which any of its thunks ran (the union over
XLA's threads): categories can overlap, so the column need not add up to the step. A
product that YNNPACK does not take runs in XLA's own dot thunk, which completes
asynchronously: its span covers the launch only (jax 0.10: ~4 ms of a ~100-ms product), so
where the step has such dots (XLA_FLAGS with YNNPACK off or oneDNN's dots) the GEMM and
attention rows read short; the report counts them and the time in which no op was traced.
Peer (`peer_step`): `torch.profiler` around the same number of steps; a category is the self
CPU time of its aten ops (run one after another on the main thread; everything inside
`Optimizer.step`, and the gradient clipping's vector norms, is the optimizer's).
Both run in `tx bench`'s measurement processes (threads, glibc malloc settings).
"""

from __future__ import annotations

import collections
import gc
import glob
import gzip
import json
import re
import tempfile
import time
from unittest import mock

from tx.bench import cases as cases_lib
from tx.bench import host
from tx.timing import process_usage, usage_per_step, warm_until_steady

CATEGORIES = ('dense GEMM', 'attention', 'norm', 'optimizer', 'other')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = .*? ([\w\-]+)\(')
_CALLS = re.compile(r'calls=%([\w.\-]+)')
_OPERAND = re.compile(r'%([\w.\-]+)')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_COMPUTATION = re.compile(r'^(?:ENTRY )?%([\w.\-]+) ')
_CONTROL = ('while', 'call', 'conditional')  # thunks that contain others
# an instruction's: no spaces, '::', '$' ('__': Python's)
_NAME = re.compile(r'^[\w\-]+\.?[\w.\-]*$')


def _computations(hlo: str) -> dict[str, list[str]]:
  """name -> the instruction lines of each computation of an HLO module's text."""
  out, current = {}, None
  for line in hlo.splitlines():
    head = _COMPUTATION.match(line)
    if head and line.rstrip().endswith('{'):
      current = out.setdefault(head.group(1), [])
    elif current is not None and line.strip() != '}':
      current.append(line)
  return out


def hlo_categories(hlo: str) -> dict[str, tuple[str, str]]:
  """Each instruction of an optimized HLO module's text -> (category, op_name): one of
  CATEGORIES, or 'control' for while / call / conditional.

  An instruction XLA made without an op_name that computes no product (a layout copy, a
  convert, a fusion of those) takes the category of the first of its operands that has
  one: it moves that op's output (the copies of XLA's causal attention blocks are
  attention, not 'other')."""
  bodies = _computations(hlo)
  out, unnamed = {}, {}
  for lines in bodies.values():
    for line in lines:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      name, opcode = m.groups()
      if opcode in _CONTROL:
        out[name] = ('control', '')
        continue
      called = _CALLS.search(line)
      body = line
      if opcode == 'fusion' and called:
        body = '\n'.join(bodies.get(called.group(1), [])) + '\n' + line
      op_name = (_OP_NAME.search(line) or [None, ''])[1]
      out[name] = (_category(opcode, body, op_name), op_name)
      if not op_name and out[name][0] == 'other':
        unnamed[name] = _OPERAND.findall(line[m.end():].split(')', 1)[0])
  _inherit_categories(out, unnamed)
  return out


def async_dots(hlo: str, traced: set[str]) -> int:
  """How many of the `traced` span names are `dot` instructions of an optimized HLO module's
  text: products in XLA's own dot thunk, whose spans cover the launch, not the work."""
  return sum(1 for lines in _computations(hlo).values() for m in map(_INSTRUCTION.match, lines)
             if m and m.group(2) == 'dot' and m.group(1) in traced)


def _inherit_categories(out: dict, unnamed: dict) -> None:
  """Gives each op of `unnamed` (name -> operand names, in order) the category of its first
  operand that has one of its own (an op_name, or a product), following chains of them."""
  resolved = {}

  def category(name, seen=()):
    if name in resolved:
      return resolved[name]
    if name not in unnamed:
      kind, op_name = out.get(name, ('', ''))
      return kind if (op_name or kind != 'other') and kind not in ('', 'control') else None
    if name in seen:
      return None
    kind = next(filter(None, (category(o, (*seen, name)) for o in unnamed[name])), None)
    resolved[name] = kind
    return kind

  for name in unnamed:
    kind = category(name)
    if kind:
      out[name] = (kind, '')


def _category(opcode: str, body: str, op_name: str) -> str:
  # the attention layer itself, not the norm beside it (`self_attention_norm`) nor its projections
  attention = bool(re.search(r'/(?:self|cross)_attention(?:/|$)', op_name)) and not re.search(
      r'_proj/|/out/', op_name)
  if opcode == 'custom-call' and 'callback' in body:  # torch's kernels (tx/ops/torch_*.py)
    return 'attention' if attention else 'norm' if '_norm/' in op_name else 'dense GEMM'
  if attention and (' dot(' not in body or 'lhs_batch_dims' in body):
    return 'attention'
  if ' dot(' in body:
    return 'dense GEMM'
  if '_norm/' in op_name:
    return 'norm'
  if (op_name.startswith('jit(') and 'jvp(' not in op_name and '/' in op_name
      and not op_name.endswith(('/while', '/closed_call'))):
    return 'optimizer'
  return 'other'


def _union_ms(intervals: list[tuple[float, float]]) -> float:
  """Total length of the union of [start, end) intervals in microseconds, in ms."""
  total, end = 0.0, float('-inf')
  for a, b in sorted(intervals):
    if b > end:
      total += b - max(a, end)
      end = b
  return total / 1e3


def _top(per_op: collections.Counter, describe, n: int) -> dict[str, list]:
  """category -> its n costliest ops, [[name, ms per step, detail]]; describe(name) gives
  (category, detail)."""
  out = collections.defaultdict(list)
  for name, ms in per_op.most_common():
    kind, detail = describe(name)
    if len(out[kind]) < n:
      out[kind].append([name, ms, detail])
  return dict(out)


def tx_step(spec: dict) -> dict:
  """tx's training step of a bench case, profiled: {'step_s' (profiled), 'unprofiled_step_s',
  'system_s' and 'faults' (minor page faults; per step, unprofiled), 'per_category_ms'
  {category: ms per step}, 'all_ops_ms' (some op running), 'busy_ms' (per thread that ran
  the step's ops, descending), 'top' {category: [[op, ms, op_name]]}, 'unmatched' (the 5
  longest trace spans named like an instruction but found in none: thunks this jax names
  otherwise than its HLO, or the runtime's own), 'async_dots' (products whose spans cover
  their launch only: `async_dots`)}. spec: a case's, with 'profile_calls' (default
  2) and 'profile_top' (4)."""
  from tx.bench import tx_side  # pylint: disable=g-import-not-at-top  (jax: the worker's)
  compiled, state, batch, cfg, _, _ = tx_side.compiled_train_step(spec)
  return profile_compiled(compiled, state, batch, cfg.train.per_call,
                          spec.get('profile_calls', 2), spec.get('profile_top', 4))


def experiment_step(spec: dict) -> dict:
  """`tx profile`'s worker: the training step of spec['config'] (an experiment's config as
  a dict; `tx.runs.tune_step.compiled_step`, synthetic batches) profiled as `tx_step`."""
  from tx.runs import tune_step  # pylint: disable=g-import-not-at-top  (jax: the worker's)
  compiled, state, batch, cfg, _ = tune_step.compiled_step(spec)
  return profile_compiled(compiled, state, batch, cfg.train.per_call,
                          spec.get('profile_calls', 2), spec.get('profile_top', 4))


def profile_compiled(compiled, state, batch, per_call: int, calls: int, top: int) -> dict:
  """A compiled training call (`compiled(state, batch) -> (state, metrics)`, per_call steps
  each) run until the process stops growing (`tx.timing.warm_until_steady`), timed over
  `calls` calls, then profiled over `calls` more: the dict `tx_step` describes."""
  import jax  # pylint: disable=g-import-not-at-top  (the worker's; the parent stays light)
  hlo = compiled.as_text()
  categories = hlo_categories(hlo)
  steps = calls * per_call

  def one():
    nonlocal state
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)

  def run() -> float:
    start = time.perf_counter()
    for _ in range(calls):
      one()
    return (time.perf_counter() - start) / steps

  warm_until_steady(one)  # the steady state's step, not the heap's first growth
  before = process_usage()
  unprofiled_s = run()
  usage = usage_per_step(before, process_usage(), steps)
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder):
      step_s = run()
    path = sorted(glob.glob(f'{folder}/**/*.trace.json.gz', recursive=True))[-1]
    with gzip.open(path) as f:
      events = json.load(f)['traceEvents']
  spans, busy, per_op = collections.defaultdict(list), collections.Counter(), collections.Counter()
  unmatched = collections.Counter()
  for e in events:
    if e.get('ph') != 'X':
      continue
    kind = categories.get(e.get('name'), ('', ''))[0]
    if not kind and _NAME.match(e.get('name', '')) and '__' not in e['name']:  # like a thunk
      unmatched[e['name']] += e.get('dur', 0) / 1e3 / steps
    if kind in ('', 'control'):
      continue
    spans[kind].append((e['ts'], e['ts'] + e['dur']))
    busy[e['tid']] += e['dur'] / 1e3 / steps
    per_op[e['name']] += e['dur'] / 1e3 / steps
  return {'step_s': step_s, 'unprofiled_step_s': unprofiled_s,
          'system_s': usage['system_s_per_step'], 'faults': usage['minor_faults_per_step'],
          'per_category_ms': {k: _union_ms(spans[k]) / steps for k in CATEGORIES},
          'all_ops_ms': _union_ms([s for k in CATEGORIES for s in spans[k]]) / steps,
          'busy_ms': sorted(busy.values(), reverse=True),
          'top': _top(per_op, lambda n: categories[n], top),
          'unmatched': unmatched.most_common(5),
          'async_dots': async_dots(hlo, {e.get('name') for e in events if e.get('ph') == 'X'})}


def _ancestors(event) -> list[str]:
  names, parent = [], event.cpu_parent
  while parent is not None:
    names.append(parent.name)
    parent = parent.cpu_parent
  return names


# pylint: disable-next=too-many-return-statements
def peer_category(key: str, ancestors: list[str]) -> str:
  """An aten op's category (CATEGORIES), given the names of the ops it runs inside."""
  if any(a.startswith('Optimizer.step') for a in [key, *ancestors]) or 'foreach' in key or (
      'norm' in key and 'layer_norm' not in key):
    return 'optimizer'  # AdamW's step; clip_grad_norm_'s vector norms
  if key in ('aten::mm', 'aten::addmm'):
    return 'dense GEMM'
  if any(s in key for s in ('scaled_dot_product', 'flash', 'bmm', 'aten::_softmax')):
    return 'attention'
  if 'layer_norm' in key:
    return 'norm'
  return 'other'


def peer_step(spec: dict) -> dict:
  """The PyTorch peer's training step of a bench case, profiled: {'step_s',
  'unprofiled_step_s', 'system_s', 'faults', 'per_category_ms', 'top'} as `tx_step`, over
  spec['profile_calls'] * steps_per_call steps (as many as tx's profile)."""
  import torch  # pylint: disable=g-import-not-at-top  (the interop extra)
  from tx.bench import torch_peers  # pylint: disable=g-import-not-at-top
  steps = spec.get('profile_calls', 2) * (spec.get('steps_per_call') or 1)
  out = {}

  def profiled(unused_spec, unused_model, step, unused_tokens):
    step()
    before, start = process_usage(), time.perf_counter()
    for _ in range(steps):
      step()
    out['unprofiled_step_s'] = (time.perf_counter() - start) / steps
    usage = usage_per_step(before, process_usage(), steps)
    out['system_s'], out['faults'] = usage['system_s_per_step'], usage['minor_faults_per_step']
    per_category, per_op, kinds, seconds = collections.Counter(), collections.Counter(), {}, 0.0
    # One profiler session a step, collected after it: a session holds memory until it is
    # freed (2.6 GB a gpt_6l step under tx's glibc tunables) and lives in a reference cycle,
    # which only the garbage collector frees; 8 steps in one session outgrew a 24 GB host.
    for _ in range(steps):
      with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        seconds += time.perf_counter() - start
      for event in prof.events():
        ms = event.self_cpu_time_total / 1e3 / steps
        kind = kinds[event.name] = peer_category(event.name, _ancestors(event))
        per_category[kind] += ms
        per_op[event.name] += ms
      del prof
      gc.collect()
    out['step_s'] = seconds / steps
    out['per_category_ms'] = {k: per_category[k] for k in CATEGORIES}
    out['top'] = _top(per_op, lambda n: (kinds[n], ''), spec.get('profile_top', 4))
    return {}

  with mock.patch.object(torch_peers, '_train', profiled), mock.patch.object(
      torch_peers, '_attn', lambda *unused: {}):
    getattr(torch_peers, cases_lib.PEER_TRAIN[spec['family']])(spec)
  return out


# How much slower the profiled step may run than the unprofiled one before the report says
# that its split is the profiled step's: on small steps the tracer's cost is not spread
# evenly over the ops (benchmarks/NOTES.md, attempt 109: 121 ms profiled against 47).
SLOWED_BY = 1.3


def _slowed_note(side: str, result: dict) -> str | None:
  """A line for the table where profiling slowed `side`'s step by more than SLOWED_BY."""
  profiled, plain = result['step_s'], result['unprofiled_step_s']
  if not plain or profiled <= SLOWED_BY * plain:
    return None
  return (f'{side}: profiling slowed the step {profiled / plain:.1f}x ({profiled * 1e3:.1f} '
          f'against {plain * 1e3:.1f} ms): the categories split the profiled step, whose '
          'tracer cost is uneven; to compare parts, time variants unprofiled '
          '(benchmarks/step_ab.py, benchmarks/ffi_gemm_step.py)')


def table(doc: dict) -> str:
  """The report of `tx bench --profile` and `tx profile`: per case (or experiment), ms per
  step by category for tx and the peer (where measured), then each category's costliest
  ops."""
  lines = [host.summary(doc['machine']['host']),
           f'threads {doc["machine"]["threads"]}; GLIBC_TUNABLES '
           f'{doc["machine"].get("glibc_tunables") or "(unset)"}']
  for name, case in doc['cases'].items():
    if 'error' in case:
      lines += ['', f'{name}: FAILED: {case["error"]}']
      continue
    tx, peer = case['tx'], case.get('peer')
    tuned = case.get('tuned')
    lines += ['', f'{name}: ms per step' + (f" (tx with `tx tune`'s {tuned['choice']!r})"
                                             if tuned else ''),
              f'{"":18} {"tx":>9}' + (f' {"peer":>9}' if peer else '')]
    rows = [('step, profiled', 'step_s', 1e3), ('step, unprofiled', 'unprofiled_step_s', 1e3),
            ('system time', 'system_s', 1e3), ('page faults, count', 'faults', 1)]
    rows = [(label, tx[key] * k, peer[key] * k if peer else None) for label, key, k in rows]
    rows += [(k, tx['per_category_ms'][k], peer['per_category_ms'][k] if peer else None)
             for k in CATEGORIES]
    for label, a, b in rows:
      lines.append(f'{label:18} {a:9.1f}' + (f' {b:9.1f}' if b is not None else ''))
    lines.append(f'tx: some op running {tx["all_ops_ms"]:.1f} ms of the step; '
                 f'{len(tx["busy_ms"])} threads ran its ops, busy ms each '
                 + ', '.join(f'{b:.1f}' for b in tx['busy_ms'][:4]))
    if tx.get('async_dots'):
      lines.append(f'tx: {tx["async_dots"]} products ran in XLA\'s own dot thunk, whose spans '
                   'cover the launch only: the dense GEMM and attention rows read short, and no '
                   f'op was traced for {tx["step_s"] * 1e3 - tx["all_ops_ms"]:.1f} ms of the step')
    lines += [note for side, result in (('tx', tx), ('peer', peer))
              if result and (note := _slowed_note(side, result))]
    if tx.get('unmatched'):
      lines.append('tx: thunk-like trace spans found in no HLO instruction (ms per step): '
                   + ', '.join(f'{n} {ms:.1f}' for n, ms in tx['unmatched']))
    for side, result in (('tx', tx), ('peer', peer)):
      if result:
        lines.append(f'{side}: the costliest ops of each category (ms per step, all threads)')
        for kind in CATEGORIES:
          for op, ms, detail in result['top'].get(kind, []):
            lines.append(f'  {ms:8.2f}  {kind:11} {op}  {detail[-80:]}'.rstrip())
  return '\n'.join(lines)
