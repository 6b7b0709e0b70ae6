"""Decoder-only generation WITHOUT a cache: the full forward pass is recomputed every step.

The reference the cached decoders are tested against, and the baseline of
benchmarks/decode_throughput.py. The sequence lives in a fixed [B, P + T] buffer
(PAD beyond what is decoded, masked like any padding), so the loop compiles once;
step t runs the whole network over the buffer and reads the logits at the newest
slot. It shares `decode_loop` (token choice, EOS, PAD after EOS) with the cached path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.data.tokenizers.specials import EOS_ID, PAD_ID
from tx.decode.generate import decode_loop
from tx.decode.steps import prompt_positions
from tx.models.build import build_model

_STATIC = ('cfg', 'max_new', 'strategy', 'top_k', 'eos_id', 'return_logits')


def _recompute_stepper(forward, buf_BT, positions_BT, start: int):
  """step_fn over a token buffer: writes the token at slot `index`, reruns `forward`.

  forward(buf [B, T], positions [B, T]) -> logits [B, T, V]. The 'cache' is (buf, index).
  Returns (step_fn, logits [B, V] at slot start - 1, cache).
  """
  def step_fn(cache, tokens_B1, _):
    buf, index = cache
    buf = jax.lax.dynamic_update_slice(buf, tokens_B1.astype(jnp.int32), (0, index))
    logits = jax.lax.dynamic_index_in_dim(forward(buf, positions_BT), index, 1, keepdims=False)
    return logits.astype(jnp.float32), (buf, index + 1)

  first = forward(buf_BT, positions_BT)[:, start - 1].astype(jnp.float32)
  return step_fn, first, (buf_BT, jnp.asarray(start, jnp.int32))


@functools.partial(jax.jit, static_argnames=_STATIC)
def generate_lm_uncached(cfg: ModelConfig, params, prompt_BP, rng, *, max_new: int,
                         strategy='greedy', temperature=1.0, top_k: int = 0, top_p=1.0,
                         eos_id: int = EOS_ID, return_logits: bool = False):
  """`generate_lm` recomputing the full forward pass each step: same arguments and outputs
  (learned positions: while prompt + max_new fit model.max_len; past it generate_lm slides
  a window, tx/decode/learned_positions.py, and this clips positions)."""
  model = build_model(cfg)
  b, p = prompt_BP.shape
  buf = jnp.concatenate([prompt_BP, jnp.full((b, max_new), PAD_ID, jnp.int32)], axis=1)
  lengths = jnp.sum(prompt_BP != PAD_ID, axis=1).astype(jnp.int32)
  new_pos = lengths[:, None] + jnp.arange(max_new, dtype=jnp.int32)[None]
  positions = jnp.concatenate([prompt_positions(prompt_BP), new_pos], axis=1)
  forward = lambda tokens, pos: model.apply({'params': params}, tokens, positions=pos)
  step_fn, logits, cache = _recompute_stepper(forward, buf, positions, p)
  return decode_loop(step_fn, cache, logits, lengths, rng, max_new=max_new, strategy=strategy,
                     temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id,
                     return_logits=return_logits)

