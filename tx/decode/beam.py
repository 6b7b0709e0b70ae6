"""Batched beam search with a KV cache, for both generating families.

Each step expands the K alive beams of every row into K x V candidates and keeps the
2K best. Candidates ending in EOS move to the row's finished set, ranked by the
length-penalised score  log p / ((5 + len) / 6) ** alpha  (Wu et al. 2016, used by the
2017 paper with alpha 0.6); the K best others stay alive. The loop stops when every
row's best alive beam can no longer beat its worst finished one (or at max_len).
Rows with no finished beam at the end return their best alive beam.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.decode.generate import BOS_ID, EOS_ID, PAD_ID
from tx.models.build import build_model

NEG = -1e9


def length_penalty(length, alpha: float):
  """((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def _batch_axis(path) -> int:
  """Cache leaves of scanned layers carry a leading 'layers' axis; batch comes next."""
  return 1 if any(getattr(k, 'key', None) == 'layers' for k in path) else 0


def gather_beams(cache, beam_idx_BK, batch: int, beams: int):
  """Reorders every cache leaf's [B*K] batch axis by beam_idx [B, K] (indices into K)."""
  flat = (jnp.arange(batch)[:, None] * beams + beam_idx_BK).reshape(-1)

  def one(path, x):
    if x.ndim == 0:
      return x
    axis = _batch_axis(path)
    if x.shape[axis] != batch * beams:
      return x
    return jnp.take(x, flat, axis=axis)
  return jax.tree_util.tree_map_with_path(one, cache)


def _search(step_fn, cache, logits_NV, batch: int, beams: int, *, max_len: int, alpha: float,
            eos_id: int):
  """The search loop over a prefilled cache. logits [B*K, V] of the next token.

  Returns (tokens [B, max_len] padded after EOS, scores [B]).
  """
  vocab = logits_NV.shape[-1]
  alive_seqs = jnp.full((batch, beams, max_len), PAD_ID, jnp.int32)
  alive_lp = jnp.tile(jnp.asarray([0.0] + [NEG] * (beams - 1), jnp.float32), (batch, 1))
  fin_seqs = jnp.full((batch, beams, max_len), PAD_ID, jnp.int32)
  fin_scores = jnp.full((batch, beams), NEG, jnp.float32)

  def cond(s):
    t, _, _, alive_lp, _, fin_scores, _ = s
    best_alive = alive_lp[:, 0] / length_penalty(max_len, alpha)
    worst_fin = fin_scores[:, -1]
    return (t < max_len) & ~jnp.all(worst_fin > best_alive)

  def body(s):
    t, cache, alive_seqs, alive_lp, fin_seqs, fin_scores, logits = s
    logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, beams, vocab)
    cand_lp = (alive_lp[:, :, None] + logp).reshape(batch, beams * vocab)
    top_lp, top_idx = jax.lax.top_k(cand_lp, 2 * beams)  # [B, 2K]
    beam_idx, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
    seqs = jnp.take_along_axis(alive_seqs, beam_idx[:, :, None], axis=1)
    seqs = seqs.at[:, :, t].set(token)
    is_eos = token == eos_id
    # finished: merge the old finished set with the candidates that just emitted EOS
    new_fin_scores = jnp.where(is_eos, top_lp / length_penalty(t + 1.0, alpha), NEG)
    all_scores = jnp.concatenate([fin_scores, new_fin_scores], axis=1)
    all_seqs = jnp.concatenate([fin_seqs, seqs], axis=1)
    fin_scores, keep = jax.lax.top_k(all_scores, beams)
    fin_seqs = jnp.take_along_axis(all_seqs, keep[:, :, None], axis=1)
    # alive: the best K candidates that did not end
    alive_cand = jnp.where(is_eos, NEG, top_lp)
    alive_lp, keep = jax.lax.top_k(alive_cand, beams)
    alive_seqs = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
    src_beam = jnp.take_along_axis(beam_idx, keep, axis=1)
    cache = gather_beams(cache, src_beam, batch, beams)
    next_tok = jnp.take_along_axis(token, keep, axis=1).reshape(-1, 1)
    logits, cache = step_fn(cache, next_tok, t)
    return t + 1, cache, alive_seqs, alive_lp, fin_seqs, fin_scores, logits

  init = (jnp.asarray(0), cache, alive_seqs, alive_lp, fin_seqs, fin_scores, logits_NV)
  _, _, alive_seqs, alive_lp, fin_seqs, fin_scores, _ = jax.lax.while_loop(cond, body, init)
  has_fin = fin_scores[:, 0] > NEG / 2
  alive_scores = alive_lp[:, 0] / length_penalty(max_len, alpha)
  tokens = jnp.where(has_fin[:, None], fin_seqs[:, 0], alive_seqs[:, 0])
  scores = jnp.where(has_fin, fin_scores[:, 0], alive_scores)
  return tokens, scores


def _repeat(x, beams: int):
  return jnp.repeat(x, beams, axis=0)


@functools.partial(jax.jit, static_argnames=('cfg', 'beams', 'max_len', 'eos_id'))
def beam_search_lm(cfg: ModelConfig, params, prompt_BP, *, beams: int = 4, max_len: int = 64,
                   alpha: float = 0.6, eos_id: int = EOS_ID):
  """Decoder-only: left-padded prompts [B, P] -> (continuations [B, max_len], scores [B])."""
  model = build_model(cfg, decode=True)
  b, p = prompt_BP.shape
  prompts = _repeat(prompt_BP, beams)
  cache = model.init(jax.random.key(0), jnp.zeros((b * beams, p + max_len), jnp.int32))['cache']
  valid = prompts != PAD_ID
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)
  lengths = jnp.sum(valid, axis=1).astype(jnp.int32)

  def apply(cache, tokens, pos):
    logits, state = model.apply({'params': params, 'cache': cache}, tokens, positions=pos,
                                mutable=['cache'])
    return logits[:, -1], state['cache']

  logits, cache = apply(cache, prompts, positions)
  step_fn = lambda cache, tok, t: apply(cache, tok, (lengths + t)[:, None])
  return _search(step_fn, cache, logits, b, beams, max_len=max_len, alpha=alpha, eos_id=eos_id)


