"""The table and the targets of a `tx bench` run (from its JSON document)."""

from __future__ import annotations

import math

from tx.bench import host
from tx.compare import stats

GB = 1e9

# (name, case, metric of `rows`, 'min' | 'max' bound on the value, bound) — issue 9's targets.
TARGETS = (
    ('decoder train tokens/s >= 1.5x peer (baby)', 'gpt_baby', 'train tokens/s', 'min', 1.5),
    ('decoder train tokens/s >= 1.5x peer (6L)', 'gpt_6l', 'train tokens/s', 'min', 1.5),
    ('train peak memory <= 0.6x peer (6L)', 'gpt_6l', 'train peak RSS GB', 'max', 0.6),
    ('cached decode >= 2x generate (batch 1)', 'gpt_6l', 'decode b1 tokens/s', 'min', 2.0),
    ('cached decode >= 2x generate (batch 8)', 'gpt_6l', 'decode b8 tokens/s', 'min', 2.0),
    ('24-layer scanned compile <= 1.3x 2-layer', 'compile_24l', 'compile s / 2-layer', 'max', 1.3),
    ('MFU of the 6-layer model >= 55% (float32)', 'gpt_6l', 'train MFU', 'min', 0.55),
    # issue 24's float32 floor, below the 1.5x targets, for the decoder and the encoder
    ('decoder train tokens/s >= 1.0x peer (baby, float32)', 'gpt_baby', 'train tokens/s', 'min',
     1.0),
    ('decoder train tokens/s >= 1.0x peer (6L, float32)', 'gpt_6l', 'train tokens/s', 'min',
     1.0),
    ('encoder train tokens/s >= 1.0x peer (6L, float32)', 'bert_6l', 'train tokens/s', 'min',
     1.0),
)
# Issue 24's bf16 targets, judged only on hosts with bf16 arithmetic (avx512_bf16 or AMX).
BF16_TARGETS = (
    ('bf16 train >= 1.5x tx float32 (6L)', 'gpt_6l_bf16', 'bf16 / float32 tokens/s', 'min',
     1.5),
    ('MFU of the 6-layer model >= 35% (bf16 ceiling)', 'gpt_6l_bf16', 'train MFU', 'min', 0.35),
    ('bf16 train tokens/s >= 1.0x peer in bf16 (6L)', 'gpt_6l_bf16', 'train tokens/s', 'min',
     1.0),
)
NO_BF16 = 'no bf16 arithmetic on this host (no avx512_bf16 / AMX): bf16 targets not judged'
NO_BF16_PEER = ('no bf16 arithmetic on this host (no avx512_bf16 / AMX): the peer in bf16 '
                'autocast not measured (tx only)')
NO_BF16_TORCH = ("no bf16 arithmetic on this host (no avx512_bf16 / AMX): torch's bf16 kernels "
                 'in the step are emulated there; skipped')
# Datasheet dense peaks, FLOP/s (bf16, TF32), by a name jax's device_kind contains; first match
# wins (the H100's PCIe and NVL cards are slower than the SXM 'HBM3' one). float32 products
# run in TF32 on a GPU (XLA's default), so a float32 case's datasheet MFU is against TF32's.
GPU_PEAKS = (('H100 PCIe', {'bfloat16': 756e12, 'float32': 378e12}),
             ('H100 NVL', {'bfloat16': 835e12, 'float32': 418e12}),
             ('H100', {'bfloat16': 989.4e12, 'float32': 494.7e12}),
             ('H200', {'bfloat16': 989.4e12, 'float32': 494.7e12}),
             ('A100', {'bfloat16': 312e12, 'float32': 156e12}))


def gpu_peak(doc: dict) -> dict | None:
  """The datasheet peaks of a GPU run's device, or None (a CPU run, an unknown GPU)."""
  m = doc.get('machine') or {}
  if m.get('measured_on') != 'gpu':
    return None
  return next((p for name, p in GPU_PEAKS if name in (m.get('device') or '')), None)


def _ratio(a, b):
  return a / b if a is not None and b else None


def _mfu(train: dict | None, spec: dict, ceiling: dict):
  if not train or not ceiling:
    return None
  return train['flops_per_step'] / train['step_time_s'] / ceiling[spec.get('dtype', 'float32')]


def own_ceiling_metric(train: dict) -> str:
  """The row name of MFU against the GEMM timed in tx's own process, naming that GEMM
  (XLA's dot, or torch's mm under matmul_impl='torch'): the two differ by up to 40 % on one
  host. Results written before `own_ceiling_kernel` existed timed XLA's."""
  kernel = {'xla': 'XLA dot', 'torch': 'torch mm'}[train.get('own_ceiling_kernel', 'xla')]
  return f'train MFU (own {kernel} ceiling)'


