"""Throughput of tx.data pipelines (single process, in-process loading) on the shared data.

    python benchmarks/data_pipeline.py  # raw data from $TX_RAW_DATA or ../shared/data
    python benchmarks/data_pipeline.py --seconds 5 --data-dir /tmp/tx_data

For each case: build time (tokenizer + tokenized arrays come from the cache after the
first run), then `--warmup` batches, then batches for `--seconds`; prints batches/s,
slot tokens/s (B x L per batch, all keys of one side) and real tokens/s (weight > 0).
The experiments' batch shapes: char LM 12x64 (nanoGPT shakespeare_char on CPU), MLM
32x128, translation 64 pairs of 64 + 64 tokens with a bpe-8000 vocabulary.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from tx.config import DataConfig
from tx.data.pipeline import make_pipeline

ROOT = Path(__file__).resolve().parents[1]

# name, dataset, objective, batch size, train, config overrides
CASES = [
    ('causal_lm char windows', 'tinyshakespeare', 'causal_lm', 12, True,
     dict(tokenizer='char', seq_len=64)),
    ('causal_lm char windows (eval)', 'tinyshakespeare', 'causal_lm', 12, False,
     dict(tokenizer='char', seq_len=64)),
    ('mlm char windows', 'tinyshakespeare', 'mlm', 32, True, dict(tokenizer='char', seq_len=128)),
    ('seq2seq bpe-8000', 'multi30k', 'seq2seq', 64, True,
     dict(tokenizer='bpe', vocab_size=8000, seq_len=64, target_len=64)),
    ('seq2seq bpe-8000 packed', 'multi30k', 'seq2seq', 64, True,
     dict(tokenizer='bpe', vocab_size=8000, seq_len=64, target_len=64, packing=True)),
    ('seq2seq bpe-8000 (eval)', 'multi30k', 'seq2seq', 64, False,
     dict(tokenizer='bpe', vocab_size=8000, seq_len=64, target_len=64)),
]


def measure(pipe, *, warmup: int, seconds: float) -> dict[str, float]:
  """Batches/s and tokens/s of `pipe.iterator()` (eval pipelines restart when exhausted)."""
  it = pipe.iterator()

  def step():
    nonlocal it
    try:
      return next(it)
    except StopIteration:
      it = pipe.iterator()
      return next(it)

  for _ in range(warmup):
    step()
  n, slots, real = 0, 0, 0.0
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = step()
    n += 1
    slots += batch['targets'].size + (batch['src'].size if 'src' in batch else 0)
    real += float(batch['weights'].sum())
  elapsed = time.perf_counter() - start
  return {'batches/s': n / elapsed, 'tokens/s': slots / elapsed, 'real tokens/s': real / elapsed}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  default_raw = os.environ.get('TX_RAW_DATA') or str(ROOT.parent / 'shared' / 'data')
  parser.add_argument('--raw-dir', default=default_raw,
                      help='folder with tinyshakespeare/, multi30k/')
  parser.add_argument('--data-dir', default=None, help='prepared-data cache (default: TFDS dir)')
  parser.add_argument('--seconds', type=float, default=3.0, help='timed seconds per case')
  parser.add_argument('--warmup', type=int, default=20, help='untimed batches per case')
  args = parser.parse_args()
  logging.getLogger('absl').setLevel(logging.ERROR)

  rows = []
  for name, dataset, objective, batch_size, train, overrides in CASES:
    cfg = DataConfig(dataset=dataset, raw_dir=args.raw_dir, data_dir=args.data_dir,
                     source_lang='de', target_lang='en', **overrides)
    start = time.perf_counter()
    pipe = make_pipeline(cfg, objective, 'train' if train else 'validation',
                         batch_size=batch_size, seed=0, train=train)
    build = time.perf_counter() - start
    shape = 'x'.join(map(str, pipe.batch_spec()['targets'][0]))
    if 'src' in pipe.batch_spec():
      shape += f" (+src {pipe.batch_spec()['src'][0][1]})"
    result = measure(pipe, warmup=args.warmup, seconds=args.seconds)
    rows.append((name, shape, build, result))
    print(f'  done: {name}', flush=True)

  header = f"{'case':32s} {'batch':20s} {'build s':>8s} {'batches/s':>10s} {'tokens/s':>11s} " \
           f"{'real tok/s':>11s}"
  print()
  print(header)
  print('-' * len(header))
  for name, shape, build, r in rows:
    print(f"{name:32s} {shape:20s} {build:8.2f} {r['batches/s']:10.0f} {r['tokens/s']:11.0f} "
          f"{r['real tokens/s']:11.0f}")


if __name__ == '__main__':
  main()
