"""Position encodings: sinusoidal, RoPE, ALiBi and T5 relative buckets.

All take explicit integer positions ([B, L] for queries, [B, S] for keys), so
the same call serves full sequences, packed rows (`masks.segment_positions`) and
cached decoding (positions offset by the cache length).
"""

from __future__ import annotations

import math
from typing import NamedTuple

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

ROPE_SCALING_KINDS = ('none', 'linear', 'dynamic', 'yarn', 'llama3')


class RopeScaling(NamedTuple):
  """A RoPE context-extension scheme: Hugging Face's `rope_type` and its parameters.

  kind: none | linear | dynamic | yarn | llama3; factor: the extension factor s;
  original_max_len: the pretraining context (HF `original_max_position_embeddings`; for
  'dynamic' HF's `max_position_embeddings`). llama3 reads low/high_freq_factor, yarn
  beta_fast/beta_slow/attention_factor (None = 0.1 ln(s) + 1)/truncate. Any object with
  these attributes works (tx's `RopeScalingConfig` has the same names).
  """
  kind: str = 'none'
  factor: float = 1.0
  original_max_len: int | None = None
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float | None = None
  truncate: bool = True


def rope_frequencies(rot_dim, theta=10000.0, scaling=None, seq_len=None):
  """(inv_freq float32 [rot_dim / 2], attention_factor float) of RoPE under `scaling`.

  Unscaled: inv_freq_i = theta^(-2i / rot_dim). With `scaling` (a `RopeScaling`), as
  Hugging Face's ROPE_INIT_FUNCTIONS (transformers/modeling_rope_utils.py), s = factor,
  n = original_max_len:
    linear   inv_freq / s (position p sees the unscaled angles of p / s).
    dynamic  NTK-aware base theta' = theta (s L / n - (s - 1))^(rot / (rot - 2)) with
             L = max(seq_len, n); for seq_len <= n (or None) the unscaled
             frequencies exactly. `seq_len` may be a traced int scalar (jit);
             `apply_rope` passes 1 + the largest position of its call.
    yarn     per frequency a blend of inv_freq (fast, extrapolated) and inv_freq / s
             (slow, interpolated), ramping between the dims that turn beta_fast and
             beta_slow times over n positions; attention_factor (default 0.1 ln s + 1)
             multiplies cos and sin, so q·k is scaled by its square.
    llama3   wavelengths 2π / inv_freq above n / low_freq_factor: inv_freq / s; below
             n / high_freq_factor: unchanged; in between a smooth blend.
  The attention factor is 1 except for yarn. Static kinds are computed on the host in
  float64 (HF computes in float32: they agree to ~1e-7 relative); dynamic in float32 jnp.
  """
  if rot_dim <= 0 or rot_dim % 2:
    raise ValueError(f'rot_dim must be a positive even number, got {rot_dim}')
  exponent = np.arange(0, rot_dim, 2) / rot_dim
  inv_freq = theta ** -exponent
  kind = 'none' if scaling is None else scaling.kind
  if kind == 'none':
    return jnp.asarray(inv_freq, jnp.float32), 1.0
  if kind not in ROPE_SCALING_KINDS:
    raise ValueError(f'unknown RoPE scaling kind {kind!r}; allowed: '
                     f'{", ".join(ROPE_SCALING_KINDS)}')
  s, n = float(scaling.factor), scaling.original_max_len
  if n is None or n <= 0:
    raise ValueError(f'RoPE scaling {kind!r} needs original_max_len > 0, got {n}')
  if kind == 'linear':
    return jnp.asarray(inv_freq / s, jnp.float32), 1.0
  if kind == 'llama3':
    return jnp.asarray(_llama3(inv_freq, s, n, scaling), jnp.float32), 1.0
  if kind == 'yarn':
    return _yarn(inv_freq, theta, rot_dim, s, n, scaling)
  return _dynamic_ntk(inv_freq, theta, rot_dim, s, n, seq_len), 1.0


def _llama3(inv_freq, s, n, scaling):
  lo, hi = scaling.low_freq_factor, scaling.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  smooth = (n / wavelen - lo) / (hi - lo)
  blended = (1 - smooth) * inv_freq / s + smooth * inv_freq
  out = np.where(wavelen > n / lo, inv_freq / s, inv_freq)
  medium = (wavelen >= n / hi) & (wavelen <= n / lo)
  return np.where(medium, blended, out)