def rows(doc: dict) -> list[dict]:
  """One row per (case, metric): tx value, peer value, tx / peer."""
  out = []
  ceiling, peak = doc['ceiling'], gpu_peak(doc)
  compile_2l = doc['cases'].get('compile_2l', {}).get('tx_compile', {}).get('compile_s')

  def add(case, metric, tx, peer=None, ratio='auto', rounds=None):
    r = _ratio(tx, peer) if ratio == 'auto' else ratio
    out.append({'case': case, 'metric': metric, 'tx': tx, 'peer': peer, 'ratio': r})
    if rounds and rounds[0]:  # (tx's value per round, the peer's or None, which side ran
      # first per round or None), in the order run
      out[-1].update(tx_rounds=rounds[0], peer_rounds=rounds[1])
      if rounds[1] and len(rounds[1]) == len(rounds[0]):
        paired = out[-1]['ratio_rounds'] = [a / b for a, b in zip(rounds[0], rounds[1])]
        if rounds[2]:
          out[-1]['first_rounds'] = rounds[2]
        if all(x > 0 for x in paired):
          out[-1].update(_intervals(paired, rounds[2]))

  def measured(c, key):
    return c.get(f'tx_{key}_rounds'), c.get(f'peer_{key}_rounds'), c.get(f'{key}_first_rounds')

  for name, c in doc['cases'].items():
    if 'error' in c:
      continue
    spec = c['spec']
    txt, peer = c.get('tx_train'), c.get('peer_train')
    if txt:
      add(name, 'train tokens/s', txt['tokens_per_s'], peer and peer['tokens_per_s'],
          rounds=measured(c, 'train'))
      add(name, 'train step s', txt['step_time_s'], peer and peer['step_time_s'])
      # MFU: the ratio is the value itself (tx), the peer's MFU is shown beside it.
      add(name, 'train MFU', _mfu(txt, spec, ceiling), peer and _mfu(
          dict(peer, flops_per_step=txt['flops_per_step']), spec, ceiling), ratio=None)
      if txt.get('own_ceiling_flops'):  # against a matmul timed in tx's own process
        add(name, own_ceiling_metric(txt), txt['flops_per_step'] / txt['step_time_s']
            / txt['own_ceiling_flops'], ratio=None)
      if peak:
        add(name, 'train MFU (datasheet)', _mfu(txt, spec, peak), peer and _mfu(
            dict(peer, flops_per_step=txt['flops_per_step']), spec, peak), ratio=None)
      add(name, 'train peak RSS GB', txt['peak_rss_bytes'] / GB,
          peer and peer['peak_rss_bytes'] / GB)
      if 'system_s_per_step' in txt and 'device_peak_bytes' not in txt:
        # The kernel's share of a CPU step: mostly memory faulted in and zeroed afresh.
        add(name, 'train system s/step', txt['system_s_per_step'],
            peer and peer.get('system_s_per_step'), ratio=None)
      if 'warmup_calls' in txt:  # untimed calls after the first, until the process stops growing
        add(name, 'train warm-up calls', txt['warmup_calls'], peer and peer.get('warmup_calls'),
            ratio=None)
      if 'device_peak_bytes' in txt:
        add(name, 'train peak device GB', txt['device_peak_bytes'] / GB,
            peer and peer.get('device_peak_bytes', 0) / GB or None)
      add(name, 'compile / first step s', txt['compile_s'], peer and peer['first_step_s'],
          ratio=None)
    ablated, peer_ablated = c.get('tx_train_ablated'), c.get('peer_train_ablated')
    if ablated:
      add(name, 'tokens/s w/o attention', ablated['tokens_per_s'],
          peer_ablated and peer_ablated['tokens_per_s'], rounds=measured(c, 'train_ablated'))
    for key in sorted(k for k in c if k.startswith('tx_decode_b') and k[-1].isdigit()):
      batch = key[len('tx_decode_b'):]
      p = c.get(f'peer_decode_b{batch}')
      add(name, f'decode b{batch} tokens/s', c[key]['new_tokens_per_s'],
          p and p['new_tokens_per_s'], rounds=measured(c, f'decode_b{batch}'))
    base = doc['cases'].get(spec.get('float32_case') or '', {})
    if txt and base.get('tx_train'):
      own = lambda side: (c.get(f'{side}_train') or {}).get('tokens_per_s')
      base_own = lambda side: (base.get(f'{side}_train') or {}).get('tokens_per_s')
      add(name, 'bf16 / float32 tokens/s', _ratio(own('tx'), base_own('tx')),
          _ratio(own('peer'), base_own('peer')), ratio=None)
    default_attention = doc['cases'].get(spec.get('attention_case') or '', {}).get('tx_train')
    if txt and default_attention:  # this case runs XLA's attention where that one runs cuDNN's
      add(name, 'tokens/s / cuDNN case', _ratio(txt['tokens_per_s'],
                                                default_attention['tokens_per_s']), ratio=None)
    if 'tx_compile' in c:
      seconds = c['tx_compile']['compile_s']
      add(name, 'compile s', seconds, None, ratio=None)
      if name != 'compile_2l' and compile_2l:
        add(name, 'compile s / 2-layer', seconds / compile_2l, None, ratio=None)
  return out


