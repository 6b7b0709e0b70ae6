"""Sliding-window decoding: KV-cache bytes per generated token and decode tokens/s, local vs global.

    nice -n 19 python benchmarks/window_decode.py                # 2,048 new tokens, window 256
    python benchmarks/window_decode.py --new 512 --window 64 --repeats 1

A small decoder (4 layers, d 128, 4 heads, d_ff 512, RoPE, vocabulary 256, random
weights) generates `--new` tokens greedily after a 16-token prompt (EOS disabled, batch
`--batch`), three ways in one process, each timed alternately so the machine's load hits
them alike:

  global      model.attention_window=0: every layer caches every token
  local       model.attention_window=W: every layer keeps a ring of W slots
  local,global  the Gemma-2 pattern (half the layers local)

Cache bytes come from the allocated cache shapes (`jax.eval_shape`, nothing run): per
layer kind, the bytes at the full length and the marginal bytes of one more generated
token (a local layer: 0 once the length passes the window). Compile time is excluded
(a warm-up call); the best of `--repeats` runs is reported. The CPU is printed beside.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import tx
from tx.decode.generate import generate_lm
from tx.decode.steps import empty_cache


def model_config(window: int, pattern: str = 'local', max_len: int = 4096) -> tx.ModelConfig:
  return tx.ModelConfig(family='decoder', vocab_size=256, d_model=128, num_heads=4, d_ff=512,
                        num_layers=4, max_len=max_len, position='rope', norm='rmsnorm',
                        ffn='swiglu', use_bias=False, attention_window=window,
                        attention_pattern=pattern if window else 'local')


def cache_bytes(cfg: tx.ModelConfig, batch: int, length: int) -> dict[str, int]:
  """{'tower': bytes of the index / validity / positions, 'layer_i': bytes of its keys and
  values} of the cache allocated for `length` slots."""
  model = tx.build_model(cfg, decode=True)
  shapes = jax.eval_shape(lambda: empty_cache(model, jnp.zeros((batch, length), jnp.int32)))
  out: dict[str, int] = {}
  for path, s in jax.tree_util.tree_leaves_with_path(shapes):
    keys = [str(getattr(k, 'key', k)) for k in path]
    name = next((k for k in keys if k.startswith('layer_')), 'tower')
    out[name] = out.get(name, 0) + int(np.prod(s.shape)) * jnp.dtype(s.dtype).itemsize
  return out


def cpu_name() -> str:
  try:
    text = subprocess.run(['lscpu'], capture_output=True, text=True, check=False).stdout
  except OSError:
    return 'unknown'
  return next((line.split(':', 1)[1].strip() for line in text.splitlines()
               if line.startswith('Model name')), 'unknown')


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--window', type=int, default=256)
  p.add_argument('--new', type=int, default=2048, help='new tokens per sequence')
  p.add_argument('--prompt', type=int, default=16)
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--json', default=os.path.join(tempfile.gettempdir(), 'tx_window_decode.json'))
  args = p.parse_args(argv)

  total = args.prompt + args.new
  cases = {'global': model_config(0), 'local': model_config(args.window),
           'local,global': model_config(args.window, 'local,global')}
  base = cases['global']
  params = nn.unbox(jax.jit(lambda k: tx.build_model(base).init(
      k, jnp.ones((1, args.prompt), jnp.int32))['params'])(jax.random.key(0)))
  prompt = jnp.asarray(np.random.default_rng(0).integers(5, 256, (args.batch, args.prompt)),
                       jnp.int32)

  report = {'cpu': cpu_name(), 'window': args.window, 'new_tokens': args.new,
            'batch': args.batch, 'cache': {}, 'tokens_per_s': {}}
  for name, cfg in cases.items():
    full, more = cache_bytes(cfg, args.batch, total), cache_bytes(cfg, args.batch, total + 1)
    report['cache'][name] = {
        'total_bytes': sum(full.values()),
        'per_layer_bytes': {k: v for k, v in full.items() if k != 'tower'},
        'tower_bytes': full['tower'],
        'bytes_per_extra_token': {k: more[k] - full[k] for k in full}}

  runs = {name: jax.jit(lambda p, x, cfg=cfg: generate_lm(
      cfg, p, x, jax.random.key(0), max_new=args.new, eos_id=-1)) for name, cfg in cases.items()}
  for name, run in runs.items():  # compile + warm-up
    start = time.perf_counter()
    jax.block_until_ready(run(params, prompt))
    print(f'{name}: compile + first run {time.perf_counter() - start:.1f} s', flush=True)
  best = {name: float('inf') for name in runs}
  for _ in range(args.repeats):  # alternate, so load changes hit every case alike
    for name, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run(params, prompt))
      best[name] = min(best[name], time.perf_counter() - start)
  for name, seconds in best.items():
    report['tokens_per_s'][name] = args.batch * args.new / seconds
  report['speedup_local_vs_global'] = best['global'] / best['local']
  report['speedup_local_global_vs_global'] = best['global'] / best['local,global']
  report['cache_ratio_local_vs_global'] = (report['cache']['local']['total_bytes']
                                           / report['cache']['global']['total_bytes'])
  print(json.dumps(report, indent=1))
  with open(args.json, 'w') as f:
    json.dump(report, f, indent=1)
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
