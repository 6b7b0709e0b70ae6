"""The XLA attention path: softmax(q·kᵀ·scale + bias) masked, times v, with its own backward.

The backward recomputes the probabilities from the saved log-sum-exp (one value per
query row) and uses rowsum(dO * O) for the softmax's correction term, as flash attention
does, instead of the rowsum(dP * P) that autodiff of a softmax produces. On XLA:CPU the
latter is fused into the small batched dO·Vᵀ dot and made it the slowest op of a training
step (measurements: benchmarks/NOTES.md).
Only q, k, v, the output and the log-sum-exp are kept for the backward, not the
[B, H, L, S] probabilities.

Query blocks (causal attention that skips the hidden keys) run inside the one custom VJP,
on q, k, v laid out heads-first once: sliced per block [B, H, L, D] -> [B, H, l, D] they
feed the batched dots without a layout copy, and the blocks' key and value gradients are
summed in float32 and rounded once. Summed by autodiff, each block's bf16 gradient was
rounded and re-widened at every add, and those convert chains ran ~5x slower on XLA:CPU
than the same sum in float32 (benchmarks/NOTES.md, attempt 33).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def xla_attention(q_BLHD, k_BSKD, v_BSKD, mask_BHLS, bias_BHLS, scale: float,
                  mask_value: float, softcap: float = 0.0, blocks=None):
  """out [B, L, H, D] in q's dtype; H % K == 0 (grouped-query: head h reads kv head h // (H//K)).

  mask_BHLS: bool [B|1, H|1, L, S] or None; bias_BHLS: float [B|1, H|1, L, S] or None (its
  gradient is returned). softcap c > 0: the scores q·kᵀ·scale become c·tanh(scores / c)
  before the bias and the mask. A query row that sees no key outputs exactly zeros
  (gradients too). Logits, softmax and accumulation in float32.
  blocks: None (every query over every key) or a tuple of static (q_start, q_end, k_start,
  k_end) covering the queries [0, L) in order: queries [q_start, q_end) attend over keys
  [k_start, k_end) only; the caller promises `mask` hides every other key from them.
  """
  L, S = q_BLHD.shape[1], k_BSKD.shape[1]
  blocks = ((0, L, 0, S),) if blocks is None else tuple(tuple(int(i) for i in b) for b in blocks)
  if [b[0] for b in blocks] != [0] + [b[1] for b in blocks[:-1]] or blocks[-1][1] != L:
    raise ValueError(f'blocks must cover the queries [0, {L}) in order, got {blocks}')
  out_BHLD = _attention(heads_first(q_BLHD), heads_first(k_BSKD), heads_first(v_BSKD),
                        mask_BHLS, bias_BHLS, scale, mask_value, float(softcap), blocks)
  return heads_first(out_BHLD)


def heads_first(x):
  """[B, L, H, D] <-> [B, H, L, D] (its own inverse)."""
  return jnp.swapaxes(x, 1, 2)


def _grouped(x_BHLD, kv_heads):
  b, h, l, d = x_BHLD.shape
  return x_BHLD.reshape(b, kv_heads, h // kv_heads, l, d)


def capped_scores(q_BLHD, k_BSKD, scale, softcap=0.0):
  """float32 [B, H, L, S]: q·kᵀ·scale, then c·tanh(· / c) when softcap c > 0 (Gemma-2).

  q [B, L, H, D]; k [B, S, K, D] (H % K == 0)."""
  return _scores(heads_first(q_BLHD), heads_first(k_BSKD), scale, softcap)


def _scores(q_BHLD, k_BKSD, scale, softcap=0.0):
  b, h, l, _ = q_BHLD.shape
  kv_heads, s = k_BKSD.shape[1], k_BKSD.shape[2]
  q, k = _grouped(q_BHLD, kv_heads), k_BKSD.astype(q_BHLD.dtype)
  if l == 1:  # one query (decoding): see _single_query
    scores = jnp.einsum('nsd,ngd->ngs', *_single_query(k, q), preferred_element_type=_F32)
  else:
    scores = jnp.einsum('bkgld,bksd->bkgls', q, k, preferred_element_type=_F32)
  scores = scores.reshape(b, h, l, s) * _F32(scale)
  return _F32(softcap) * jnp.tanh(scores / _F32(softcap)) if softcap else scores


def masked_logits(q_BLHD, k_BSKD, mask, bias, scale, mask_value, softcap=0.0):
  """float32 [B, H, L, S]: the (capped) scores + bias, `mask_value` where mask is False.

  q [B, L, H, D]; k [B, S, K, D] (H % K == 0); mask / bias broadcastable to [B, H, L, S]
  or None; softcap: see `capped_scores`."""
  logits = capped_scores(q_BLHD, k_BSKD, scale, softcap)
  return _bias_and_mask(logits, mask, bias, mask_value)


def _bias_and_mask(logits, mask, bias, mask_value):
  if bias is not None:
    logits = logits + bias.astype(_F32)
  if mask is not None:
    logits = jnp.where(mask, logits, _F32(mask_value))
  return logits


def weighted_values(p_BHLS, v_BSKD, dtype):
  """[B, L, H, D] in `dtype`: p [B, H, L, S] times v [B, S, K, D], float32 accumulation."""
  return heads_first(_weighted_values(p_BHLS, heads_first(v_BSKD), dtype))


def _weighted_values(p_BHLS, v_BKSD, dtype):
  b, h, l, s = p_BHLS.shape
  kv_heads = v_BKSD.shape[1]
  p = p_BHLS.reshape(b, kv_heads, h // kv_heads, l, s).astype(v_BKSD.dtype)
  if l == 1:
    v, p = _single_query(v_BKSD, p)
    out = jnp.einsum('ngs,nsd->ngd', p, v, preferred_element_type=_F32)
  else:
    out = jnp.einsum('bkgls,bksd->bkgld', p, v_BKSD, preferred_element_type=_F32)
  return out.reshape(b, h, l, -1).astype(dtype)


def _single_query(kv_BKSD, x_BKG1X):
  """One query row: ([B*K, S, D], [B*K, G, X]), a single batch axis for the dot.

  On XLA:CPU a single query's dots read a decoding cache stored [B*K, S, D]
  (tx/layers/attention.py) in place only in this form, the keys as the left operand;
  with [B, K] batch axes, or q on the left, it copies every head's keys, and at batch 1
  the whole updated cache, at every step (benchmarks/NOTES.md attempt 34)."""
  b, k, s, d = kv_BKSD.shape
  return kv_BKSD.reshape(b * k, s, d), x_BKG1X.reshape(b * k, x_BKG1X.shape[2], -1)


def _rows(x_BHLS, block):
  """A mask / bias restricted to the block's queries and keys (None stays None)."""
  a, b, c, d = block
  return None if x_BHLS is None else x_BHLS[:, :, a:b, c:d]


