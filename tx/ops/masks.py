"""Boolean attention masks (True = may attend) and helpers around them.

Masks are shaped to broadcast against attention logits [B, H, L, S]: a
per-example mask is [B, 1, L, S], a shared one [1, 1, L, S]. Combine them with
`combine_masks` and pass the result as `mask=` to `dot_product_attention`, or
turn it into an additive bias with `mask_to_bias`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# The score attention's kernels give a hidden key (tx/ops/attention.py): finite, so a fully
# masked row stays NaN-free (softmax of equal values).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def padding_mask(tokens_BL, pad_id=0):
  """tokens [B, L] int -> bool [B, L], True where a real (non-pad) token."""
  return jnp.asarray(tokens_BL) != pad_id


def key_padding_mask(valid_BS):
  """valid [B, S] bool -> bool [B, 1, 1, S]: every query may see the valid keys."""
  valid_BS = _check_2d(valid_BS, 'valid_BS')
  return valid_BS.astype(bool)[:, None, None, :]


def causal_mask(q_len, k_len=None, offset=0):
  """bool [1, 1, L, S]: key j visible to query i iff j <= i + offset.

  k_len defaults to q_len. offset shifts the queries, e.g. offset = S - L when L
  new queries follow S - L cached keys; it may be a traced scalar.
  """
  k_len = q_len if k_len is None else k_len
  i_L1 = jnp.arange(q_len)[:, None]
  j_1S = jnp.arange(k_len)[None, :]
  return (j_1S <= i_L1 + offset)[None, None]


def causal_mask_from_positions(q_pos_BL, k_pos_BS):
  """Positions q [B, L], k [B, S] int -> bool [B, 1, L, S]: k_pos <= q_pos."""
  q_pos_BL = _check_2d(q_pos_BL, 'q_pos_BL')
  k_pos_BS = _check_2d(k_pos_BS, 'k_pos_BS')
  return (k_pos_BS[:, None, None, :] <= q_pos_BL[:, None, :, None])


def sliding_window_mask(q_pos_BL, k_pos_BS, window: int, *, bidirectional: bool = False):
  """Positions q [B, L], k [B, S] int -> bool [B, 1, L, S]: the keys inside the window.

  One-sided (default): q_pos - k_pos < window, i.e. a query at position i sees keys
  i - window + 1 .. i once combined with a causal mask (window keys, itself included):
  transformers' `sliding_window_overlay(window)` (Mistral, Gemma-2 local layers).
  bidirectional: |q_pos - k_pos| < window (2·window - 1 keys), which is transformers'
  `sliding_window_bidirectional_overlay(window - 1)` (that one counts |i - j| <= w).
  An overlay: combine it with the padding / segment / causal masks (`combine_masks`).
  Positions, not slots, so left-padded and packed rows (positions restarting per
  segment) see the same window as an unpadded row.
  """
  if int(window) < 1:
    raise ValueError(f'window must be >= 1, got {window}')
  q_pos_BL = _check_2d(q_pos_BL, 'q_pos_BL')
  k_pos_BS = _check_2d(k_pos_BS, 'k_pos_BS')
  distance_B1LS = q_pos_BL[:, None, :, None] - k_pos_BS[:, None, None, :]
  if bidirectional:
    distance_B1LS = jnp.abs(distance_B1LS)
  return distance_B1LS < window


def segment_mask(q_seg_BL, k_seg_BS):
  """Segment ids q [B, L], k [B, S] int -> bool [B, 1, L, S].

  True iff query and key have the same segment id and both are non-zero
  (segment 0 = padding), so packed examples never see each other.
  """
  q_seg_BL = _check_2d(q_seg_BL, 'q_seg_BL')
  k_seg_BS = _check_2d(k_seg_BS, 'k_seg_BS')
  q_B1L1 = q_seg_BL[:, None, :, None]
  k_B11S = k_seg_BS[:, None, None, :]
  return (q_B1L1 == k_B11S) & (q_B1L1 != 0) & (k_B11S != 0)


def cross_attention_mask(q_valid_BL, k_valid_BS):
  """Decoder validity [B, L] x encoder validity [B, S] bool -> bool [B, 1, L, S].

  Padded decoder queries see nothing (their outputs are exact zeros) and no
  query sees padded encoder keys.
  """
  q_valid_BL = _check_2d(q_valid_BL, 'q_valid_BL').astype(bool)
  k_valid_BS = _check_2d(k_valid_BS, 'k_valid_BS').astype(bool)
  return q_valid_BL[:, None, :, None] & k_valid_BS[:, None, None, :]


def combine_masks(*masks):
  """Logical AND of bool masks with broadcasting; None arguments are ignored.

  Returns a bool array of the broadcast shape, or None if every mask is None.
  """
  masks = [jnp.asarray(m, bool) for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = jnp.logical_and(out, m)
  return out


def mask_to_bias(mask, dtype=jnp.float32):
  """bool mask (any shape) -> additive bias of the same shape in `dtype`.

  0 where True and a large finite negative where False: -1e9 for float32 /
  bfloat16 / float64, finfo(dtype).min / 2 for float16. Finite, so a fully masked
  row gives a uniform softmax instead of NaN; adding two such biases stays finite
  except in float16.
  """
  dtype = jnp.dtype(dtype)
  neg = max(float(jnp.finfo(dtype).min) / 2, -1e9)
  return jnp.where(jnp.asarray(mask, bool), jnp.zeros((), dtype), jnp.asarray(neg, dtype))


def segment_positions(segment_ids_BL):
  """Segment ids [B, L] int -> int32 [B, L] positions restarting at 0 per segment.

  A new segment starts wherever the id changes (and at index 0), so a packed row
  [1, 1, 1, 2, 2, 0, 0] gives [0, 1, 2, 0, 1, 0, 1]; a padding run counts like a
  segment (it is masked out anyway).
  """
  seg_BL = _check_2d(segment_ids_BL, 'segment_ids_BL')
  L = seg_BL.shape[1]
  idx_BL = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), seg_BL.shape)
  starts_BL = jnp.concatenate(
      [jnp.ones_like(seg_BL[:, :1], bool), seg_BL[:, 1:] != seg_BL[:, :-1]], axis=1)
  start_idx_BL = jax.lax.cummax(jnp.where(starts_BL, idx_BL, 0), axis=1)
  return idx_BL - start_idx_BL


def _check_2d(x, name):
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'{name} must be 2-D [B, length], got shape {x.shape}')
  return x
