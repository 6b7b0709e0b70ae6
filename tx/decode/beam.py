"""Batched beam search with a KV cache, for both generating families.

Each step expands the K alive beams of every row into K x V candidates and keeps the
2K best (at most K of them end in EOS, so K others can stay alive). Candidates ending
in EOS move to the row's finished set, ranked by the length-penalised score

    log p(y) / ((5 + |y|) / 6) ** alpha        (Wu et al. 2016; alpha 0.6 in the 2017 paper)

where |y| counts the generated tokens, EOS included. The K best others stay alive.
A row is done when its best finished score is at least the best score any alive beam
could still reach (its log-prob only falls, so: alive log p / the largest penalty up to
max_len); the loop stops when every row is done, or at max_len. A row with no finished
hypothesis returns its best alive beam. PAD is never generated.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.data.tokenizers.specials import BOS_ID, EOS_ID, PAD_ID
from tx.decode.segments import cache_schedule, segmented_while_loop
from tx.decode.steps import lm_stepper, seq2seq_stepper
from tx.decode.learned_positions import needs_crop
from tx.ops.sampling import NEG_INF

NEG = -1e9  # the log-prob of an empty beam slot
SHARED_BY_BEAMS = ('cross_key', 'cross_value')  # cache leaves equal across a row's beams


def length_penalty(length, alpha: float):
  """((5 + length) / 6) ** alpha; length a scalar or array (float32)."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _batch_axis(path) -> int:
  """Cache leaves of scanned layers carry a leading 'layers' axis; batch comes next."""
  return 1 if any(getattr(k, 'key', None) == 'layers' for k in path) else 0


def _name(path) -> str:
  return str(getattr(path[-1], 'key', '')) if path else ''


def _by_row(x, axis: int, rows: int):
  """x with its batch axis split into [rows, n // rows]: self-attention caches merge the
  batch with the kv heads ([B*K, S, D], batch-major), other leaves have n = rows."""
  return x.reshape(x.shape[:axis] + (rows, -1) + x.shape[axis + 1:])


def gather_beams(cache, beam_idx_BK, batch: int, beams: int):
  """Reorders every cache leaf's batch axis: row b's beam j <- its beam beam_idx[b, j].

  beam_idx [B, K] holds indices into K. Leaves without a batch axis of B*K rows (the
  index) and cross-attention keys/values (the same for all beams of a row) are left as
  they are.
  """
  flat = (jnp.arange(batch)[:, None] * beams + beam_idx_BK).reshape(-1)

  def one(path, x):
    if x.ndim == 0 or _name(path) in SHARED_BY_BEAMS:
      return x
    axis = _batch_axis(path)
    if x.shape[axis] % (batch * beams):
      return x
    return jnp.take(_by_row(x, axis, batch * beams), flat, axis=axis).reshape(x.shape)
  return jax.tree_util.tree_map_with_path(one, cache)


def repeat_beams(cache, beams: int, batch: int):
  """Every cache leaf's batch axis B -> B*K (row b's copies at b*K .. b*K+K-1)."""
  def one(path, x):
    if x.ndim == 0:
      return x
    axis = _batch_axis(path)
    rows = jnp.repeat(_by_row(x, axis, batch), beams, axis=axis)
    return rows.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 1:])
  return jax.tree_util.tree_map_with_path(one, cache)