def _intervals(paired: list[float], first: list[str] | None) -> dict:
  """A row's 'ratio_interval' ([geometric mean, low, high] of the paired rounds' tx / peer,
  a 95 % t-interval) and, where the rounds record which side ran first and each side did so
  in two rounds or more, 'order_intervals': {'tx': [...], 'peer': [...]}, the same over the
  rounds that side ran first, and 'order_effect': [the ratio of the two geometric means, tx
  first over peer first, with its Welch interval on the logs]. An effect whose interval
  excludes 1 is an order effect: a second process of a pair that runs faster (or slower)
  for being second."""
  out = {}
  interval = stats.ratio_interval(paired)
  if interval:
    out['ratio_interval'] = [interval.diff, interval.low, interval.high]
  if first and len(first) == len(paired):
    logs = {side: [math.log(r) for r, f in zip(paired, first) if f == side]
            for side in ('tx', 'peer')}
    by = {side: stats.ratio_interval([math.exp(x) for x in xs]) for side, xs in logs.items()}
    if all(by.values()):
      out['order_intervals'] = {side: [i.diff, i.low, i.high] for side, i in by.items()}
      effect = stats.welch_interval(logs['tx'], logs['peer'])
      out['order_effect'] = [math.exp(x) for x in (effect.diff, effect.low, effect.high)]
  return out


def has_bf16_arithmetic(doc: dict) -> bool | None:
  """Whether the measured host has bf16 arithmetic (None: no host record)."""
  return host.has_bf16_arithmetic((doc.get('machine') or {}).get('host'))


def targets(doc: dict) -> list[dict]:
  """Each target with the measured value (tx / peer, or the value itself) and met or not
  (None when the suite did not measure it, or for a bf16 target on a host without bf16
  arithmetic: `note` says so)."""
  if (doc.get('machine') or {}).get('measured_on') == 'gpu':
    return []  # issue 9's and 24's targets are CPU targets
  by = {(r['case'], r['metric']): r for r in doc['rows']}
  bf16_host = has_bf16_arithmetic(doc) is not False
  out = []
  for label, case, metric, kind, bound in TARGETS + BF16_TARGETS:
    r = by.get((case, metric))
    value = None if r is None else (r['ratio'] if r['ratio'] is not None else r['tx'])
    met = None if value is None else (value >= bound if kind == 'min' else value <= bound)
    row = {'target': label, 'value': value, 'bound': bound, 'kind': kind, 'met': met}
    paired = r.get('ratio_rounds') if r is not None and r['ratio'] is not None else None
    if (label, case, metric, kind, bound) in BF16_TARGETS and not bf16_host:
      row.update(met=None, note=NO_BF16)
    elif metric == 'bf16 / float32 tokens/s' and met is False:
      own = own_float32_arithmetic(doc, case)
      if own and own['need'] > 1.0:  # the miss explained: no tuning can meet it on this host
        row['note'] = (f"ruled out by the ceilings: {own['need']:.0%} of {own['gemm']}'s "
                       'bf16 ceiling needed')
    elif paired:  # the same bound on each round's own tx / peer ratio
      row.update(rounds=len(paired), rounds_met=sum(
          (x >= bound if kind == 'min' else x <= bound) for x in paired))
      if r.get('ratio_interval'):
        row['interval'] = r['ratio_interval']
    out.append(row)
  return out