@functools.partial(jax.jit, static_argnames=('cfg', 'beams', 'max_len', 'eos_id'))
def beam_search_seq2seq(cfg: ModelConfig, params, src_BS, *, beams: int = 4, max_len: int = 64,
                        alpha: float = 0.6, eos_id: int = EOS_ID):
  """Encoder-decoder: src [B, S] -> (translations [B, max_len], scores [B]).

  The encoder runs once per batch; its output is repeated for the K beams.
  """
  model = build_model(cfg, decode=True)
  b = src_BS.shape[0]
  encoded, src_valid = model.apply({'params': params}, src_BS, method='encode')
  encoded, src_valid = _repeat(encoded, beams), _repeat(src_valid, beams)
  cache = model.init(jax.random.key(0), _repeat(src_BS, beams),
                     jnp.zeros((b * beams, max_len + 1), jnp.int32))['cache']

  def apply(cache, tokens, pos):
    logits, state = model.apply({'params': params, 'cache': cache}, encoded, src_valid, tokens,
                                positions=pos, mutable=['cache'], method='decode_step')
    return logits[:, -1], state['cache']

  bos = jnp.full((b * beams, 1), BOS_ID, jnp.int32)
  logits, cache = apply(cache, bos, jnp.zeros((b * beams, 1), jnp.int32))
  step_fn = lambda cache, tok, t: apply(cache, tok, jnp.full((b * beams, 1), t + 1, jnp.int32))
  return _search(step_fn, cache, logits, b, beams, max_len=max_len, alpha=alpha, eos_id=eos_id)


def beam_search_texts(cfg, params, tokenizer, texts: list[str], decode_cfg) -> list[str]:
  """Beam-search continuations / translations of `texts` (the `tx generate` path)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tx.decode.generate import left_pad  # pylint: disable=g-import-not-at-top
  kw = dict(beams=decode_cfg.beam_size, max_len=decode_cfg.max_len,
            alpha=decode_cfg.length_penalty)
  if cfg.model.family == 'decoder':
    out, _ = beam_search_lm(cfg.model, params, left_pad([tokenizer.encode(t) for t in texts]),
                            **kw)
  else:
    src = [tokenizer.encode(t)[:cfg.data.seq_len - 1] + [EOS_ID] for t in texts]
    width = max(len(s) for s in src)
    src = np.asarray([s + [PAD_ID] * (width - len(s)) for s in src], np.int32)
    out, _ = beam_search_seq2seq(cfg.model, params, src, **kw)
  rows = []
  for row in np.asarray(out).tolist():
    row = row[:row.index(EOS_ID)] if EOS_ID in row else row
    rows.append(tokenizer.decode([i for i in row if i != PAD_ID]))
  return rows
