"""Variants of a `tx bench` case's training step, compiled in ONE process and timed in turn.

  python benchmarks/step_ab.py bert_6l_torch_kernels_4_per_call \
      --variant base '{}' --variant norms '{"norm_impl": "torch"}' --variant base_again '{}'

The project's hosts move by up to a third between processes minutes apart
(benchmarks/NOTES.md, attempt 52), more than most settings are worth, so a comparison of
two processes says little. Here every variant (the case's spec with some keys set
otherwise: any key `tx.bench.tx_side` reads, e.g. attention_impl, matmul_impl, norm_impl,
steps_per_call, or xla_options: XLA debug options for that variant's compile alone, so
flags too can be compared in one process, e.g. '{"xla_options": {"xla_cpu_use_onednn": true}}')
is compiled in this one process, warmed up, and then one call of each is
timed in turn, `--rounds` times, the order reversed every other round. Printed per variant:
the median and fastest seconds a step, every call's, and the median against the first
variant's. Name one variant twice (as above) for an A/A control: the spread of a ratio
that should be 1.000 is this run's noise. Run it under tx's glibc tunables
(`GLIBC_TUNABLES` from tx/malloc_tuning.py: `tx bench` sets them for its measurements).

Calls in turn favour the variant whose memory survives the other's call: a step's first
call after another program's can pay for its scratch buffer again (gpt_6l_bf16 with XLA's
defaults: 3.35 s a step alone, 6.3 s between calls of the torch-kernel variant, which lost
nothing; benchmarks/NOTES.md attempt 76), and an A/A control does not show it. Compare
variants of one memory behaviour (the same kernels, code versions), or check a difference
with `--block K`: each variant's K calls in a row per round, the first untimed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('case', help='a case of `tx bench` (tx/bench/cases.py SUITE)')
  parser.add_argument('--variant', nargs=2, action='append', metavar=('NAME', 'JSON'),
                      required=True, help='a name and the spec keys it sets (JSON object)')
  parser.add_argument('--rounds', type=int, default=8)
  parser.add_argument('--warmup', type=int, default=2, help='untimed calls of each variant')
  parser.add_argument('--block', type=int, default=0, metavar='K',
                      help='per round, K timed calls of each variant in a row after one '
                           'untimed call (0: one timed call of each in turn)')
  args = parser.parse_args(argv)

  # after argparse: --help stays fast
  from tx.bench import cases  # pylint: disable=g-import-not-at-top
  if not any(c.name == args.case for c in cases.SUITE):
    parser.error(f'no case {args.case!r}; the cases: {", ".join(c.name for c in cases.SUITE)}')
  variants = [(name, json.loads(settings)) for name, settings in args.variant]
  times = time_variants(args.case, variants, args.rounds, args.warmup, args.block)
  print_variants(times)
  return 0


def time_variants(case: str, variants: list[tuple[str, dict]], rounds: int, warmup: int = 2,
                  block: int = 0) -> dict[str, list[float]]:
  """{name: seconds a step of each timed call} of `variants` ((name, the spec keys it sets)
  of bench case `case`), compiled in this process and timed in turn as the module docstring
  says: `rounds` rounds, the order reversed every other one; `block` > 0: that many timed
  calls of a variant in a row per round after one untimed."""
  import jax  # pylint: disable=g-import-not-at-top
  from tx.bench import cases, tx_side  # pylint: disable=g-import-not-at-top
  base = next(c.spec for c in cases.SUITE if c.name == case)
  compiled = {}
  for name, settings in variants:
    call, state, batch, cfg, _, _ = tx_side.compiled_train_step(dict(base, **settings))
    for _ in range(warmup):
      state, metrics = call(state, batch)
      jax.block_until_ready(metrics)
    compiled[name] = {'call': call, 'state': state, 'batch': batch,
                      'per_call': cfg.train.per_call, 'times': []}

  def timed_call(v) -> float:
    start = time.perf_counter()
    v['state'], metrics = v['call'](v['state'], v['batch'])
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / v['per_call']

  for r in range(rounds):
    for name in (list(compiled) if r % 2 == 0 else list(reversed(compiled))):
      v = compiled[name]
      if block:
        timed_call(v)  # the switch from the other variant's program: untimed
        v['times'] += [timed_call(v) for _ in range(block)]
      else:
        v['times'].append(timed_call(v))
  return {name: v['times'] for name, v in compiled.items()}


def print_variants(times: dict[str, list[float]]) -> None:
  """Per variant: the median and fastest ms a step, the median against the first's, every
  call's."""
  first = statistics.median(next(iter(times.values())))
  for name, t in times.items():
    median = statistics.median(t)
    print(f'{name:<16} {median * 1e3:8.1f} ms a step (fastest {min(t) * 1e3:.1f}), '
          f'{median / first:.3f}x the first; every call: ' + ' '.join(f'{x * 1e3:.0f}' for x in t))


if __name__ == '__main__':
  raise SystemExit(main())