def own_float32_arithmetic(doc: dict, case: str) -> dict | None:
  """Whether a bf16 case's 1.5x over tx's own float32 step (its spec's float32_case) fits
  under the faster bf16 GEMM tx can run (XLA's dot, under `tx tune`'s flags too where its
  choice set some, or torch's via model.matmul_impl=torch): {'rate': tx's float32 FLOP/s,
  'gemm': 'XLA', 'tuned XLA' or 'torch', 'ceiling': that bf16 ceiling,
  'float32_ceiling': XLA's float32 one, 'need': 1.5 * rate / ceiling}; None where either
  step or the bf16 ceilings were not measured. On a CPU whose bf16 products run no faster
  than float32 ones (avx512_bf16 without AMX), the need exceeds 100 %: ruled out."""
  c = doc['cases'].get(case) or {}
  base = doc['cases'].get(c.get('spec', {}).get('float32_case') or '') or {}
  txt, base_txt = c.get('tx_train'), base.get('tx_train')
  flagged = tuned_rates(c, 'bfloat16')
  ceilings = {'XLA': doc['ceiling'].get('bfloat16'),
              'torch': (doc.get('peer_ceiling') or {}).get('bfloat16'),
              _TUNED_XLA: flagged[0] if flagged else None}
  ceilings = {k: v for k, v in ceilings.items() if v}
  if not (txt and base_txt and ceilings):
    return None
  gemm = max(ceilings, key=ceilings.get)
  rate = base_txt['flops_per_step'] / base_txt['step_time_s']
  return {'rate': rate, 'gemm': gemm, 'ceiling': ceilings[gemm],
          'float32_ceiling': doc['ceiling']['float32'], 'need': 1.5 * rate / ceilings[gemm]}


def _own_float32_line(case: str, a: dict) -> str:
  verdict = 'under the ceiling' if a['need'] <= 1.0 else 'ruled out by the ceilings'
  return (f"{case} (bfloat16 over tx's float32): tx's float32 step trains at "
          f"{a['rate'] / 1e9:.0f} GFLOP/s; the faster bf16 GEMM, {a['gemm']}'s, peaks at "
          f"{a['ceiling'] / 1e9:.0f} GFLOP/s ({a['ceiling'] / a['float32_ceiling']:.2f}x "
          f"XLA's float32 ceiling), so 1.5x tx's float32 needs {a['need']:.0%} of it: "
          f"{verdict}")


