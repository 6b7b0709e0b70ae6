"""Where a cached decoding step spends its time, by HLO op, and what each product costs.

  python benchmarks/decode_profile.py [--batch 8] [--new 256] [--top 24]

`tx bench --profile` profiles training steps; this does the same for `tx bench`'s gpt_6l
decoding case (greedy, a 16-token prompt, `--new` tokens, EOS off): the compiled
`generate_lm` is timed over 5 calls, then one call runs under `jax.profiler.trace`. The
thunks are matched with their optimized-HLO instruction and grouped by what they compute
(the op_name with the layer index folded, or the opcode), in microseconds per token step
(all threads), with each group's calls per token step. The busiest products are then listed
one by one (microseconds per call), which is how benchmarks/NOTES.md attempt 81 found the
decoding step's products running at one core's speed.

Run it alone on an idle host, pinned to as many CPUs as tx's bench uses (`taskset -c 0,1`).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tx.bench import cases, tx_side
from tx.decode.generate import generate_lm
from tx.models.build import build_model

_INSTRUCTION = re.compile(r'\s*(?:ROOT )?%?([\w.\-]+) = (.*)')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def compiled_decoding(batch: int, new: int):
  """(compiled generate_lm, its arguments): gpt_6l's decoding case at `batch` rows."""
  spec = dict(next(c.spec for c in cases.SUITE if c.name == 'gpt_6l'), batch=batch, new=new)
  cfg = tx_side.model_config(dict(spec, max_len=spec['prompt_len'] + new + 1, scan=False,
                                  remat='none'))
  rng = np.random.default_rng(batch)
  prompt = jnp.asarray(rng.integers(3, spec['vocab'], (batch, spec['prompt_len'])), jnp.int32)
  params = nn.unbox(jax.jit(build_model(cfg).init)(jax.random.key(0), prompt)['params'])
  args = (params, prompt, jax.random.key(0))
  compiled = generate_lm.lower(cfg, *args, max_new=new, eos_id=-1).compile()
  return compiled, args


def instructions(hlo: str) -> dict[str, tuple[str, str]]:
  """{instruction name: (its result shape and opcode text, its op_name)} of an HLO module."""
  out = {}
  for line in hlo.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      op_name = _OP_NAME.search(line)
      out[match.group(1)] = (match.group(2), op_name.group(1) if op_name else '')
  return out


def traced_call(call) -> list[dict]:
  """The complete ('X') events of one profiled call."""
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder):
      jax.block_until_ready(call())
    path = sorted(glob.glob(f'{folder}/**/*.trace.json.gz', recursive=True))[-1]
    with gzip.open(path) as f:
      return [e for e in json.load(f)['traceEvents'] if e.get('ph') == 'X']


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
  p.add_argument('--batch', type=int, default=8)
  p.add_argument('--new', type=int, default=256)
  p.add_argument('--top', type=int, default=24)
  args = p.parse_args()
  compiled, inputs = compiled_decoding(args.batch, args.new)
  call = lambda: compiled(*inputs)
  jax.block_until_ready(call())
  times = []
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  print(f'batch {args.batch}: {args.batch * args.new / min(times):,.0f} new tokens/s (best of 5),'
        f' {min(times) / args.new * 1e3:.3f} ms a token step')
  known = instructions(compiled.as_text())
  per_op, calls, per_thread = collections.Counter(), collections.Counter(), collections.Counter()
  for e in traced_call(call):
    if e['name'] in known:
      per_op[e['name']] += e['dur']
      calls[e['name']] += 1
      per_thread[e['tid']] += e['dur']
  steps = args.new
  print('profiled: thread-ms a token step per thread',
        sorted((round(v / steps / 1e3, 3) for v in per_thread.values()), reverse=True))
  groups, group_calls = collections.Counter(), collections.Counter()
  for name, us in per_op.items():
    text, op_name = known[name]
    shape = text.split(' ')[0]
    what = re.sub(r'^.*?stack/', '', re.sub(r'layer_\d+', 'L', op_name)) or text.split('(')[0]
    groups[(what, shape)] += us
    group_calls[(what, shape)] += calls[name]
  print('\n  us a token step   calls a step   result            what')
  for (what, shape), us in groups.most_common(args.top):
    print(f'  {us / steps:15.1f}   {group_calls[(what, shape)] / steps:12.1f}   {shape:17s} {what}')
  products = [(n, us / calls[n]) for n, us in per_op.items() if ' dot(' in known[n][0]
              or 'dot_general' in known[n][1]]
  print('\n  the costliest products, us a call:')
  for name, us in sorted(products, key=lambda x: -x[1] * calls[x[0]])[:8]:
    print(f'  {us:8.1f}  x{calls[name]:<5d} {known[name][0][:60]}')


if __name__ == '__main__':
  main()
