"""Statistics of attention scores for stability diagnostics (pure JAX, no Flax)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def max_attention_logit(q_BLHD, k_BSKD, scale: float) -> jax.Array:
  """max over batch, heads, queries and keys of q·kᵀ·scale: float32 scalar.

  The raw pre-softmax score (Wortsman et al. 2023's attention logit): no mask, no
  position bias, no soft-cap. q [B, L, H, D]; k [B, S, K, D] with H % K == 0 (query head h
  reads kv head h // (H // K), as in `dot_product_attention`). scale > 0. Gradients are
  stopped: this is a measurement.
  """
  q = jax.lax.stop_gradient(q_BLHD).astype(jnp.float32)
  k = jax.lax.stop_gradient(k_BSKD).astype(jnp.float32)
  b, l, h, d = q.shape
  kv = k.shape[2]
  q = q.reshape(b, l, kv, h // kv, d)
  return jnp.max(jnp.einsum('blkgd,bskd->bkgls', q, k)) * scale