def ceiling_arithmetic(doc: dict) -> list[str]:
  """Per training case with a peer, whether 1.5x the peer's speed fits under the ceiling of
  the GEMM tx's step ran (XLA's, or torch's where the case or `tx tune`'s choice set
  model.matmul_impl=torch): the peer's FLOP rate (tx's FLOP count) times 1.5, as a fraction
  of that n^3 matmul ceiling (under the XLA flags of `tx tune`'s choice, where it set some,
  the fastest of XLA's n^3 product and the step's own products: `tuned_rates`); above 100 %
  the ceilings rule 1.5x out on this host. Where the
  step's own products were timed (`step_gemms`), a second line, the finer bound: their time at
  that GEMM's best timed rates (`bound_rates`) plus the attention products' at its ceiling,
  against the step time 1.5x the peer allows, and how much faster the rest of the step would
  then have to run (no bound where tx's step is already faster than that time). Where its
  self-attention was timed alone on both sides (`step_attention`), a third: that time over
  all layers in each framework, against the gap between the two steps. Where both sides also
  trained with attention stubbed out (`tx_train_ablated`, `peer_train_ablated`), a fourth:
  what attention costs inside each step, against the same gap. Last, per bf16 case, whether
  1.5x tx's own float32 step fits under the bf16 ceilings (`own_float32_arithmetic`)."""
  peer_ceiling = doc.get('peer_ceiling')
  lines = []
  for case, c in doc['cases'].items() if peer_ceiling else ():
    txt, peer = c.get('tx_train'), c.get('peer_train')
    if not (txt and peer):
      continue
    dtype = c.get('spec', {}).get('dtype', 'float32')
    side, gemm_name = ('peer', 'torch') if runs_torch_gemm(c) else ('tx', 'XLA')
    gemm_dtype = 'float32' if runs_torch_float32_gemm(c) else dtype
    ceiling = (peer_ceiling if side == 'peer' else doc['ceiling'])[gemm_dtype]
    flagged = tuned_rates(c, dtype) if side == 'tx' else None
    if flagged:  # the rates under the flags tx's step ran with
      ceiling, gemm_name = flagged[0], _TUNED_XLA
    if not ceiling:
      continue
    peer_rate = txt['flops_per_step'] / peer['step_time_s']
    need = 1.5 * peer_rate / ceiling
    verdict = 'under the ceiling' if need <= 1.0 else 'ruled out by the ceilings'
    under_flags = f' ({flagged[0] / 1e9:.0f} under `tx tune`\'s flags)' if flagged else ''
    lines.append(
        f'{case} ({dtype}): GEMM ceilings XLA {doc["ceiling"][dtype] / 1e9:.0f}{under_flags} / '
        f'torch {peer_ceiling[dtype] / 1e9:.0f} GFLOP/s; the peer trains at '
        f'{peer_rate / 1e9:.0f} GFLOP/s, so 1.5x needs {need:.0%} of {gemm_name}\'s ceiling'
        f'{_TORCH_GEMM_NOTE if side == "peer" else ""}'
        f'{_WIDENED_NOTE.format(ceiling / 1e9) if gemm_dtype != dtype else ""}: {verdict}')
    gemm = step_gemm_seconds(doc, c.get('spec', {}).get('float32_case') or case, gemm_dtype,
                             side, rates=bound_rates(doc, c, side, tuned=bool(flagged)))
    if gemm is not None:
      dense_s, dense_flops = gemm
      # the rest of the model FLOPs (attention's products) at no better than the n^3 ceiling
      kernels = dense_s + max(txt['flops_per_step'] - dense_flops, 0) / ceiling
      allowed = peer['step_time_s'] / 1.5
      rest, rest_now = allowed - kernels, txt['step_time_s'] - kernels
      speedup = (f'{rest_now / rest:.1f}x faster needed' if rest_now > rest else
                 'within it already')
      then = (f'leaving {_secs(rest)} for the rest of the step (softmax, norms, optimizer), '
              f'which takes {_secs(rest_now)} now: {speedup}' if rest > 0 else
              'ruled out by the kernels')
      if rest_now < 0:  # the products ran faster in the step than alone: no bound
        then = (f'no bound: tx\'s step takes {_secs(txt["step_time_s"])}, less than its '
                'products alone at these rates')
      lines.append(f'{case} ({dtype}): the step\'s own GEMMs at {gemm_name}\'s best rates take '
                   f'{_secs(dense_s)} and its attention products at least '
                   f'{_secs(kernels - dense_s)}: {_secs(kernels)} of the {_secs(allowed)} a '
                   f'step may take at 1.5x the peer, {then}')
    gap = txt['step_time_s'] - peer['step_time_s']
    attention = step_attention_seconds(doc, c.get('spec', {}).get('float32_case') or case,
                                       dtype)
    if attention is not None and runs_torch_attention(c):  # the peer's kernel on both sides
      ours, theirs = attention
      lines.append(f'{case} ({dtype}): its self-attention alone, forward and backward of '
                   f'every layer: tx\'s step runs torch\'s kernel, {_secs(theirs)} alone as in '
                   f'the peer (tx\'s XLA path: {_secs(ours)}), so the kernel explains none of '
                   f'the gap; handing it XLA\'s buffers can')
    elif attention is not None:
      ours, theirs = attention
      lines.append(f'{case} ({dtype}): its self-attention alone, forward and backward of '
                   f'every layer: {_secs(ours)} in tx against {_secs(theirs)} in torch '
                   f'(scaled_dot_product_attention): {_share(ours, theirs, gap)}')
    ablated, peer_ablated = c.get('tx_train_ablated'), c.get('peer_train_ablated')
    if ablated and peer_ablated:
      ours = txt['step_time_s'] - ablated['step_time_s']
      theirs = peer['step_time_s'] - peer_ablated['step_time_s']
      share = (_share(ours, theirs, gap) if min(ours, theirs) > 0 else
               'a step no faster without it, so attention\'s share is below this run\'s noise')
      lines.append(f'{case} ({dtype}): its attention inside the step (each side trained '
                   f'again with out = v in its place): {_secs(ours)} of tx\'s step against '
                   f'{_secs(theirs)} of torch\'s: {share}; without it, tx trains at '
                   f'{peer_ablated["step_time_s"] / ablated["step_time_s"]:.2f}x the peer\'s '
                   'speed')
  for case in doc['cases']:
    own = own_float32_arithmetic(doc, case)
    if own:
      lines.append(_own_float32_line(case, own))
  return lines


def rounds_lines(doc: dict) -> list[str]:
  """One line per row measured over several rounds: each side's range, and the range of the
  paired ratios (round i's tx over round i's peer, measured side by side)."""
  span = lambda xs, fmt: f'{fmt(min(xs))}-{fmt(max(xs))}'
  lines = []
  for r in doc['rows']:
    if not r.get('tx_rounds'):
      continue
    parts = [f'tx {span(r["tx_rounds"], _fmt)}']
    if r.get('peer_rounds'):
      parts.append(f'peer {span(r["peer_rounds"], _fmt)}')
    if r.get('ratio_rounds'):
      parts.append(f'tx/peer {span(r["ratio_rounds"], lambda x: f"{x:.2f}")}x')
    if r.get('ratio_interval'):
      parts.append(f'geometric mean {_interval(r["ratio_interval"])}')
    if r.get('order_intervals'):
      parts.append('; '.join(f'{side} first {_interval(i)}'
                             for side, i in r['order_intervals'].items()))
      parts.append(f'order effect (tx first / peer first) {_interval(r["order_effect"], 1.0)}')
    lines.append(f'{r["case"]} {r["metric"]}: ' + ', '.join(parts))
  return lines


