"""How to time a small operation: shared by tx's and the PyTorch peer's timings of GEMMs and
attention (tx.train.flops, tx.bench.tx_side, tx.bench.torch_peers,
benchmarks/gpu_attention.py), so both sides time the same way. No JAX here: the peer's
measuring process imports this module without it."""

import os
import statistics
import time


def calls_per_sample(one_call_s: float, sample_s: float = 0.02) -> int:
  """How many back-to-back calls make a timed sample of about `sample_s` seconds (at least 1,
  at most 1,000), given one call's time: one for an n^3 ceiling, hundreds for a small
  product whose single call would time mostly its dispatch and synchronisation."""
  return max(1, min(1000, int(sample_s / max(one_call_s, 1e-7))))


def sample_seconds(call, wait, reps: int) -> list[float]:
  """Seconds per call of `reps` timed samples of call(): one untimed call (compilation,
  allocation), one timed call that sizes the samples (`calls_per_sample`), then `reps`
  samples of that many back-to-back calls, each sample ended by wait(the last result) so
  that work still running on a device (or in XLA's async dispatch) is counted.

  call: () -> result; wait: result -> anything (jax.block_until_ready, a CUDA synchronize,
  or a no-op for synchronous code)."""
  wait(call())
  start = time.perf_counter()
  wait(call())
  calls = calls_per_sample(time.perf_counter() - start)
  samples = []
  for _ in range(reps):
    start = time.perf_counter()
    for _ in range(calls):
      result = call()
    wait(result)
    samples.append((time.perf_counter() - start) / calls)
  return samples


def median_and_best(samples: dict) -> tuple[dict, dict]:
  """({label: {dtype: median}}, {label: {dtype: max}}) of {label: {dtype: [FLOP/s samples]}}:
  the medians compare two kernels; the fastest sample bounds the time a product needs."""
  pick = lambda f: {label: {d: f(r) for d, r in by_dtype.items()}
                    for label, by_dtype in samples.items()}
  return pick(statistics.median), pick(max)


def process_usage() -> dict[str, float]:
  """This process's CPU time and minor page faults so far, all threads (getrusage):
  {'user_s', 'system_s', 'minor_faults'}."""
  import resource  # pylint: disable=g-import-not-at-top  (Unix only; only the bench calls this)
  r = resource.getrusage(resource.RUSAGE_SELF)
  return {'user_s': r.ru_utime, 'system_s': r.ru_stime, 'minor_faults': float(r.ru_minflt)}


def usage_per_step(before: dict[str, float], after: dict[str, float],
                   steps: int) -> dict[str, float]:
  """Per-step CPU time and faults between two `process_usage()` snapshots taken around
  `steps` steps: {'user_s_per_step', 'system_s_per_step', 'minor_faults_per_step'}. System
  time is where memory the step maps afresh is faulted in and zeroed by the kernel
  (benchmarks/NOTES.md, attempts 24 and 44)."""
  return {f'{key}_per_step': (after[key] - before[key]) / max(steps, 1) for key in before}


def resident_bytes() -> int:
  """This process's resident memory now (Linux: /proc/self/statm; elsewhere the peak)."""
  try:
    with open('/proc/self/statm', encoding='ascii') as f:
      return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
  except OSError:
    import resource  # pylint: disable=g-import-not-at-top  (Unix only)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def warm_until_steady(call, most: int = 6, flat: int = 2, resident=resident_bytes,
                      tolerance: float = 0.02, least: int = 0) -> int:
  """Runs `call()` (one blocking training call or step) at least `least` times, then until the
  process's resident memory has not grown by more than `tolerance` over `flat` calls in a
  row, or `most` calls ran; returns how many ran. XLA:CPU's scratch buffer can land at new
  addresses in a step's first calls (bert_6l's 0.8 GB one, three times on the Intel AMX host:
  benchmarks/NOTES.md, attempt 115), and the first touch of that memory is page faults and
  system time, in huge pages few faults but much time, which the steps after it do not pay.
  `tx bench` warms both sides so (a case's `warmup` calls as `least`): it times the steady
  state."""
  before, still, n = resident(), 0, 0
  while n < least or (n < most and still < flat):
    call()
    n += 1
    now = resident()
    still = still + 1 if now <= before * (1 + tolerance) else 0
    before = max(before, now)
  return n
