"""torch's kernels inside tx's training step against the same torch calls alone.

  python benchmarks/torch_in_step.py [CASE] [--set JSON] [--threads 2] [--calls 3] \
      [--cpu-by-thread]

On the Intel host tx's step with torch's GEMM and attention (`bert_6l_torch_kernels_4_per_call`)
spends more in those kernels than the peer spends in the same kernels (benchmarks/NOTES.md,
attempt 57). This script says which part: it wraps the callbacks of tx/ops/torch_matmul.py,
tx/ops/torch_attention.py and tx/ops/torch_norm.py, runs CASE's training call (a `tx bench`
case, as `tx tune` times it) a few times, and records each callback's wall time, the page
faults and system time during it, its operands' shapes, the alignment of the buffers XLA
hands it (MKL asks for 64-byte aligned operands for its best speed) and the thread that
called it (each thread that enters an OpenMP region gets its own team of torch's worker
threads); with --cpu-by-thread also which threads ran on the CPUs while it did. Then it times
the same torch calls alone, on fresh tensors of those shapes, in the case's dtype, in this
process:

- `alone, tx's form`: exactly the callback's calls (products into preallocated outputs with
  tx's layouts; attention and LayerNorm with the copies into the outputs; attention with
  what the callback hands the kernel of the step's mask);
- `alone, peer's form`: what the peer's nn.Linear calls (addmm with the weight as [N, K],
  mm(g, W), mm(gᵀ, x)), attention without a mask or copies, and LayerNorm's kernels without
  the copies into XLA's outputs.

The in-step / alone ratio above 1 is what the step's surroundings cost the kernels (cold
caches, page faults, thread hand-offs); tx's form against the peer's is the layout's share.
Run it alone on an idle host, pinned to as many CPUs as --threads (`taskset -c 0,1`): XLA
uses every CPU the process may run on. The numbers are medians of a few calls, timed after
untimed ones until the process stops growing (its first calls fault in the heap's growth:
benchmarks/NOTES.md, attempt 115).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import threading
import time

_RECORDS: list[tuple] = []
# (kind, caller's native id, {thread: ns on a CPU})
_CPU: list[tuple[str, int, dict[int, int]]] = []
_TRACK_CPU = False


def _wrap(module, name: str, kind: str):
  fn = getattr(module, name)

  def timed(ctx, outs, *args, **kwargs):
    shapes = tuple(tuple(a.shape) for a in args)
    align = _alignment(outs, args)
    cpu = _cpu_ns_by_thread() if _TRACK_CPU else None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    result = fn(ctx, outs, *args, **kwargs)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    if cpu is not None:
      cpu_after = _cpu_ns_by_thread()
      _CPU.append((kind, threading.get_native_id(),
                   {t: ns - cpu.get(t, 0) for t, ns in cpu_after.items() if ns > cpu.get(t, 0)}))
    _RECORDS.append((kind, shapes, seconds, after.ru_minflt - usage.ru_minflt,
                     after.ru_stime - usage.ru_stime, kwargs.get('causal', False),
                     threading.get_ident(), align))
    return result

  setattr(module, name, timed)


def _cpu_ns_by_thread() -> dict[int, int]:
  """{native thread id: nanoseconds it has run on a CPU} for every thread of this process
  (the first field of /proc/self/task/<id>/schedstat)."""
  times = {}
  for tid in os.listdir('/proc/self/task'):
    try:
      with open(f'/proc/self/task/{tid}/schedstat', encoding='ascii') as f:
        times[int(tid)] = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # a thread that ended between list and read
      pass
  return times


def _cpu_report() -> None:
  """Where the CPUs went while each kind of callback ran, in ms a call: the thread that
  called it (XLA's worker, torch's first OpenMP thread), XLA's other workers (the other
  threads that call callbacks: running an XLA op or waiting for one), and every other thread
  (torch's OpenMP workers, the main thread)."""
  callers = {caller for _, caller, _ in _CPU}
  table: dict[str, list[float]] = {}
  for kind, caller, used in _CPU:
    row = table.setdefault(kind, [0, 0.0, 0.0, 0.0])
    row[0] += 1
    row[1] += used.get(caller, 0) / 1e6
    row[2] += sum(ns for t, ns in used.items() if t in callers and t != caller) / 1e6
    row[3] += sum(ns for t, ns in used.items() if t not in callers) / 1e6
  print(f'CPU ms a call while a callback ran ({len(callers)} calling threads): '
        + '; '.join(f'{kind}: caller {c / n:.1f}, XLA\'s other workers {o / n:.1f}, '
                    f'the rest {r / n:.1f}' for kind, (n, c, o, r) in sorted(table.items())))


def _alignment(outs, args) -> int:
  """The largest power of two (at most 4096) that divides every buffer's address: the
  callback's outputs and operands, as XLA hands them over."""
  from tx.ops.torch_host import torch_module  # pylint: disable=g-import-not-at-top
  torch = torch_module()
  buffers = [b for b in (list(outs) if isinstance(outs, (tuple, list)) else [outs]) + list(args)
             if b is not None]
  align = 4096
  for b in buffers:
    address = torch.from_dlpack(b).data_ptr()
    align = min(align, address & -address if address else 4096)
  return align


def _median_ms(fn, repeats: int = 7) -> float:
  for _ in range(2):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def _gemm_calls(torch, kind: str, shapes, dtype):
  """(tx's form, the peer's form) of one product callback, as zero-argument calls, on
  operands of `dtype` (the case's)."""
  randn = lambda *shape: torch.randn(*shape, dtype=dtype)
  empty = lambda *shape: torch.empty(*shape, dtype=dtype)
  if kind == 'gemm forward':
    (m, k), (_, n) = shapes
    x, w, out, bias = randn(m, k), randn(k, n), empty(m, n), randn(n)
    weight_nk = w.t().contiguous()
    return (lambda: torch.mm(x, w, out=out)), (lambda: torch.addmm(bias, x, weight_nk.t()))
  (m, n), (_, k), _ = shapes  # g [M, N], x [M, K], w [K, N]
  g, x, w = randn(m, n), randn(m, k), randn(k, n)
  d_x, d_w = empty(m, k), empty(k, n)
  weight_nk = w.t().contiguous()

  def tx_form():
    torch.mm(g, w.t(), out=d_x)
    torch.mm(x.t(), g, out=d_w)

  def peer_form():
    torch.mm(g, weight_nk)
    torch.mm(g.t(), x)

  return tx_form, peer_form


def _norm_calls(torch, kind: str, shapes, dtype):
  """(tx's form, the peer's form) of one LayerNorm callback: torch's kernel with the copies
  into XLA-shaped outputs, and the kernel alone (what the peer's nn.LayerNorm runs); rows in
  `dtype` (the case's), scale and bias float32 (tx's parameters)."""
  n, d = shapes[0 if kind == 'norm forward' else 1]
  x, g = torch.randn(n, d, dtype=dtype), torch.randn(n, d, dtype=dtype)
  scale, bias = torch.randn(d), torch.randn(d)
  _, mean, rstd = torch.native_layer_norm(x, (d,), scale, bias, 1e-5)
  outs = [torch.empty_like(t) for t in (x, scale, bias)]
  if kind == 'norm forward':
    row_stats = [torch.empty(n) for _ in range(2)]

    def forward_tx_form():
      y, m, r = torch.native_layer_norm(x, (d,), scale, bias, 1e-5)
      for out, value in zip((outs[0], *row_stats), (y, m.view(-1), r.view(-1))):
        out.copy_(value)

    return forward_tx_form, lambda: torch.native_layer_norm(x, (d,), scale, bias, 1e-5)
  backward = lambda: torch.ops.aten.native_layer_norm_backward(
      g, x, (d,), mean, rstd, scale, bias, [True, True, True])

  def tx_form():
    for out, grad in zip(outs, backward()):
      out.copy_(grad)

  return tx_form, backward


def _attention_calls(torch, torch_attention, backward_shapes, causal: bool, dtype):
  """(tx's form, the peer's form) of one attention forward + backward, from the shapes of
  the backward callback's operands (d_out, q, k, v, out, lse and, when masked, the bias),
  in `dtype` (the case's; the log-sum-exp float32, as the kernel gives it)."""
  q_shape = backward_shapes[1]
  b, l, h, _ = q_shape
  q, k, v, d_out = (torch.randn(*q_shape, dtype=dtype) for _ in range(4))
  bias = None
  if len(backward_shapes) > 6:  # the step's mask, hiding what a causal or unpadded one does;
    # what the kernel gets of it is the callback's (`host_mask`): None where it hides nothing
    # beyond `causal`, as in the step
    bias_shape = backward_shapes[6]
    bias = torch.zeros(*bias_shape, dtype=dtype)
    if causal and bias_shape[-1] == bias_shape[-2]:
      hidden = torch.ones(bias_shape[-2:], dtype=torch.bool).triu(1)
      bias = bias.masked_fill(hidden, -1e9)
    bias = torch_attention.host_mask(bias, causal)[0]
  out_buffer, lse_buffer = torch.empty(*q_shape, dtype=dtype), torch.empty(b, h, l)
  grad_buffers = [torch.empty(*q_shape, dtype=dtype) for _ in range(3)]
  # pylint: disable-next=protected-access
  forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
  # pylint: disable-next=protected-access
  backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
  heads_first = lambda t: t.transpose(1, 2)
  scale = q_shape[-1] ** -0.5

  def run(mask, copies):
    def call():
      out, lse = forward(*map(heads_first, (q, k, v)), 0.0, causal, attn_mask=mask, scale=scale)
      if copies:
        heads_first(out_buffer).copy_(out)
        lse_buffer.copy_(lse)
        out = heads_first(out_buffer)
      grads = backward(*map(heads_first, (d_out, q, k, v)), out, lse, 0.0, causal,
                       attn_mask=mask, scale=scale)
      if copies:
        for buffer, grad in zip(grad_buffers, grads):
          heads_first(buffer).copy_(grad)
    return call

  return run(bias, True), run(None, False)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('case', nargs='?', default='bert_6l_torch_kernels_4_per_call')
  parser.add_argument('--set', default='{}', metavar='JSON',
                      help='case spec keys set otherwise, e.g. \'{"attention_impl": "torch"}\'')
  parser.add_argument('--threads', type=int, default=2)
  parser.add_argument('--calls', type=int, default=3,
                      help='timed training calls, after untimed ones until the process stops '
                           'growing (tx.timing.warm_until_steady)')
  parser.add_argument('--cpu-by-thread', action='store_true',
                      help="also each thread's CPU time during every callback (reads /proc "
                           'twice a call, which the in-step times then include)')
  args = parser.parse_args()
  global _TRACK_CPU
  _TRACK_CPU = args.cpu_by_thread
  from tx import malloc_tuning  # pylint: disable=g-import-not-at-top
  malloc_tuning.reexec_tuned()  # tx's glibc tunables, as `tx bench` measures with
  for name in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'):  # XLA's threads: the CPUs allowed
    os.environ[name] = str(args.threads)
  os.environ['JAX_PLATFORMS'] = 'cpu'  # the callbacks are a CPU path, on a GPU machine too
  import jax  # pylint: disable=g-import-not-at-top
  from tx.bench.cases import SUITE  # pylint: disable=g-import-not-at-top
  from tx.bench.tuned import step_config  # pylint: disable=g-import-not-at-top
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from tx.ops import torch_attention, torch_matmul, torch_norm
  from tx.ops.torch_host import torch_module  # pylint: disable=g-import-not-at-top
  from tx.runs import tune, tune_step  # pylint: disable=g-import-not-at-top
  from tx.timing import warm_until_steady  # pylint: disable=g-import-not-at-top
  torch = torch_module()
  torch.set_num_threads(args.threads)
  _wrap(torch_matmul, '_product_into', 'gemm forward')
  _wrap(torch_matmul, '_gradients_into', 'gemm gradients')
  _wrap(torch_attention, '_forward_into', 'attention forward')
  _wrap(torch_attention, '_backward_into', 'attention backward')
  _wrap(torch_norm, '_layer_norm_into', 'norm forward')
  _wrap(torch_norm, '_layer_norm_grads_into', 'norm backward')
  spec = next((c.spec for c in SUITE if c.name == args.case), None)
  if spec is None:
    raise SystemExit(f'unknown case {args.case!r}: pick one of '
                     + ', '.join(c.name for c in SUITE if 'train' in c.kinds))
  try:
    spec = dict(spec, **json.loads(args.set))
  except (ValueError, TypeError) as e:
    raise SystemExit(f'--set {args.set!r}: not a JSON object of spec keys ({e})') from None
  dtype = torch.bfloat16 if spec.get('dtype') == 'bfloat16' else torch.float32
  cfg = tune.one_device_config(step_config(spec))
  compiled, state, batch, cfg, _ = tune_step.compiled_step({'config': to_dict(cfg)})
  per_call = cfg.train.per_call
  holder = [state]

  def one():
    holder[0], metrics = compiled(holder[0], batch)
    jax.block_until_ready(metrics)

  warm = warm_until_steady(one)  # the heap's first growth is not the steady state's cost
  _RECORDS.clear()
  _CPU.clear()
  start = time.perf_counter()
  for _ in range(args.calls):
    one()
  wall, steps = time.perf_counter() - start, args.calls * per_call
  print(f'{args.case}: {steps} steps timed after {warm} untimed calls, '
        f'{wall / steps * 1e3:.0f} ms a step, {per_call} per call, torch threads {args.threads}')
  print(f'{"kind":<20} {"shapes":<34} {"n/step":>6} {"in step":>8} {"faults":>7} '
        f'{"sys ms":>6} {"alone tx":>9} {"alone peer":>10} {"step/tx":>8} {"tx/peer":>8}')
  groups: dict[tuple, list] = {}
  for kind, shapes, seconds, faults, system, causal, _, _ in _RECORDS:
    groups.setdefault((kind, shapes, causal), []).append((seconds, faults, system))
  totals = {}
  attention_done = set()
  for (kind, shapes, causal), runs in sorted(groups.items()):
    in_step = statistics.median(r[0] for r in runs) * 1e3
    per_step = len(runs) / steps
    faults = sum(r[1] for r in runs) / steps
    system = sum(r[2] for r in runs) / steps * 1e3
    if kind.startswith(('gemm', 'norm')):
      calls = _gemm_calls if kind.startswith('gemm') else _norm_calls
      tx_form, peer_form = calls(torch, kind, shapes, dtype)
      alone_tx, alone_peer = _median_ms(tx_form), _median_ms(peer_form)
      compared = in_step
    else:  # forward and backward are timed alone together, against both in the step
      key = (shapes[0], causal)
      if key in attention_done or kind != 'attention backward':
        compared = None
      else:
        attention_done.add(key)
        forward = [g for g in groups.items() if g[0][0] == 'attention forward'
                   and g[0][1][0] == shapes[0] and g[0][2] == causal]
        forward_ms = statistics.median(r[0] for r in forward[0][1]) * 1e3 if forward else 0.0
        compared = in_step + forward_ms
        tx_form, peer_form = _attention_calls(torch, torch_attention, shapes, causal, dtype)
        alone_tx, alone_peer = _median_ms(tx_form), _median_ms(peer_form)
    bucket = totals.setdefault(kind.split()[0], [0.0, 0.0, 0.0])
    bucket[0] += in_step * per_step
    text = ' x '.join('x'.join(map(str, s)) for s in shapes[:2])
    if compared is None:
      print(f'{kind:<20} {text:<34} {per_step:>6.1f} {in_step:>8.1f} {faults:>7.0f} {system:>6.1f}')
      continue
    bucket[1] += alone_tx * per_step
    bucket[2] += alone_peer * per_step
    print(f'{kind:<20} {text:<34} {per_step:>6.1f} {in_step:>8.1f} {faults:>7.0f} {system:>6.1f} '
          f'{alone_tx:>9.1f} {alone_peer:>10.1f} {compared / alone_tx:>7.2f}x '
          f'{alone_tx / alone_peer:>7.2f}x')
  for name, (in_step, alone_tx, alone_peer) in totals.items():
    print(f'{name}: {in_step:.0f} ms a step in the step; alone {alone_tx:.0f} in tx\'s form, '
          f'{alone_peer:.0f} in the peer\'s')
  aligned = {}
  for record in _RECORDS:
    aligned.setdefault(record[0], []).append(record[-1])
  print('buffer alignment in the step (bytes; calls): ' + '; '.join(
      f'{kind} ' + ', '.join(f'{a}: {values.count(a)}' for a in sorted(set(values)))
      for kind, values in sorted(aligned.items())))
  callers = {}
  for record in _RECORDS:
    callers.setdefault(record[0], set()).add(record[-2])
  main_thread = threading.get_ident()
  print('threads that called the callbacks (the main thread marked): ' + '; '.join(
      f'{kind} {len(ids)}' + (' incl. main' if main_thread in ids else '')
      for kind, ids in sorted(callers.items()))
      + f'; {len(os.listdir("/proc/self/task"))} OS threads in the process')
  if _CPU:
    _cpu_report()


if __name__ == '__main__':
  main()