def _target_value(value: float, bound: float) -> str:
  """A target's value to two decimals (a ratio: 1.00, not 1), or to as many more as it takes
  not to print a value that missed its bound as the bound itself (0.347 against 0.35)."""
  digits = 2
  while digits < 6 and value != bound and f'{value:.{digits}f}' == f'{bound:.{digits}f}':
    digits += 1
  return f'{value:.{digits}f}'


def _interval(interval: list[float], bound: float | None = None) -> str:
  """'0.95x (95 % interval 0.91-0.99x)' from [geometric mean, low, high], with where the
  interval lies against `bound` when given (', all below 1.0')."""
  center, low, high = interval
  where = ''
  if bound is not None:
    where = (', all above ' if low > bound else ', all below ' if high < bound
             else ', either side of ') + f'{bound}'
  return f'{center:.2f}x (95 % interval {low:.2f}-{high:.2f}x{where})'


def _share(ours: float, theirs: float, gap: float) -> str:
  """How much of the gap between the two steps (tx's - the peer's, seconds) a part that
  takes `ours` in tx and `theirs` in torch explains."""
  if gap <= 0:
    return f'tx\'s step is {_secs(-gap)} faster'
  if ours > theirs:
    return f'{_secs(ours - theirs)} of the {_secs(gap)} by which tx\'s step is slower'
  return (f'tx\'s {_secs(theirs - ours)} faster, so the {_secs(gap)} by which its step is '
          f'slower lies elsewhere')


def step_attention_seconds(doc: dict, case: str, dtype: str):
  """(tx, torch) seconds of `case`'s self-attention forward and backward, timed alone per
  layer, times its layers; None where either side was not timed."""
  shape = doc.get('step_attention', {}).get(case)
  sides = doc.get('attention', {})
  per_layer = [sides.get(side, {}).get(case, {}).get(dtype) for side in ('tx', 'peer')]
  if not shape or None in per_layer:
    return None
  return tuple(s * shape[-1] for s in per_layer)


def attention_lines(doc: dict) -> list[str]:
  """One line per case whose self-attention was timed alone: milliseconds of one layer's
  forward and backward per dtype, tx / torch, and tx's time over torch's."""
  return _side_by_side(doc, 'attention', lambda s: f'{s * 1e3:.1f}',
                       lambda ours, peer: f'{ours / peer:.2f}x the time')


def _secs(s: float) -> str:
  return f'{s:.2f} s' if abs(s) >= 1 else f'{s * 1e3:.1f} ms'


_TORCH_GEMM_NOTE = " (tx's step runs torch's GEMM)"
_WIDENED_NOTE = ' in float32, {:.0f} GFLOP/s (model.matmul_impl=torch_float32)'
_TUNED_XLA = 'tuned XLA'  # XLA's GEMMs under the flags of `tx tune`'s choice


def tuned_rates(case_doc: dict, dtype: str) -> tuple[float, dict] | None:
  """(the ceiling, {product label: {dtype: FLOP/s}}) of XLA's GEMMs under the XLA flags of
  `tx tune`'s choice for this case's step, timed alone by `tx bench --tune`
  (`suite._time_under_tuned_flags`); None where the choice set no flags. The ceiling is the
  fastest of the n^3 product and the step's own products: under oneDNN's dot fusion the n^3
  product ran slower than the step's own (benchmarks/NOTES.md, attempts 101 and 103), so
  alone it is no ceiling (as `tx_side._own_ceiling` for MFU)."""
  tuned = case_doc.get('tuned') or {}
  square, gemms = (tuned.get('ceiling') or {}).get(dtype), tuned.get('gemms') or {}
  if not square:
    return None
  return max([square] + [r[dtype] for r in gemms.values() if r.get(dtype)]), gemms


def bound_rates(doc: dict, case_doc: dict, side: str, tuned: bool) -> dict:
  """{product label: {dtype: FLOP/s}} the finer 1.5x bound takes for `side` ('tx', 'peer'), or
  under `tx tune`'s flags where `tuned`: each product's fastest timed sample ('gemms_best'), as
  a bound on the time the kernels need holds only at their best rate (the host's speed moves
  by a fifth within minutes: a median timed at a slow moment would rule out what the step
  can do); the medians where no best was recorded (a JSON from before it was)."""
  if tuned:
    timed = case_doc.get('tuned') or {}
    return timed.get('gemms_best') or timed.get('gemms') or {}
  return (doc.get('gemms_best') or {}).get(side) or doc.get('gemms', {}).get(side, {})


