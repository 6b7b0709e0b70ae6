"""Choosing the next token from logits: temperature, top-k, top-p (nucleus), greedy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def top_k_filter(logits_BV, k: int):
  """Keeps the k largest logits of each row (ties at the k-th value kept); k=0 keeps all."""
  if not k or k >= logits_BV.shape[-1]:
    return logits_BV
  kth = jax.lax.top_k(logits_BV, k)[0][..., -1:]
  return jnp.where(logits_BV < kth, NEG_INF, logits_BV)


def top_p_filter(logits_BV, p: float):
  """Nucleus filtering: keeps the smallest set of most likely tokens whose probability
  mass reaches p, including the token that crosses p. p >= 1 keeps all. [B, V] -> [B, V]."""
  if isinstance(p, (int, float)) and p >= 1.0:
    return logits_BV
  order = jnp.argsort(-logits_BV, axis=-1)
  sorted_logits = jnp.take_along_axis(logits_BV, order, axis=-1)
  probs = jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
  keep_sorted = (mass_before < p) | (p >= 1.0)  # the first token always stays
  keep = jnp.zeros_like(keep_sorted).at[
      jnp.arange(logits_BV.shape[0])[:, None], order].set(keep_sorted)
  return jnp.where(keep, logits_BV, NEG_INF)


def sample_logits(rng, logits_BV, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, greedy: bool = False):
  """int32 [B]: argmax if greedy, else a sample after temperature, top-k and top-p."""
  if greedy:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  logits = logits_BV.astype(jnp.float32) / temperature
  logits = top_p_filter(top_k_filter(logits, top_k), top_p)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)
