"""Choosing the next token from logits: temperature, top-k, top-p (nucleus), greedy.

Ties are broken towards the lower token id everywhere, as `argmax` does, so top-k 1
and a tiny top-p both reduce to greedy decoding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30
MASS_TOLERANCE = 1e-6  # float32 cumulative sums within this of p count as reaching p


def _scatter_rows(values_BV, order_BV):
  """out[b, order[b, i]] = values[b, i]: undoes a per-row permutation. [B, V] -> [B, V]."""
  rows = jnp.arange(values_BV.shape[0])[:, None]
  return jnp.zeros_like(values_BV).at[rows, order_BV].set(values_BV)


def top_k_filter(logits_BV, k: int):
  """Keeps exactly the k largest logits of each row (ties: lower ids first). [B, V] -> [B, V].

  The others become NEG_INF; k = 0 or k >= V keeps all.
  """
  if not k or k >= logits_BV.shape[-1]:
    return logits_BV
  _, idx_BK = jax.lax.top_k(logits_BV, k)
  rows = jnp.arange(logits_BV.shape[0])[:, None]
  keep = jnp.zeros(logits_BV.shape, bool).at[rows, idx_BK].set(True)
  return jnp.where(keep, logits_BV, NEG_INF)


def top_p_filter(logits_BV, p):
  """Nucleus filtering (Holtzman et al. 2020). [B, V] -> [B, V].

  Keeps the smallest set of most likely tokens whose probability mass reaches p: the
  token that crosses p is kept, none after it (ties: lower ids first, so the set is
  minimal even among equal probabilities). The most likely token always stays;
  p >= 1 keeps all. `p` may be a traced scalar.
  """
  if isinstance(p, (int, float)) and p >= 1.0:
    return logits_BV
  order_BV = jnp.argsort(-logits_BV, axis=-1, stable=True)
  sorted_logits = jnp.take_along_axis(logits_BV, order_BV, axis=-1)
  probs = jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly earlier tokens
  keep_sorted = (mass_before < p - MASS_TOLERANCE) | (p >= 1.0)
  keep_sorted = keep_sorted.at[:, 0].set(True)
  return jnp.where(_scatter_rows(keep_sorted, order_BV), logits_BV, NEG_INF)


def sample_logits(rng, logits_BV, *, temperature=1.0, top_k: int = 0, top_p=1.0,
                  greedy: bool = False):
  """int32 [B] from logits [B, V]: argmax if greedy, else a sample after temperature,
  top-k, then top-p (over the top-k renormalised distribution)."""
  if greedy:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  logits = logits_BV.astype(jnp.float32) / temperature
  logits = top_p_filter(top_k_filter(logits, top_k), top_p)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)
