"""Decoder-only generation past a learned position table: crop to the last max_len tokens,
recomputed.

A model with learned positions has no embedding for position `model.max_len` or later
(lm_shakespeare_char: 64 positions, 300 sampled characters). Once prompt + new tokens
would pass that, `generate_lm` decodes as nanoGPT's `generate` does: every step runs the
model over the last `max_len` tokens (positions 0 .. max_len - 1 again) and reads the
logits at the newest one. No KV cache: the keys of a token depend on its position, which
changes as the window slides. While the sequence still fits, the window holds all of it,
so the tokens are those of the cached path.
"""

from __future__ import annotations

import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.data.tokenizers.specials import PAD_ID
from tx.decode.steps import Stepper, prompt_positions
from tx.models.build import build_model


def needs_crop(cfg: ModelConfig, prompt_len: int, max_new: int) -> bool:
  """True when a learned position table cannot hold prompt + max_new tokens.

  The last token whose logits are read sits at position prompt_len + max_new - 2.
  """
  return cfg.position == 'learned' and prompt_len + max_new - 1 > cfg.max_len


def crop_stepper(cfg: ModelConfig, params, prompt_BP, *, prompt_valid_BP=None) -> Stepper:
  """A Stepper whose 'cache' is the window (tokens int32 [B, W], real bool [B, W]), W = max_len.

  prompt_BP: left-padded [B, P]; a longer prompt keeps its last W tokens. prompt_valid_BP:
  as in `lm_stepper` (id 0 is a real token; every fed-back token counts as real).
  Returns logits [B, V] float32 after the prompt; positions are unused (zeros).
  """
  model = build_model(cfg)
  b, p = prompt_BP.shape
  width = cfg.max_len
  explicit = prompt_valid_BP is not None
  valid = jnp.asarray(prompt_valid_BP, bool) if explicit else prompt_BP != PAD_ID
  if p >= width:
    tokens, valid = prompt_BP[:, p - width:], valid[:, p - width:]
  else:
    tokens = jnp.concatenate([jnp.full((b, width - p), PAD_ID, jnp.int32), prompt_BP], axis=1)
    valid = jnp.concatenate([jnp.zeros((b, width - p), bool), valid], axis=1)

  def last_logits(tokens_BW, valid_BW):
    segments = valid_BW.astype(jnp.int32) if explicit else None
    logits = model.apply({'params': params}, tokens_BW,
                         positions=prompt_positions(tokens_BW, valid_BW), segment_ids=segments)
    return logits[:, -1].astype(jnp.float32)

  def step(window, tokens_B1, _):
    tokens_BW, valid_BW = window
    real_B1 = jnp.ones(tokens_B1.shape, bool) if explicit else tokens_B1 != PAD_ID
    tokens_BW = jnp.concatenate([tokens_BW[:, 1:], tokens_B1.astype(jnp.int32)], axis=1)
    valid_BW = jnp.concatenate([valid_BW[:, 1:], real_B1], axis=1)
    return last_logits(tokens_BW, valid_BW), (tokens_BW, valid_BW)

  return Stepper(step, last_logits(tokens, valid), (tokens, valid), jnp.zeros((b,), jnp.int32),
                 resize=None)
