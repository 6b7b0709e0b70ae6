"""The decoding loop reads and updates the KV caches where they lie: XLA:CPU compiles no
copy of a layer's cache into the loop body (benchmarks/NOTES.md attempt 34: at batch 1
such copies took a fifth of every step of the 6-layer model)."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.decode.generate import generate_lm, generate_seq2seq

INPUT_LEN, MAX_NEW, HEAD_DIM = 5, 20, 8


def _loop_copies(cfg, batch):
  """(name, shape) of every copy, copy fusion and transpose in the compiled while-loop
  bodies of the family's generator that is as large as one layer's self-attention cache
  or cross-attention keys."""
  inputs = jnp.full((batch, INPUT_LEN), 7, jnp.int32)
  model = tx.build_model(cfg)
  init_args = (inputs, inputs[:, :1]) if cfg.family == 'encoder_decoder' else (inputs,)
  params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), *init_args)['params']))
  generate = generate_seq2seq if cfg.family == 'encoder_decoder' else generate_lm
  text = generate.lower(cfg, params, inputs, jax.random.key(0), max_new=MAX_NEW,
                        eos_id=-1).compile().as_text()
  rows = batch * (cfg.num_kv_heads or cfg.num_heads) * HEAD_DIM
  slots = MAX_NEW + (1 if cfg.family == 'encoder_decoder' else INPUT_LEN)
  sizes = {rows * slots, rows * INPUT_LEN}
  bodies = set(re.findall(r'body=%([\w.-]+)', text))
  found, computation = [], None
  for line in text.splitlines():
    if line and not line.startswith(' '):
      computation = re.match(r'(?:ENTRY )?%([\w.-]+)', line)
      computation = computation and computation.group(1)
    m = re.match(r'\s+%(\S*(?:copy|transpose)\S*) = f32\[([\d,]+)\]', line)
    if computation in bodies and m and np.prod([int(d) for d in m[2].split(',')]) in sizes:
      found.append((m[1], m[2]))
  return found


def _cfg(family, kv_heads):
  return tx.ModelConfig(family=family, vocab_size=40, d_model=4 * HEAD_DIM, num_heads=4,
                        num_kv_heads=kv_heads, d_ff=64, num_layers=2, max_len=64)


# One kv head at batch 1 (a cache of B*K = 1 rows) still copies: the dot drops that unit
# axis too (benchmarks/NOTES.md attempt 34).
@pytest.mark.parametrize('batch', [1, 2])
@pytest.mark.parametrize('family,kv_heads', [('decoder', 4), ('decoder', 2),
                                             ('encoder_decoder', 4)])
def test_decoding_loop_copies_no_cache(family, kv_heads, batch):
  assert _loop_copies(_cfg(family, kv_heads), batch) == []
