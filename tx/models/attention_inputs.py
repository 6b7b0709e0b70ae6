"""Masks and position biases for a stack's self-attention, built once per forward pass.

Every global layer of a stack receives the same mask and bias, every local (sliding-
window) layer the same local mask and bias: ALiBi's fixed slopes and T5's learned bucket
table (held by the stack, as in T5 where the first layer owns it) are computed here, not
in each layer.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tx import ops
from tx.config.choices import BIAS
from tx.config.model import ModelConfig
from tx.models.layer_configs import position_builder


def token_validity(tokens_BL, segment_ids_BL=None):
  """bool [B, L]: real tokens (pad id 0), or non-zero segments for packed rows."""
  if segment_ids_BL is not None:
    return segment_ids_BL != 0
  return ops.padding_mask(tokens_BL)


def default_positions(tokens_BL, segment_ids_BL=None, offset=0):
  """int32 [B, L]: 0..L-1 (+offset), restarting per segment for packed rows."""
  if segment_ids_BL is not None:
    return ops.segment_positions(segment_ids_BL)
  b, l = tokens_BL.shape
  return jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32)[None, :] + offset, (b, l))


def self_attention_mask(valid_BL, segment_ids_BL=None, *, causal: bool):
  """bool [B, 1, L, L]: keys that are real (same segment if packed), causal if asked."""
  if segment_ids_BL is not None:
    mask = ops.segment_mask(segment_ids_BL, segment_ids_BL)
  else:
    mask = ops.key_padding_mask(valid_BL)
  if causal:
    l = valid_BL.shape[1]
    mask = ops.combine_masks(mask, ops.causal_mask(l))
  return mask


def local_attention_mask(mask, q_pos_BL, k_pos_BS, window: int, *, causal: bool):
  """`mask` [B|1, 1, L, S] restricted to a sliding window of `window` positions: a query
  at position i keeps the keys at i - window + 1 .. i (causal) or |i - j| < window
  (bidirectional); ops.sliding_window_mask has the correspondence with transformers."""
  window_B1LS = ops.sliding_window_mask(q_pos_BL, k_pos_BS, window, bidirectional=not causal)
  return ops.combine_masks(mask, window_B1LS)


class PositionBias(nn.Module):
  """q_pos [B, L], k_pos [B, S] -> additive bias [B, H, L, S] for a BIAS-kind position
  scheme (ALiBi, T5), else None."""
  cfg: ModelConfig
  causal: bool

  @nn.compact
  def __call__(self, q_pos_BL, k_pos_BS):
    build = position_builder(self.cfg, BIAS)
    return None if build is None else build(self.cfg, self.causal)(q_pos_BL, k_pos_BS)