def search(step_fn, cache, logits_NV, batch: int, beams: int, *, max_len: int, alpha: float,
           eos_id: int = EOS_ID, pad_id: int = PAD_ID, resize=None, schedule=()):
  """Beam search over a prefilled cache (model-free: `step_fn` may be any function).

  Args:
    step_fn: (cache, tokens [B*K, 1], t) -> (logits [B*K, V], cache): feeds the token
      chosen at step t (t = 0, 1, ...) and returns the next token's logits.
    cache: any pytree whose leaves have a [B*K] batch axis (reordered as beams move).
    logits_NV: [B*K, V] logits of the first token (the K copies of a row are equal).
    eos_id: ends a hypothesis (-1: none does); pad_id: never chosen (-1: any id may be).
    resize, schedule: grow the cache as it fills (as in `generate.decode_loop`).
  Returns:
    (tokens int32 [B, max_len], EOS included and PAD after it; scores float32 [B], the
    penalised log-prob of the returned hypothesis).
  """
  vocab = logits_NV.shape[-1]
  if 2 * beams > vocab - 1:
    raise ValueError(f'decode.beam_size: {beams} beams need a vocabulary of at least '
                     f'{2 * beams + 1} tokens, got {vocab}; lower decode.beam_size')
  lp_max = jnp.maximum(length_penalty(max_len, alpha), length_penalty(1, alpha))
  alive_seqs = jnp.full((batch, beams, max_len), PAD_ID, jnp.int32)
  alive_lp = jnp.tile(jnp.asarray([0.0] + [NEG] * (beams - 1), jnp.float32), (batch, 1))
  fin_seqs = jnp.full((batch, beams, max_len), PAD_ID, jnp.int32)
  fin_scores = jnp.full((batch, beams), NEG, jnp.float32)
  fin_ok = jnp.zeros((batch, beams), bool)

  def cond(s):
    t, _, _, alive_lp, _, fin_scores, fin_ok, _ = s
    done = fin_ok[:, 0] & (fin_scores[:, 0] >= alive_lp[:, 0] / lp_max)
    return (t < max_len) & ~jnp.all(done)

  def body(s):
    t, cache, alive_seqs, alive_lp, fin_seqs, fin_scores, fin_ok, logits = s
    logits = logits.astype(jnp.float32)
    if pad_id >= 0:
      logits = logits.at[:, pad_id].set(NEG_INF)
    logp = jax.nn.log_softmax(logits).reshape(batch, beams, vocab)
    cand_lp = (alive_lp[:, :, None] + logp).reshape(batch, beams * vocab)
    top_lp, top_idx = jax.lax.top_k(cand_lp, 2 * beams)  # [B, 2K]
    beam_idx, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
    seqs = jnp.take_along_axis(alive_seqs, beam_idx[:, :, None], axis=1)
    seqs = jax.lax.dynamic_update_slice(seqs, token[:, :, None], (0, 0, t))
    is_eos = token == eos_id
    ends = is_eos & (top_lp > NEG / 2)  # a real beam emitted EOS (not an empty slot)
    # finished: the K best of the old finished set and the candidates that just ended
    new_scores = jnp.where(ends, top_lp / length_penalty(t + 1, alpha), NEG)
    all_scores = jnp.concatenate([fin_scores, new_scores], axis=1)
    fin_scores, keep = jax.lax.top_k(all_scores, beams)
    fin_seqs = jnp.take_along_axis(jnp.concatenate([fin_seqs, seqs], axis=1),
                                   keep[:, :, None], axis=1)
    fin_ok = jnp.take_along_axis(jnp.concatenate([fin_ok, ends], axis=1), keep, axis=1)
    # alive: the K best candidates that did not end
    alive_lp, keep = jax.lax.top_k(jnp.where(is_eos, NEG, top_lp), beams)
    alive_seqs = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
    cache = gather_beams(cache, jnp.take_along_axis(beam_idx, keep, axis=1), batch, beams)
    next_tok = jnp.take_along_axis(token, keep, axis=1).reshape(-1, 1)
    logits, cache = step_fn(cache, next_tok, t)
    return t + 1, cache, alive_seqs, alive_lp, fin_seqs, fin_scores, fin_ok, logits

  init = (jnp.asarray(0, jnp.int32), cache, alive_seqs, alive_lp, fin_seqs, fin_scores, fin_ok,
          logits_NV)
  _, _, alive_seqs, alive_lp, fin_seqs, fin_scores, fin_ok, _ = segmented_while_loop(
      cond, body, init, steps=max_len, schedule=schedule, resize=resize)
  has_fin = fin_ok[:, 0]
  tokens = jnp.where(has_fin[:, None], fin_seqs[:, 0], alive_seqs[:, 0])
  scores = jnp.where(has_fin, fin_scores[:, 0], alive_lp[:, 0] / length_penalty(max_len, alpha))
  return tokens, scores


_STATIC = ('cfg', 'beams', 'max_len', 'eos_id', 'cache_segments')


@functools.partial(jax.jit, static_argnames=_STATIC + ('pad_id',))
def beam_search_lm(cfg: ModelConfig, params, prompt_BP, *, beams: int = 4, max_len: int = 64,
                   alpha: float = 0.6, eos_id: int = EOS_ID, prompt_valid=None,
                   pad_id: int = PAD_ID, cache_segments: int | None = None):
  """Decoder-only: left-padded prompts [B, P] -> (continuations [B, max_len], scores [B]).

  The prompt is prefilled once per row; its cache is then copied to the K beams.
  prompt_valid / pad_id / cache_segments: as in `generate_lm`. With learned positions the
  prompt and max_len must fit model.max_len (ConfigError otherwise).
  """
  b, p = prompt_BP.shape
  if needs_crop(cfg, p, max_len):
    raise ConfigError(
        f'beam search over learned positions needs prompt length ({p}) + max_len ({max_len}) '
        f'- 1 <= model.max_len ({cfg.max_len}); lower decode.max_len or shorten the prompt, '
        'or decode with greedy / sample, which slide a window past model.max_len')
  schedule = cache_schedule(p, max_len, cache_segments)
  s = lm_stepper(cfg, params, prompt_BP, schedule[0][1], prompt_valid_BP=prompt_valid)
  cache, logits, lengths = (repeat_beams(x, beams, b) for x in (s.cache, s.logits, s.positions))
  step_fn = lambda cache, tok, t: s.step(cache, tok, (lengths + t)[:, None])
  return search(step_fn, cache, logits, b, beams, max_len=max_len, alpha=alpha, eos_id=eos_id,
                pad_id=pad_id, resize=functools.partial(s.resize, rows=b * beams),
                schedule=schedule[1:])


@functools.partial(jax.jit, static_argnames=_STATIC + ('bos_id',))
def beam_search_seq2seq(cfg: ModelConfig, params, src_BS, *, beams: int = 4, max_len: int = 64,
                        alpha: float = 0.6, eos_id: int = EOS_ID, bos_id: int = BOS_ID,
                        cache_segments: int | None = None):
  """Encoder-decoder: src [B, S] -> (translations [B, max_len], scores [B]).

  The encoder runs once per batch (B rows, not B*K) and each layer's cross-attention
  keys/values are projected once, at the BOS step; decoding starts from `bos_id`.
  cache_segments: as in `generate_lm`.
  """
  b = src_BS.shape[0]
  schedule = cache_schedule(1, max_len, cache_segments)  # slot 0 holds the start token
  s = seq2seq_stepper(cfg, params, src_BS, schedule[0][1], repeat=beams, bos_id=bos_id)
  step_fn = lambda cache, tok, t: s.step(cache, tok, jnp.full((b * beams, 1), t + 1, jnp.int32))
  return search(step_fn, s.cache, s.logits, b, beams, max_len=max_len, alpha=alpha,
                eos_id=eos_id, resize=s.resize, schedule=schedule[1:])