def _block_forward(q, k, v, mask, bias, scale, mask_value, softcap):
  """One block, heads-first: (out [B, H, l, D] in q's dtype, log-sum-exp [B, H, l, 1])."""
  logits = _bias_and_mask(_scores(q, k, scale, softcap), mask, bias, mask_value)
  top = jnp.max(logits, axis=-1, keepdims=True)
  # one exp over the scores: the values are weighted unnormalised and the [B, H, l, D]
  # result divided by the row sums, not the [B, H, l, S] weights
  unnormalised_BHLS = jnp.exp(logits - top)
  total_BHL1 = jnp.sum(unnormalised_BHLS, axis=-1, keepdims=True)
  lse_BHL1 = top + jnp.log(total_BHL1)
  out = _weighted_values(unnormalised_BHLS, v, _F32) / total_BHL1
  if mask is not None:  # rows that see nothing: zeros out, and exp(logits - inf) = 0 later
    seen = jnp.any(mask, axis=-1, keepdims=True)
    lse_BHL1 = jnp.where(seen, lse_BHL1, jnp.inf)
    out = jnp.where(seen, out, _F32(0))
  return out.astype(q.dtype), lse_BHL1


def _forward(q, k, v, mask, bias, scale, mask_value, softcap, blocks):
  outs, lses = zip(*(
      _block_forward(q[:, :, a:b], k[:, :, c:d], v[:, :, c:d], _rows(mask, blk),
                     _rows(bias, blk), scale, mask_value, softcap)
      for blk in blocks for a, b, c, d in [blk]))
  return jnp.concatenate(outs, axis=2), jnp.concatenate(lses, axis=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _attention(q, k, v, mask, bias, scale, mask_value, softcap, blocks):
  return _forward(q, k, v, mask, bias, scale, mask_value, softcap, blocks)[0]


def _attention_fwd(q, k, v, mask, bias, scale, mask_value, softcap, blocks):
  out, lse = _forward(q, k, v, mask, bias, scale, mask_value, softcap, blocks)
  return out, (q, k, v, mask, bias, out, lse)


def _block_backward(q, k, v, mask, bias, out, lse, d_out, scale, mask_value, softcap):
  """One block's gradients, float32: (d_q, d_k, d_v, d_bias or None), heads-first."""
  b, h, l, _ = q.shape
  kv_heads, s = k.shape[1], k.shape[2]
  scores_BHLS = _scores(q, k, scale, softcap)
  p_BHLS = jnp.exp(_bias_and_mask(scores_BHLS, mask, bias, mask_value) - lse)
  d_out_g = _grouped(d_out, kv_heads)
  grouped = lambda x_BHLS, dtype: x_BHLS.reshape(b, kv_heads, h // kv_heads, l, s).astype(dtype)
  d_v = jnp.einsum('bkgls,bkgld->bksd', grouped(p_BHLS, d_out.dtype), d_out_g,
                   preferred_element_type=_F32)
  d_p = jnp.einsum('bkgld,bksd->bkgls', d_out_g, v.astype(d_out.dtype),
                   preferred_element_type=_F32).reshape(b, h, l, s)
  row_BHL1 = jnp.einsum('bhld,bhld->bhl', d_out.astype(_F32), out.astype(_F32))[..., None]
  d_logits = p_BHLS * (d_p - row_BHL1)
  d_bias = None
  if bias is not None:
    summed = tuple(i for i in range(2) if bias.shape[i] == 1 and d_logits.shape[i] != 1)
    d_bias = jnp.sum(d_logits, axis=summed, keepdims=True)
  if softcap:  # d(c·tanh(x/c))/dx = 1 - tanh², and tanh = capped / c
    d_logits = d_logits * (1.0 - jnp.square(scores_BHLS / _F32(softcap)))
  d_scores = grouped(d_logits * _F32(scale), q.dtype)
  d_q = jnp.einsum('bkgls,bksd->bkgld', d_scores, k.astype(q.dtype),
                   preferred_element_type=_F32).reshape(q.shape)
  d_k = jnp.einsum('bkgls,bkgld->bksd', d_scores, _grouped(q, kv_heads),
                   preferred_element_type=_F32)
  return d_q, d_k, d_v, d_bias


def _placed(x, starts_ends, full_shape):
  """x zero-padded into `full_shape`, axis i holding [start, end) of it (one (start, end)
  per trailing axis of starts_ends; leading axes equal)."""
  lead = len(full_shape) - len(starts_ends)
  pads = [(0, 0)] * lead + [(s, full_shape[lead + i] - e) for i, (s, e) in enumerate(starts_ends)]
  return jnp.pad(x, pads)


def _attention_bwd(scale, mask_value, softcap, blocks, residuals, d_out):
  q, k, v, mask, bias, out, lse = residuals
  d_qs, d_k, d_v, d_bias = [], None, None, None
  add = lambda total, x: x if total is None else total + x
  for blk in blocks:
    a, b, c, d = blk
    dq_i, dk_i, dv_i, dbias_i = _block_backward(
        q[:, :, a:b], k[:, :, c:d], v[:, :, c:d], _rows(mask, blk), _rows(bias, blk),
        out[:, :, a:b], lse[:, :, a:b], d_out[:, :, a:b], scale, mask_value, softcap)
    d_qs.append(dq_i)
    d_k = add(d_k, _placed(dk_i, [(c, d), (0, k.shape[3])], k.shape))
    d_v = add(d_v, _placed(dv_i, [(c, d), (0, v.shape[3])], v.shape))
    if bias is not None:
      d_bias = add(d_bias, _placed(dbias_i, [(a, b), (c, d)], bias.shape))
  d_q = jnp.concatenate(d_qs, axis=2).astype(q.dtype)
  return (d_q, d_k.astype(k.dtype), d_v.astype(v.dtype), None,
          None if bias is None else d_bias.astype(bias.dtype))


_attention.defvjp(_attention_fwd, _attention_bwd)
