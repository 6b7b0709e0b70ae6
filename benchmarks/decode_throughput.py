"""Decode throughput (new tokens/s) with the KV cache and without it (full recompute).

    python benchmarks/decode_throughput.py          # batch 1 and 8, 256 new tokens; JSON in $TMPDIR
    python benchmarks/decode_throughput.py --batches 1 --new 64 --json /tmp/decode.json

The model is nanoGPT's GPU shakespeare_char shape (decoder-only, 6 layers, 6 heads,
d 384, d_ff 1536, learned positions, context 512 so 16 + 256 positions fit) with random
weights and a 65-symbol vocabulary; greedy decoding of 256 tokens after a 16-token prompt
(EOS disabled, so every run decodes exactly 256 tokens).

  cached    tx.decode.generate_lm: one prefill, then one token per step against the cache
  uncached  tx.decode.reference.generate_lm_uncached: the whole network rerun over a
            fixed [B, 16 + 256] buffer at every step (one compile; the attention over the
            not-yet-decoded padding is still computed, as a fixed-shape baseline must)

Compile time is excluded (a warm-up call with the same shapes); each case is then timed
`--repeats` times and the best run is reported (other processes share the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import tx
from tx.decode.generate import generate_lm
from tx.decode.reference import generate_lm_uncached


def model_config(vocab: int) -> tx.ModelConfig:
  return tx.ModelConfig(family='decoder', vocab_size=vocab, d_model=384, num_heads=6, d_ff=1536,
                        num_layers=6, max_len=512, position='learned', norm='layernorm',
                        ffn='gelu', use_bias=False, tie_embeddings=True)


def random_params(cfg: tx.ModelConfig, prompt_len: int):
  model = tx.build_model(cfg)
  init = jax.jit(lambda k: model.init(k, jnp.ones((1, prompt_len), jnp.int32))['params'])
  return nn.unbox(init(jax.random.key(0)))


def time_call(fn, repeats: int) -> tuple[float, float]:
  """(compile + first run seconds, best of `repeats` seconds)."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return first, best


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--batches', default='1,8', help='batch sizes, comma-separated')
  p.add_argument('--prompt', type=int, default=16, help='prompt tokens')
  p.add_argument('--new', type=int, default=256, help='new tokens per sequence')
  p.add_argument('--vocab', type=int, default=65)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--json', default=os.path.join(tempfile.gettempdir(), 'tx_decode_throughput.json'),
                 help='where to write the results')
  args = p.parse_args(argv)

  cfg = model_config(args.vocab)
  params = random_params(cfg, args.prompt)
  n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
  rows = []
  for batch in [int(b) for b in args.batches.split(',')]:
    prompt = jnp.asarray(np.random.default_rng(batch).integers(5, args.vocab, (batch, args.prompt)),
                         jnp.int32)
    for name, fn in (('cached', generate_lm), ('uncached', generate_lm_uncached)):
      call = lambda fn=fn: fn(cfg, params, prompt, jax.random.key(0), max_new=args.new, eos_id=-1)
      first, best = time_call(call, args.repeats)
      rows.append({'mode': name, 'batch': batch, 'new_tokens': args.new,
                   'seconds': best, 'tokens_per_s': batch * args.new / best,
                   'ms_per_step': 1000 * best / args.new, 'compile_and_first_s': first})
      print(f'{name:>8}  batch {batch}: {rows[-1]["tokens_per_s"]:8.1f} tokens/s', flush=True)
  for batch in sorted({r['batch'] for r in rows}):
    by = {r['mode']: r for r in rows if r['batch'] == batch}
    by['cached']['speedup'] = by['uncached']['seconds'] / by['cached']['seconds']

  print(f'\ndecoder-only 6L/6H/d384, {n_params / 1e6:.1f}M params, vocab {args.vocab}, '
        f'prompt {args.prompt}, {args.new} new tokens, greedy, {jax.devices()[0].platform}, '
        f'best of {args.repeats}')
  header = ('mode', 'batch', 'tokens/s', 'ms/step', 'speedup', 'compile+1st s')
  print(' '.join(f'{h:>{w}}' for h, w in zip(header, (8, 5, 10, 9, 8, 14))))
  for r in rows:
    speedup = f'{r["speedup"]:.1f}x' if 'speedup' in r else ''
    print(f'{r["mode"]:>8} {r["batch"]:>5} {r["tokens_per_s"]:>10.1f} {r["ms_per_step"]:>9.2f} '
          f'{speedup:>8} {r["compile_and_first_s"]:>14.1f}')
  meta = {'model': '6 layers, 6 heads, d 384, d_ff 1536, learned positions', 'params': n_params,
          'vocab': args.vocab, 'prompt': args.prompt, 'new_tokens': args.new,
          'platform': jax.devices()[0].platform, 'device': str(jax.devices()[0]),
          'cpu_count': os.cpu_count(), 'repeats': args.repeats}
  with open(args.json, 'w') as f:
    json.dump({'config': meta, 'results': rows}, f, indent=2)
  print(f'wrote {args.json}')
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
