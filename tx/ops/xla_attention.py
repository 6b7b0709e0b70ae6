"""The XLA attention path: softmax(q·kᵀ·scale + bias) masked, times v, with its own backward.

The backward recomputes the probabilities from the saved log-sum-exp (one value per
query row) and uses rowsum(dO * O) for the softmax's correction term, as flash attention
does, instead of the rowsum(dP * P) that autodiff of a softmax produces. On XLA:CPU the
latter is fused into the small batched dO·Vᵀ dot and made it the slowest op of a training
step (measurements: benchmarks/NOTES.md).
Only q, k, v, the output and the log-sum-exp are kept for the backward, not the
[B, H, L, S] probabilities.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def xla_attention(q_BLHD, k_BSKD, v_BSKD, mask_BHLS, bias_BHLS, scale: float,
                  mask_value: float, softcap: float = 0.0):
  """out [B, L, H, D] in q's dtype; H % K == 0 (grouped-query: head h reads kv head h // (H//K)).

  mask_BHLS: bool [B|1, H|1, L, S] or None; bias_BHLS: float [B|1, H|1, L, S] or None (its
  gradient is returned). softcap c > 0: the scores q·kᵀ·scale become c·tanh(scores / c)
  before the bias and the mask. A query row that sees no key outputs exactly zeros
  (gradients too). Logits, softmax and accumulation in float32.
  """
  return _attention(q_BLHD, k_BSKD, v_BSKD, mask_BHLS, bias_BHLS, scale, mask_value,
                    float(softcap))


def _grouped(x_BLHD, kv_heads):
  b, l, h, d = x_BLHD.shape
  return x_BLHD.reshape(b, l, kv_heads, h // kv_heads, d)


def capped_scores(q_BLHD, k_BSKD, scale, softcap=0.0):
  """float32 [B, H, L, S]: q·kᵀ·scale, then c·tanh(· / c) when softcap c > 0 (Gemma-2).

  q [B, L, H, D]; k [B, S, K, D] (H % K == 0)."""
  b, l, h, _ = q_BLHD.shape
  s, kv_heads = k_BSKD.shape[1], k_BSKD.shape[2]
  scores = jnp.einsum('blkgd,bskd->bkgls', _grouped(q_BLHD, kv_heads),
                      k_BSKD.astype(q_BLHD.dtype), preferred_element_type=_F32)
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
  b, h, l, s = p_BHLS.shape
  kv_heads = v_BSKD.shape[2]
  out = jnp.einsum('bkgls,bskd->blkgd',
                   p_BHLS.reshape(b, kv_heads, h // kv_heads, l, s).astype(v_BSKD.dtype),
                   v_BSKD, preferred_element_type=_F32)
  return out.reshape(b, l, h, -1).astype(dtype)


def _forward(q, k, v, mask, bias, scale, mask_value, softcap):
  logits = masked_logits(q, k, mask, bias, scale, mask_value, softcap)
  top = jnp.max(logits, axis=-1, keepdims=True)
  lse_BHL1 = top + jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1, keepdims=True))
  if mask is not None:  # rows that see nothing: exp(logits - inf) = 0, so zeros out
    lse_BHL1 = jnp.where(jnp.any(mask, axis=-1, keepdims=True), lse_BHL1, jnp.inf)
  out = weighted_values(jnp.exp(logits - lse_BHL1), v, q.dtype)
  return out, lse_BHL1


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attention(q, k, v, mask, bias, scale, mask_value, softcap):
  return _forward(q, k, v, mask, bias, scale, mask_value, softcap)[0]


def _attention_fwd(q, k, v, mask, bias, scale, mask_value, softcap):
  out, lse = _forward(q, k, v, mask, bias, scale, mask_value, softcap)
  return out, (q, k, v, mask, bias, out, lse)


def _attention_bwd(scale, mask_value, softcap, residuals, d_out_BLHD):
  q, k, v, mask, bias, out, lse = residuals
  b, l, h, _ = q.shape
  s, kv_heads = k.shape[1], k.shape[2]
  scores_BHLS = capped_scores(q, k, scale, softcap)
  p_BHLS = jnp.exp(_bias_and_mask(scores_BHLS, mask, bias, mask_value) - lse)
  d_out = _grouped(d_out_BLHD, kv_heads)
  grouped = lambda x_BHLS, dtype: x_BHLS.reshape(b, kv_heads, h // kv_heads, l, s).astype(dtype)
  d_v = jnp.einsum('bkgls,blkgd->bskd', grouped(p_BHLS, d_out.dtype), d_out,
                   preferred_element_type=_F32).astype(v.dtype)
  d_p = jnp.einsum('blkgd,bskd->bkgls', d_out, v.astype(d_out.dtype),
                   preferred_element_type=_F32).reshape(b, h, l, s)
  row_BHL1 = jnp.einsum('blhd,blhd->bhl', d_out_BLHD.astype(_F32),
                        out.astype(_F32))[..., None]
  d_logits = p_BHLS * (d_p - row_BHL1)
  d_bias = None
  if bias is not None:
    summed = tuple(i for i in range(2) if bias.shape[i] == 1 and d_logits.shape[i] != 1)
    d_bias = jnp.sum(d_logits, axis=summed, keepdims=True).astype(bias.dtype)
  if softcap:  # d(c·tanh(x/c))/dx = 1 - tanh², and tanh = capped / c
    d_logits = d_logits * (1.0 - jnp.square(scores_BHLS / _F32(softcap)))
  d_scores = grouped(d_logits * _F32(scale), q.dtype)
  d_q = jnp.einsum('bkgls,bskd->blkgd', d_scores, k.astype(q.dtype),
                   preferred_element_type=_F32).reshape(q.shape).astype(q.dtype)
  d_k = jnp.einsum('bkgls,blkgd->bskd', d_scores, _grouped(q, kv_heads),
                   preferred_element_type=_F32).astype(k.dtype)
  return d_q, d_k, d_v, None, d_bias


_attention.defvjp(_attention_fwd, _attention_bwd)
