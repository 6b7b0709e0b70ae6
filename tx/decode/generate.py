"""Cached generation for both generating families: greedy and sampling.

The prompt is prefilled in one pass; then one token per step inside a jitted
`lax.while_loop` (no Python loop per token, one compile per shape) that stops early
once every row has emitted EOS. Long generations grow the KV cache in up to 4
segments (one while_loop each; tx/decode/segments.py), so early steps do not read
the empty slots at the end of the cache. A decoder with learned positions that would run
past its position table slides a window of its last max_len tokens instead, as nanoGPT
does (tx/decode/learned_positions.py).

Prompts are LEFT-padded (pad id 0) so every row's last prompt token sits in the same
slot; positions count real tokens only, so absolute position schemes see 0, 1, 2, ...
per row. PAD is never generated (a fed-back pad would be masked out of attention); a
finished row emits PAD after its EOS.

Vocabularies whose id 0 is a real token (GPT-2's "!", data.tokenizer=hf) pass
`prompt_valid` (which prompt slots are real) and `pad_id=-1`: then id 0 in a prompt is
attended to, may be generated, and is fed back as a real token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tx import ops
from tx.config.model import ModelConfig
from tx.data.tokenizers.specials import BOS_ID, EOS_ID, PAD_ID
from tx.decode.segments import cache_schedule, segmented_while_loop
from tx.decode.steps import lm_stepper, seq2seq_stepper
from tx.decode.learned_positions import needs_crop, crop_stepper
from tx.ops.sampling import NEG_INF

__all__ = ['BOS_ID', 'EOS_ID', 'PAD_ID', 'generate_lm', 'generate_seq2seq', 'left_pad',
           'decode_loop', 'cache_schedule']

_STATIC = ('cfg', 'max_new', 'strategy', 'top_k', 'eos_id', 'return_logits', 'cache_segments')


def left_pad(prompts: list[list[int]], length: int | None = None):
  """int32 [B, P]: each prompt right-aligned (left-padded with 0); longer ones keep their end."""
  length = length or max(1, max(len(p) for p in prompts))
  out = [[PAD_ID] * (length - len(p[-length:])) + list(p)[-length:] for p in prompts]
  return jnp.asarray(out, jnp.int32)


def choose(rng, logits_BV, *, strategy: str, temperature=1.0, top_k: int = 0, top_p=1.0,
           pad_id: int = PAD_ID):
  """int32 [B]: the next token of each row (argmax, or a filtered sample); never `pad_id`
  (-1: any id may be chosen)."""
  logits = logits_BV.astype(jnp.float32)
  if pad_id >= 0:
    logits = logits.at[:, pad_id].set(NEG_INF)
  return ops.sample_logits(rng, logits, temperature=temperature, top_k=top_k, top_p=top_p,
                           greedy=strategy == 'greedy')


def decode_loop(step_fn, cache, logits_BV, positions_B, rng, *, max_new: int,
                strategy: str = 'greedy', temperature=1.0, top_k: int = 0, top_p=1.0,
                eos_id: int = EOS_ID, return_logits: bool = False, pad_id: int = PAD_ID,
                resize=None, schedule=()):
  """Choose a token, feed it back, `max_new` times or until every row has emitted EOS.

  Args:
    step_fn: (cache, tokens [B, 1], positions [B, 1]) -> (logits [B, V], cache).
    logits_BV: logits of the first new token; positions_B: its position.
    rng: step t samples with fold_in(rng, t), so a seed reproduces a sample.
    eos_id: -1 never stops (benchmarks).
    pad_id: never chosen (-1: every id may be; for vocabularies where id 0 is a token).
    resize, schedule: grow the cache as it fills: before step `t` of each (t, slots)
      in `schedule` the cache becomes `resize(cache, slots)` (`cache_schedule`, minus
      its first segment; a Stepper's resize). Default: the cache is never resized.
  Returns:
    tokens int32 [B, max_new] (EOS included, PAD after it), and with return_logits
    the logits [B, max_new, V] each token was chosen from (zeros where not decoded).
  """
  b, v = logits_BV.shape
  tokens = jnp.full((b, max_new), PAD_ID, jnp.int32)
  seen = jnp.zeros((b, max_new, v) if return_logits else (0,), jnp.float32)

  def cond(s):
    t, _, _, finished, _, _ = s
    return (t < max_new) & ~jnp.all(finished)

  def body(s):
    t, cache, logits, finished, tokens, seen = s
    token = choose(jax.random.fold_in(rng, t), logits, strategy=strategy,
                   temperature=temperature, top_k=top_k, top_p=top_p, pad_id=pad_id)
    token = jnp.where(finished, PAD_ID, token)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, t))
    if return_logits:
      seen = jax.lax.dynamic_update_slice(seen, logits[:, None].astype(jnp.float32), (0, t, 0))
    finished = finished | (token == eos_id)
    logits, cache = step_fn(cache, token[:, None], (positions_B + t)[:, None])
    return t + 1, cache, logits, finished, tokens, seen

  init = (jnp.asarray(0, jnp.int32), cache, logits_BV, jnp.zeros((b,), bool), tokens, seen)
  _, _, _, _, tokens, seen = segmented_while_loop(cond, body, init, steps=max_new,
                                                  schedule=schedule, resize=resize)
  return (tokens, seen) if return_logits else tokens


@functools.partial(jax.jit, static_argnames=_STATIC + ('pad_id',))
def generate_lm(cfg: ModelConfig, params, prompt_BP, rng, *, max_new: int, strategy='greedy',
                temperature=1.0, top_k: int = 0, top_p=1.0, eos_id: int = EOS_ID,
                return_logits: bool = False, prompt_valid=None, pad_id: int = PAD_ID,
                cache_segments: int | None = None):
  """Decoder-only: continues left-padded prompts [B, P] by up to max_new tokens.

  Every row needs at least one real token (texts.prompt_rows gives an empty prompt a
  start token). prompt_valid: bool [B, P] real prompt tokens (default prompt != PAD; pass
  it with pad_id=-1 where id 0 is a real token, see the module docstring).

  Returns tokens [B, max_new] (after a row's EOS: PAD), plus logits [B, max_new, V] if
  return_logits. strategy 'greedy' | 'sample' (temperature, top_k, top_p).
  cache_segments: grow the KV cache in this many segments (`cache_schedule`; None: by
  length; 1: allocate it whole). The tokens do not depend on it.
  With learned positions and P + max_new - 1 > model.max_len, decoding slides a window
  of the last max_len tokens instead, recomputed each step (tx/decode/learned_positions.py).
  """
  loop = functools.partial(decode_loop, rng=rng, max_new=max_new, strategy=strategy,
                           temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id,
                           return_logits=return_logits, pad_id=pad_id)
  if needs_crop(cfg, prompt_BP.shape[1], max_new):
    s = crop_stepper(cfg, params, prompt_BP, prompt_valid_BP=prompt_valid)
    return loop(s.step, s.cache, s.logits, s.positions)
  schedule = cache_schedule(prompt_BP.shape[1], max_new, cache_segments)
  s = lm_stepper(cfg, params, prompt_BP, schedule[0][1], prompt_valid_BP=prompt_valid)
  return loop(s.step, s.cache, s.logits, s.positions, resize=s.resize, schedule=schedule[1:])


@functools.partial(jax.jit, static_argnames=_STATIC + ('bos_id',))
def generate_seq2seq(cfg: ModelConfig, params, src_BS, rng, *, max_new: int, strategy='greedy',
                     temperature=1.0, top_k: int = 0, top_p=1.0, eos_id: int = EOS_ID,
                     return_logits: bool = False, bos_id: int = BOS_ID,
                     cache_segments: int | None = None):
  """Encoder-decoder: src [B, S] (right-padded) -> tokens [B, max_new] (+ logits [B, max_new, V]).

  The encoder runs once per batch and each layer's cross-attention keys/values are
  projected once; decoding starts from `bos_id` (T5 checkpoints: 0, their pad id).
  cache_segments: as in `generate_lm`.
  """
  schedule = cache_schedule(1, max_new, cache_segments)  # slot 0 holds the start token
  s = seq2seq_stepper(cfg, params, src_BS, schedule[0][1], bos_id=bos_id)
  return decode_loop(s.step, s.cache, s.logits, s.positions, rng, max_new=max_new,
                     strategy=strategy, temperature=temperature, top_k=top_k, top_p=top_p,
                     eos_id=eos_id, return_logits=return_logits,
                     resize=s.resize, schedule=schedule[1:])
