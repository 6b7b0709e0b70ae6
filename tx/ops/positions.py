"""Position encodings: sinusoidal, RoPE, ALiBi and T5 relative buckets.

All take explicit integer positions ([B, L] for queries, [B, S] for keys), so
the same call serves full sequences, packed rows (`masks.segment_positions`) and
cached decoding (positions offset by the cache length).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np


# ----------------------------------------------------------------- sinusoidal

def sinusoidal_table(length, dim, base=10000.0, dtype=jnp.float32):
  """[length, dim] table of Vaswani et al. 2017, interleaved:

  PE[pos, 2i] = sin(pos / base^(2i/dim)), PE[pos, 2i+1] = cos(pos / base^(2i/dim)).
  """
  return sinusoidal_embedding(jnp.arange(length)[None, :], dim, base, dtype)[0]


def sinusoidal_embedding(positions_BL, dim, base=10000.0, dtype=jnp.float32):
  """positions [B, L] int -> [B, L, dim]: the sinusoidal table at explicit positions.

  Computed in float32 and cast to `dtype`. An odd `dim` ends with a sin column.
  """
  if dim <= 0:
    raise ValueError(f'dim must be positive, got {dim}')
  pos_BL1 = jnp.asarray(positions_BL, jnp.float32)[..., None]
  pair_D = np.arange(dim) // 2
  inv_freq_D = jnp.asarray(base ** (-2.0 * pair_D / dim), jnp.float32)
  angle_BLD = pos_BL1 * inv_freq_D
  even_D = jnp.asarray(np.arange(dim) % 2 == 0)
  return jnp.where(even_D, jnp.sin(angle_BLD), jnp.cos(angle_BLD)).astype(dtype)


# ----------------------------------------------------------------------- RoPE

def apply_rope(x_BLHD, positions_BL, theta=10000.0, fraction=1.0):
  """Rotary embedding of x [B, L, H, D] at positions [B, L] -> [B, L, H, D], x's dtype.

  Half-split (GPT-NeoX / LLaMA "rotate_half") convention on the first
  rot = int(D * fraction) dims, which must be even and positive:
    inv_freq = theta^(-arange(0, rot, 2) / rot); angle = pos * inv_freq
    x1, x2 = x[..., :rot/2], x[..., rot/2:rot]
    out = [x1 cos - x2 sin, x2 cos + x1 sin, x[..., rot:]]
  Computed in float32. Partial rotation (fraction < 1) is GPT-NeoX's rotary_pct.
  """
  x_BLHD = jnp.asarray(x_BLHD)
  if x_BLHD.ndim != 4:
    raise ValueError(f'x_BLHD must be 4-D [B, L, H, D], got shape {x_BLHD.shape}')
  D = x_BLHD.shape[-1]
  rot = int(D * fraction)
  if rot <= 0 or rot % 2:
    raise ValueError(f'fraction={fraction} gives {rot} rotated dims of D={D}; need a positive even number')
  pos_BL = jnp.asarray(positions_BL)
  if pos_BL.ndim != 2:
    raise ValueError(f'positions_BL must be 2-D [B, L], got shape {pos_BL.shape}')
  inv_freq_R = jnp.asarray(theta ** (-np.arange(0, rot, 2) / rot), jnp.float32)
  angle_BL1R = pos_BL.astype(jnp.float32)[:, :, None, None] * inv_freq_R
  cos, sin = jnp.cos(angle_BL1R), jnp.sin(angle_BL1R)
  x = x_BLHD.astype(jnp.float32)
  x1, x2, rest = x[..., :rot // 2], x[..., rot // 2:rot], x[..., rot:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
  return out.astype(x_BLHD.dtype)


# ---------------------------------------------------------------------- ALiBi

def alibi_slopes(num_heads):
  """float32 [H] head slopes of Press et al. 2022.

  n a power of two: slope_i = 2^(-8 i / n), i = 1..n (8 heads: 1/2 ... 1/256).
  Otherwise, as the reference code and HF BLOOM: the slopes of the closest
  power of two p below n, then slopes 0, 2, 4, ... of the 2p-head sequence until
  n slopes (12 heads: the 8-head slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
  """
  if not isinstance(num_heads, (int, np.integer)) or num_heads <= 0:
    raise ValueError(f'num_heads must be a positive int, got {num_heads!r}')
  return jnp.asarray(_alibi_slopes_list(int(num_heads)), jnp.float32)


def _alibi_slopes_list(n):
  def power_of_two(p):
    return [2.0 ** (-8.0 * i / p) for i in range(1, p + 1)]
  p = 2 ** int(math.floor(math.log2(n)))
  if p == n:
    return power_of_two(n)
  return power_of_two(p) + _alibi_slopes_list(2 * p)[0::2][:n - p]


def alibi_bias(num_heads, q_pos_BL, k_pos_BS, causal=True):
  """ALiBi bias float32 [B, H, L, S] for query positions [B, L] and key positions [B, S].

  causal: slope * (k_pos - q_pos), <= 0 for visible keys (future keys are masked
  elsewhere). Bidirectional (encoders): -slope * |q_pos - k_pos|.
  """
  rel_B1LS = _relative_positions(q_pos_BL, k_pos_BS)[:, None].astype(jnp.float32)
  slopes_1H11 = alibi_slopes(num_heads)[None, :, None, None]
  if causal:
    return slopes_1H11 * rel_B1LS
  return -slopes_1H11 * jnp.abs(rel_B1LS)


def _relative_positions(q_pos_BL, k_pos_BS):
  """[B, L, S] int: key_pos - query_pos."""
  q_pos_BL, k_pos_BS = jnp.asarray(q_pos_BL), jnp.asarray(k_pos_BS)
  if q_pos_BL.ndim != 2:
    raise ValueError(f'q_pos_BL must be 2-D [B, L], got shape {q_pos_BL.shape}')
  if k_pos_BS.ndim != 2:
    raise ValueError(f'k_pos_BS must be 2-D [B, S], got shape {k_pos_BS.shape}')
  return k_pos_BS[:, None, :] - q_pos_BL[:, :, None]


# ------------------------------------------------------------ T5 relative bias

def t5_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                                max_distance=128):
  """int32 bucket of each relative position (key_pos - query_pos), same shape.

  Mesh-TensorFlow / T5 bucketing: bidirectional uses half the buckets per
  direction (keys after the query in the upper half); within a direction the
  first half of the buckets hold exact distances, the rest are log-spaced up to
  max_distance and clipped at the last bucket. Causal (bidirectional=False)
  maps every key at or after the query to bucket 0.
  """
  n = -jnp.asarray(relative_position).astype(jnp.int32)
  ret = jnp.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret = ret + (n < 0).astype(jnp.int32) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  if max_exact < 1 or max_distance <= max_exact:
    raise ValueError(f'num_buckets={num_buckets} / max_distance={max_distance} leave no '
                     'room for exact and log buckets')
  is_small = n < max_exact
  # Clamp below at max_exact so log never sees 0; those entries take the is_small branch.
  n_large = jnp.maximum(n, max_exact).astype(jnp.float32)
  val_if_large = max_exact + (
      jnp.log(n_large / max_exact) / math.log(max_distance / max_exact)
      * (num_buckets - max_exact)).astype(jnp.int32)
  val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
  return ret + jnp.where(is_small, n, val_if_large)


def t5_relative_bias(table_NH, q_pos_BL, k_pos_BS, bidirectional=True, num_buckets=32,
                     max_distance=128):
  """T5 bias [B, H, L, S] (table's dtype) from a learned table [num_buckets, H]."""
  table_NH = jnp.asarray(table_NH)
  if table_NH.ndim != 2 or table_NH.shape[0] != num_buckets:
    raise ValueError(f'table_NH must be [num_buckets={num_buckets}, H], got shape {table_NH.shape}')
  bucket_BLS = t5_relative_position_bucket(
      _relative_positions(q_pos_BL, k_pos_BS), bidirectional, num_buckets, max_distance)
  values_BLSH = jnp.take(table_NH, bucket_BLS, axis=0)
  return jnp.transpose(values_BLSH, (0, 3, 1, 2))