def _yarn(inv_freq, theta, rot_dim, s, n, scaling):
  def correction_dim(rotations):  # the dim whose wavelength turns `rotations` times over n
    return rot_dim * math.log(n / (rotations * 2 * math.pi)) / (2 * math.log(theta))
  low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
  if scaling.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, rot_dim - 1)
  if low == high:
    high += 0.001  # as HF: avoids a zero-width ramp
  ramp = np.clip((np.arange(rot_dim // 2) - low) / (high - low), 0, 1)
  extrapolated = 1 - ramp  # 1 on the fast (high-frequency) dims
  out = inv_freq / s * ramp + inv_freq * extrapolated
  factor = scaling.attention_factor
  if factor is None:
    factor = 0.1 * math.log(s) + 1.0 if s > 1 else 1.0
  return jnp.asarray(out, jnp.float32), float(factor)


def _dynamic_ntk(inv_freq, theta, rot_dim, s, n, seq_len):
  static = jnp.asarray(inv_freq, jnp.float32)
  if seq_len is None:
    return static
  length = jnp.maximum(jnp.asarray(seq_len, jnp.float32), n)
  base = theta * (s * length / n - (s - 1)) ** (rot_dim / (rot_dim - 2))
  exponent = jnp.arange(0, rot_dim, 2, dtype=jnp.float32) / rot_dim
  return jnp.where(length > n, 1.0 / base ** exponent, static)


def apply_rope(x_BLHD, positions_BL, theta=10000.0, fraction=1.0, *, scaling=None,
               interleaved=False):
  """Rotary embedding of x [B, L, H, D] at positions [B, L] -> [B, L, H, D], x's dtype.

  Rotates the first rot = int(D * fraction) dims (positive, even; fraction < 1 is
  GPT-NeoX's rotary_pct / GPT-J's rotary_dim), the rest pass through unchanged:
    inv_freq = theta^(-arange(0, rot, 2) / rot) (or `rope_frequencies` under `scaling`)
    angle = pos * inv_freq
  and pairs (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). Pairs are
    half-split   (interleaved=False; GPT-NeoX / LLaMA "rotate_half"):
                 x1 = x[..., :rot/2], x2 = x[..., rot/2:rot]
    interleaved  (interleaved=True; GPT-J, the RoFormer paper):
                 x1 = x[..., 0:rot:2], x2 = x[..., 1:rot:2], outputs interleaved back.
  The two layouts are the same rotation up to a permutation of the rotated dims.

  scaling: a `RopeScaling` (kind 'none' or None = plain RoPE). yarn's attention factor
  multiplies cos and sin (the rotated dims only), as in HF. 'dynamic' takes its length
  from this call: seq_len = 1 + the largest position in positions_BL over the whole
  batch (HF's `dynamic_rope_update` uses max(position_ids) + 1 the same way). In cached
  decoding each call's new keys are rotated with the base of that call's length and
  stored, so earlier keys keep the base they were written with; HF does the same, so
  greedy generation of a fresh HF model (whose cached length only grows) matches, but
  HF keeps a grown base across later calls (until the length drops below n) where tx
  recomputes it per call.
  Computed in float32.
  """
  x_BLHD = jnp.asarray(x_BLHD)
  if x_BLHD.ndim != 4:
    raise ValueError(f'x_BLHD must be 4-D [B, L, H, D], got shape {x_BLHD.shape}')
  D = x_BLHD.shape[-1]
  rot = int(D * fraction)
  if rot <= 0 or rot % 2:
    raise ValueError(f'fraction={fraction} gives {rot} rotated dims of D={D}; '
                     'need a positive even number')
  pos_BL = jnp.asarray(positions_BL)
  if pos_BL.ndim != 2:
    raise ValueError(f'positions_BL must be 2-D [B, L], got shape {pos_BL.shape}')
  seq_len = None
  if scaling is not None and scaling.kind == 'dynamic':
    seq_len = jnp.max(pos_BL) + 1
  inv_freq_R, attention_factor = rope_frequencies(rot, theta, scaling, seq_len)
  angle_BL1R = pos_BL.astype(jnp.float32)[:, :, None, None] * inv_freq_R
  cos, sin = jnp.cos(angle_BL1R), jnp.sin(angle_BL1R)
  if attention_factor != 1.0:
    cos, sin = cos * attention_factor, sin * attention_factor
  x = x_BLHD.astype(jnp.float32)
  rest = x[..., rot:]
  if interleaved:
    x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
    pairs = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    out = jnp.concatenate([pairs.reshape(*x.shape[:-1], rot), rest], axis=-1)
  else:
    x1, x2 = x[..., :rot // 2], x[..., rot // 2:rot]
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