def runs_torch_gemm(case_doc: dict) -> bool:
  """Whether tx's training step in this case ran its dense products in torch's GEMM: the
  case's spec or `tx tune`'s choice (under 'tuned') set model.matmul_impl=torch or
  torch_float32."""
  return _runs_torch(case_doc, 'matmul_impl')


def runs_torch_float32_gemm(case_doc: dict) -> bool:
  """Whether tx's step ran its dense products in torch's float32 GEMM on widened bf16 / f16
  operands (model.matmul_impl=torch_float32, in the case's spec or `tx tune`'s choice)."""
  return _setting(case_doc, 'matmul_impl') == 'torch_float32'


def runs_torch_attention(case_doc: dict) -> bool:
  """Whether tx's training step in this case ran torch's attention kernel: the case's spec
  or `tx tune`'s choice set model.attention_impl=torch."""
  return _runs_torch(case_doc, 'attention_impl')


def _runs_torch(case_doc: dict, key: str) -> bool:
  return (_setting(case_doc, key) or '').startswith('torch')


def _setting(case_doc: dict, key: str) -> str | None:
  """A model setting of tx's step: `tx tune`'s choice where it set `key`, else the spec's."""
  tuned = (case_doc.get('tuned') or {}).get('model_overrides') or {}
  return tuned.get(key) or case_doc.get('spec', {}).get(key)


def step_gemm_seconds(doc: dict, case: str, dtype: str, side: str = 'tx',
                      rates: dict | None = None):
  """(seconds, FLOPs) of `case`'s training-step products at the rates measured on `side`
  ('tx': XLA's, 'peer': torch's; as `step_gemms` lists them), or at `rates` ({label: {dtype:
  FLOP/s}}, e.g. from `tuned_rates`), or None where not all of them were timed."""
  products = doc.get('step_gemms', {}).get(case)
  rates = doc.get('gemms', {}).get(side, {}) if rates is None else rates
  if not products:
    return None
  seconds = flops = 0.0
  for label, m, k, n, count in products:
    rate = rates.get(f'{case}: {label}', {}).get(dtype)
    if not rate:
      return None
    product = count * 2 * m * k * n
    seconds, flops = seconds + product / rate, flops + product
  return seconds, flops


def gemm_lines(doc: dict) -> list[str]:
  """One line per product of the step timed alone: GFLOP/s of XLA and of torch per dtype,
  and XLA / torch (where the GEMM kernels, not the rest of the step, decide a ratio)."""
  return _side_by_side(doc, 'gemms', lambda rate: f'{rate / 1e9:.0f}',
                       lambda ours, peer: f'{ours / peer:.2f}x')


def _side_by_side(doc: dict, key: str, show, compare) -> list[str]:
  """'label: dtype tx / torch (compare), ...' per label of doc[key]['tx'] (tx's value alone
  where torch's is missing)."""
  ours, theirs = doc.get(key, {}).get('tx', {}), doc.get(key, {}).get('peer', {})
  lines = []
  for label, values in ours.items():
    parts = []
    for dtype, value in values.items():
      peer = theirs.get(label, {}).get(dtype)
      parts.append(f'{dtype} {show(value)}' + (
          f' / {show(peer)} ({compare(value, peer)})' if peer else ''))
    lines.append(f'{label}: ' + ', '.join(parts))
  return lines


def _fmt(x) -> str:
  if x is None:
    return '-'
  if abs(x) >= 100:
    return f'{x:,.0f}'
  return f'{x:.3g}' if abs(x) < 10 else f'{x:.1f}'


def tuned_lines(doc: dict) -> list[str]:
  """'case: choice (its settings; x.xx the defaults' step)' for each case measured with
  `tx bench --tune`."""
  out = []
  for name, case in doc['cases'].items():
    t = case.get('tuned')
    if not t:
      continue
    settings = ([t['xla_flags']] if t.get('xla_flags') else []) + [
        f'model.{k}={v}' for k, v in (t.get('model_overrides') or {}).items()] + [
            f'train.{k}={v}' for k, v in (t.get('train_overrides') or {}).items()]
    timings = t.get('timings') or {}
    gain = (f'; {timings["default"] / timings[t["choice"]]:.2f}x the defaults\' step in the tune'
            if timings.get('default') and timings.get(t['choice']) else '')
    out.append(f'{name}: {t["choice"]} ({", ".join(settings) or "XLA defaults"}{gain})')
  return out


