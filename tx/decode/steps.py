"""Prefill + one-token steps over a KV-cached model, shared by sampling and beam search.

A *stepper* is what both decoders consume:

    step_fn(cache, tokens_B1, positions_B1) -> (logits_BV float32, cache)

plus the prefill's result: the logits of the first new token [B, V], the filled cache
and the position of the first new token [B], and `resize(cache, slots)`, which lengthens
the cache (a decode loop grows it in segments, so early steps attend over fewer empty
slots). The cache is allocated by tracing the model's init abstractly (`jax.eval_shape`),
so allocating it runs no network.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.data.tokenizers.specials import BOS_ID, PAD_ID
from tx.models.build import build_model


class Stepper(NamedTuple):
  """A prefilled model, ready for one-token steps."""
  step: Callable  # (cache, tokens [B, 1], positions [B, 1]) -> (logits [B, V] float32, cache)
  logits: jax.Array  # [B, V] float32: the logits of the first new token
  cache: Any  # the prefilled cache
  positions: jax.Array  # int32 [B]: the position of the first new token
  # (cache, slots) -> the cache zero-padded to `slots` slots; lm_stepper's also takes
  # rows=: the batch size of a cache repeated after the prefill (beam search's B * K)
  resize: Callable


def _cache_shapes(model, *args, method=None):
  return jax.eval_shape(
      lambda *a: model.init(jax.random.key(0), *a, method=method)['cache'], *args)


def empty_cache(model, *args, method=None):
  """The zero-filled 'cache' collection `model.init(rng, *args)` allocates (nothing is run).

  Every cache variable of tx starts at zeros (index 0, no valid slot, zero keys/values).
  """
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                _cache_shapes(model, *args, method=method))


def padded_cache(cache, model, *args, method=None):
  """`cache` zero-padded to what `model.init(rng, *args)` allocates (a longer cache).

  Zeros are what an empty slot holds (not valid, position 0, zero keys/values), so the
  padded cache decodes exactly as the short one did; arrays whose shape does not depend
  on the length (the index, cross-attention keys/values) are returned as they are.
  """
  def pad(x, target):
    if x.shape == target.shape:
      return x
    return jnp.pad(x, [(0, t - n) for n, t in zip(x.shape, target.shape)])
  return jax.tree_util.tree_map(pad, cache, _cache_shapes(model, *args, method=method))


def prompt_positions(prompt_BP, valid_BP=None):
  """int32 [B, P]: 0, 1, 2, ... over the real tokens of left-padded prompts (pads get 0).

  valid_BP: bool [B, P] real tokens (default: prompt != PAD)."""
  valid = prompt_BP != PAD_ID if valid_BP is None else valid_BP
  return jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)


def lm_stepper(cfg: ModelConfig, params, prompt_BP, total_len: int, *,
               prompt_valid_BP=None) -> Stepper:
  """Decoder-only: prefills left-padded prompts [B, P] into a cache of `total_len` slots.

  prompt_valid_BP: bool [B, P], the real prompt tokens, for vocabularies where id 0 is a
  real token (GPT-2's "!"); every token fed to step_fn then counts as real too, id 0
  included. Default: real = `prompt != PAD`, and a fed-back PAD is masked out.
  Returns a Stepper (logits after the last prompt token; positions: the next position).
  """
  model = build_model(cfg, decode=True)
  b, _ = prompt_BP.shape
  slots = lambda n, rows=None: jnp.zeros((rows or b, n), jnp.int32)
  cache = empty_cache(model, slots(total_len))

  def apply(cache, tokens_BL, positions_BL, segment_ids_BL=None):
    logits, state = model.apply({'params': params, 'cache': cache}, tokens_BL,
                                positions=positions_BL, segment_ids=segment_ids_BL,
                                mutable=['cache'])
    return logits[:, -1].astype(jnp.float32), state['cache']

  if prompt_valid_BP is None:
    valid, segments, step_fn = prompt_BP != PAD_ID, None, apply
  else:
    valid = jnp.asarray(prompt_valid_BP, bool)
    segments = valid.astype(jnp.int32)  # segment ids 1 = real, whatever the token id
    step_fn = lambda cache, tokens, positions: apply(cache, tokens, positions,
                                                     jnp.ones(tokens.shape, jnp.int32))
  logits, cache = apply(cache, prompt_BP, prompt_positions(prompt_BP, valid), segments)
  lengths = jnp.sum(valid, axis=1).astype(jnp.int32)
  return Stepper(step_fn, logits, cache, lengths,
                 lambda cache, n, rows=None: padded_cache(cache, model, slots(n, rows)))


def seq2seq_stepper(cfg: ModelConfig, params, src_BS, total_len: int, *, repeat: int = 1,
                    bos_id: int = BOS_ID) -> Stepper:
  """Encoder-decoder: encodes src [B, S] once, then prefills BOS (row i -> rows i*r..i*r+r-1).

  The first decode step projects the encoder output into every layer's cross-attention
  keys/values and caches them; later steps pass no encoder output at all.
  `bos_id` is the start token; it is marked as a real token even when it is the pad id
  (T5 starts from its pad id 0).
  Returns a Stepper over B*r rows (logits after BOS; positions: 1).
  """
  model = build_model(cfg, decode=True)
  encoded, src_valid = model.apply({'params': params}, src_BS, method='encode')
  if repeat > 1:
    encoded, src_valid = (jnp.repeat(x, repeat, axis=0) for x in (encoded, src_valid))
  n = encoded.shape[0]
  slots = lambda k: (encoded, src_valid, jnp.zeros((n, k), jnp.int32))
  cache = empty_cache(model, *slots(total_len), method='decode_step')

  def apply(cache, tokens_BL, positions_BL, enc, segment_ids=None):
    logits, state = model.apply({'params': params, 'cache': cache}, enc, src_valid, tokens_BL,
                                positions=positions_BL, segment_ids=segment_ids,
                                mutable=['cache'], method='decode_step')
    return logits[:, -1].astype(jnp.float32), state['cache']

  bos = jnp.full((n, 1), bos_id, jnp.int32)
  # segment id 1 marks the start slot valid in the cache, whatever its token id
  logits, cache = apply(cache, bos, jnp.zeros((n, 1), jnp.int32), encoded,
                        jnp.ones((n, 1), jnp.int32))
  step_fn = lambda cache, tokens, positions: apply(cache, tokens, positions, None)
  return Stepper(step_fn, logits, cache, jnp.ones((n,), jnp.int32),
                 lambda cache, k: padded_cache(cache, model, *slots(k), method='decode_step'))
