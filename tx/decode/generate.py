"""Cached generation for both generating families: greedy and sampling.

The prompt is prefilled in one pass; then one token per step inside a jitted
`lax.scan` (no Python loop per token, one compile per shape). Prompts are LEFT-padded
(pad id 0) so every row's last prompt token sits in the same slot; positions count
real tokens only, so absolute position schemes see 0, 1, 2, ... per row.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tx import ops
from tx.config.model import ModelConfig
from tx.models.build import build_model

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def left_pad(prompts: list[list[int]], length: int | None = None):
  """int32 [B, P] with each prompt right-aligned (left padding with 0)."""
  length = length or max(1, max(len(p) for p in prompts))
  out = [[PAD_ID] * (length - len(p)) + list(p)[-length:] for p in prompts]
  return jnp.asarray(out, jnp.int32)


def _choose(rng, logits_BV, strategy, temperature, top_k, top_p):
  return ops.sample_logits(rng, logits_BV, temperature=temperature, top_k=top_k, top_p=top_p,
                           greedy=strategy == 'greedy')


def _continue(step_fn, cache, logits_BV, positions_B, rng, *, max_new, strategy, temperature,
              top_k, top_p, eos_id):
  """Scans `max_new` steps of choose-token / feed-it-back. Returns tokens [B, max_new]."""
  b = logits_BV.shape[0]

  def body(carry, t):
    cache, logits, finished = carry
    token = _choose(jax.random.fold_in(rng, t), logits, strategy, temperature, top_k, top_p)
    token = jnp.where(finished, PAD_ID, token)
    finished = finished | (token == eos_id)
    logits, cache = step_fn(cache, token[:, None], (positions_B + t)[:, None])
    return (cache, logits, finished), token

  init = (cache, logits_BV, jnp.zeros((b,), bool))
  _, tokens_TB = jax.lax.scan(body, init, jnp.arange(max_new))
  return tokens_TB.T


@functools.partial(jax.jit, static_argnames=('cfg', 'max_new', 'strategy', 'top_k', 'eos_id'))
def generate_lm(cfg: ModelConfig, params, prompt_BP, rng, *, max_new: int, strategy='greedy',
                temperature=1.0, top_k: int = 0, top_p=1.0, eos_id: int = EOS_ID):
  """Decoder-only: continues left-padded prompts [B, P] by max_new tokens -> [B, max_new].

  After a row emits EOS it emits PAD (finished flags are per sequence).
  """
  model = build_model(cfg, decode=True)
  b, p = prompt_BP.shape
  cache = model.init(jax.random.key(0), jnp.zeros((b, p + max_new), jnp.int32))['cache']
  valid = prompt_BP != PAD_ID
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)

  def step_fn(cache, tokens, pos):
    logits, state = model.apply({'params': params, 'cache': cache}, tokens, positions=pos,
                                mutable=['cache'])
    return logits[:, -1], state['cache']

  logits, cache = step_fn(cache, prompt_BP, positions)
  lengths = jnp.sum(valid, axis=1).astype(jnp.int32)
  return _continue(step_fn, cache, logits, lengths, rng, max_new=max_new, strategy=strategy,
                   temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id)


@functools.partial(jax.jit, static_argnames=('cfg', 'max_new', 'strategy', 'top_k', 'eos_id'))
def generate_seq2seq(cfg: ModelConfig, params, src_BS, rng, *, max_new: int, strategy='greedy',
                     temperature=1.0, top_k: int = 0, top_p=1.0, eos_id: int = EOS_ID):
  """Encoder-decoder: the encoder runs once; decoding starts from BOS -> [B, max_new]."""
  model = build_model(cfg, decode=True)
  b = src_BS.shape[0]
  cache = model.init(jax.random.key(0), src_BS, jnp.zeros((b, max_new + 1), jnp.int32))['cache']
  encoded, src_valid = model.apply({'params': params}, src_BS, method='encode')

  def step_fn(cache, tokens, pos):
    logits, state = model.apply({'params': params, 'cache': cache}, encoded, src_valid, tokens,
                                positions=pos, mutable=['cache'], method='decode_step')
    return logits[:, -1], state['cache']

  bos = jnp.full((b, 1), BOS_ID, jnp.int32)
  logits, cache = step_fn(cache, bos, jnp.zeros((b, 1), jnp.int32))
  return _continue(step_fn, cache, logits, jnp.ones((b,), jnp.int32), rng, max_new=max_new,
                   strategy=strategy, temperature=temperature, top_k=top_k, top_p=top_p,
                   eos_id=eos_id)