def table(doc: dict) -> str:
  """The human-readable report: machine and host, ceilings, one line per row, then the targets."""
  m, c = doc['machine'], doc['ceiling']
  gpu = m.get('measured_on') == 'gpu'
  lines = [f'tx bench: {m["processor"] or m["platform"]}, {m["cpu_count"]} CPUs, '
           f'{m["threads"]} threads, jax {m["jax"]}' + (f', torch {m["torch"]}' if 'torch' in m
                                                        else ''),
           f'matmul ceiling: {c["float32"] / 1e9:.1f} GFLOP/s float32, '
           f'{c["bfloat16"] / 1e9:.1f} GFLOP/s bf16 (max of start / end medians)',
           *(["training peers: forward and loss through torch.compile"]
             if m.get('peer_compile') else []),
           *([f'measured on the GPU: {m.get("device")} (float32 products in TF32 on both '
              'sides)' + (f'; datasheet peaks {gpu_peak(doc)["bfloat16"] / 1e12:.0f} TFLOP/s '
                          f'bf16, {gpu_peak(doc)["float32"] / 1e12:.0f} TF32'
                          if gpu_peak(doc) else '')] if gpu else []),
           f'GLIBC_TUNABLES for every measurement: {m.get("glibc_tunables") or "(unset)"}']
  if m.get('host'):
    lines += host.summary(m['host']).splitlines()
  lines.append('')
  header = f'{"case":<22} {"metric":<24} {"tx":>10} {"peer":>10} {"tx/peer":>8}'
  lines += [header, '-' * len(header)]
  for r in doc['rows']:
    ratio = '-' if r['ratio'] is None else f'{r["ratio"]:.2f}x'
    lines.append(f'{r["case"]:<22} {r["metric"]:<24} {_fmt(r["tx"]):>10} '
                 f'{_fmt(r["peer"]):>10} {ratio:>8}')
  for name, case in doc['cases'].items():
    if 'error' in case:
      lines.append(f'{name:<22} FAILED: {case["error"]}')
    for why in (case.get('peer_skipped'), case.get('skipped')):
      if why:
        lines.append(f'{name:<22} {why}')
  tuned = tuned_lines(doc)
  if tuned:
    lines += ['', "tx's side trained with `tx tune`'s choice for each step on this host:"] + [
        f'  {t}' for t in tuned]
  spread = rounds_lines(doc)
  if spread:
    turn = {'alternate': 'tx and the peer in turn, each first in every second round',
            'tx-first': 'tx then the peer'}.get(doc.get('order'), 'tx then the peer')  # older
    # runs recorded no order: they ran tx first in every round
    lines += ['', f'Over {doc.get("rounds") or "several"} rounds, {turn} (the rows above give '
              'each side\'s median run), lowest-highest:'] + [
                  f'  {s}' for s in spread]
  gemms = gemm_lines(doc)
  if gemms:
    # tx's operand layouts, not the peers' (nn.Linear, Conv1D): torch.mm ran both within 1-4 %
    # on the AVX2 host (benchmarks/gemm_layouts.py, NOTES attempt 105)
    lines += ['', 'GEMMs of the training steps timed alone, GFLOP/s (XLA under the run\'s '
              "XLA_FLAGS / torch.mm, both at tx's operand layouts):"] + [f'  {g}' for g in gemms]
  attention = attention_lines(doc)
  if attention:
    lines += ['', 'Self-attention of one layer, forward + backward timed alone, ms (tx\'s XLA '
              'path / torch\'s scaled_dot_product_attention):'] + [f'  {a}' for a in attention]
  arithmetic = [] if gpu else ceiling_arithmetic(doc)  # the arithmetic of the CPU targets
  if arithmetic:
    lines += ['', 'GEMM ceilings and the 1.5x target:'] + [f'  {a}' for a in arithmetic]
  lines += ['', 'targets:']
  if gpu:
    lines.append("  none judged: issue 9's and 24's targets are CPU targets")
  for t in doc['targets']:
    status = {True: 'met', False: 'MISSED', None: 'not judged' if t.get('note')
              else 'not measured'}[t['met']]
    sign = '>=' if t['kind'] == 'min' else '<='
    held = f', held in {t["rounds_met"]} of {t["rounds"]} rounds' if t.get('rounds') else ''
    if t.get('interval'):
      held += f'; geometric mean {_interval(t["interval"], t["bound"])}'
    value = '-' if t['value'] is None else _target_value(t['value'], t['bound'])
    lines.append(f'  {status:<12} {t["target"]}: {value} ({sign} {t["bound"]}'
                 f'{held})' + (f' [{t["note"]}]' if t.get('note') else ''))
  return '\n'.join(lines)
