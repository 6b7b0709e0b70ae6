"""The decoder tower: embeddings + a causal stack, optional cross-attention, a KV cache."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx import ops
from tx.config.model import ModelConfig
from tx.layers.attention import write_ring
from tx.layers.embed import Embed
from tx.models.attention_inputs import (PositionBias, default_positions, local_attention_mask,
                                        self_attention_mask, token_validity)
from tx.models.embedder import InputEmbedder
from tx.models.layer_configs import block_configs, norm_config
from tx.models.stack import Stack


class Decoder(nn.Module):
  """tokens [B, L] -> hidden [B, L, D]; position t sees positions <= t only (local layers,
  `model.attention_window` W: positions t - W + 1 .. t).

  The window counts positions; without a cache, causal query blocks
  (`model.attention_causal_blocks`) skip the keys W or more slots back, which is exact
  when positions advance by at least one per slot within a sequence (the default, packed
  and left-padded positions all do).

  encoded [B, S, D] with cross_mask [B, 1, L|1, S] adds cross-attention (encoder-decoder).

  decode=True keeps a cache (collection 'cache'): the call made at init allocates it for
  its input length S_max; every later call appends its L tokens at the cache index and
  attends over everything cached so far. The tower keeps the index (tokens written so
  far) and, for the global layers, which of the S_max slots hold real tokens and their
  positions ('key_valid', 'key_positions' [B, S_max]); each global layer keeps its
  keys/values [B, K, S_max, D]. Local layers share a ring of R = min(W, S_max) slots
  (token t in slot t mod R): the tower keeps 'ring_valid' / 'ring_positions' [B, R],
  each local layer its ring keys/values [B, K, R, D], and a call attends over
  [ring, new tokens] (R + L keys). A model without global layers keeps nothing of
  length S_max.
  """
  cfg: ModelConfig
  embed: Embed
  num_layers: int
  cross: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, tokens_BL, *, encoded=None, cross_mask=None, positions=None,
               segment_ids=None, deterministic=True, sow_weights=False):
    cfg = self.cfg
    blocks = tuple(block_configs(cfg, self.num_layers, cross=self.cross, causal=True))
    window = cfg.attention_window if any(b.attention.window for b in blocks) else 0
    has_global = not all(b.attention.window for b in blocks)
    valid_BL = token_validity(tokens_BL, segment_ids)
    cache_index = None
    if self.decode and self.has_variable('cache', 'index'):
      cache_index = self.get_variable('cache', 'index')
      if positions is None:
        positions = default_positions(tokens_BL, offset=cache_index)
      positions = positions.astype(jnp.int32)
      mask, k_pos = self._cached_global(valid_BL, positions) if has_global else (None, None)
      local_mask, local_k_pos = (self._cached_local(valid_BL, positions, window) if window
                                 else (None, None))
      self.put_variable('cache', 'index', cache_index + tokens_BL.shape[1])
    else:
      if self.decode:
        self._allocate_cache(tokens_BL, has_global, window)
      if positions is None:
        positions = default_positions(tokens_BL, segment_ids)
      mask = self_attention_mask(valid_BL, segment_ids, causal=True)
      local_mask = (local_attention_mask(mask, positions, positions, window, causal=True)
                    if window else None)
      k_pos = local_k_pos = positions
    x_BLD = InputEmbedder(cfg, self.embed, name='embedder')(
        tokens_BL, positions, deterministic=deterministic)
    position_bias = PositionBias(cfg, causal=True, name='position_bias')
    bias = position_bias(positions, k_pos) if k_pos is not None else None
    local_bias = None
    if window:
      local_bias = bias if local_k_pos is k_pos else position_bias(positions, local_k_pos)
    stack = Stack(blocks, final_norm=norm_config(cfg) if cfg.use_final_norm else None,
                  scan=cfg.scan_layers, remat=cfg.remat, deterministic=deterministic,
                  decode=self.decode, sow_weights=sow_weights, name='stack')
    return stack(x_BLD, mask, bias, positions, encoded, cross_mask, valid_BL, cache_index,
                 local_mask, local_bias)

  def _allocate_cache(self, tokens_BL, has_global: bool, window: int):
    b, s = tokens_BL.shape
    self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))
    if has_global:
      self.variable('cache', 'key_valid', lambda: jnp.zeros((b, s), bool))
      self.variable('cache', 'key_positions', lambda: jnp.zeros((b, s), jnp.int32))
    if window:
      r = min(window, s)
      self.variable('cache', 'ring_valid', lambda: jnp.zeros((b, r), bool))
      self.variable('cache', 'ring_positions', lambda: jnp.zeros((b, r), jnp.int32))

  def _cached_global(self, valid_BL, positions_BL):
    """Appends the new tokens' validity/positions at the index; returns (mask [B, 1, L, S_max],
    key positions [B, S_max]): real cached slots up to each query's own."""
    key_valid = self.variable('cache', 'key_valid', None)
    key_positions = self.variable('cache', 'key_positions', None)
    start = self.get_variable('cache', 'index')
    l = valid_BL.shape[1]
    key_valid.value = jax.lax.dynamic_update_slice(key_valid.value, valid_BL, (0, start))
    key_positions.value = jax.lax.dynamic_update_slice(key_positions.value, positions_BL,
                                                       (0, start))
    s = key_valid.value.shape[1]
    q_slot_L = start + jnp.arange(l)
    causal_LS = jnp.arange(s)[None, :] <= q_slot_L[:, None]
    mask = causal_LS[None, None] & key_valid.value[:, None, None, :]
    return mask, key_positions.value

  def _cached_local(self, valid_BL, positions_BL, window: int):
    """The local layers' keys are [ring (before this call), new tokens]: returns (mask
    [B, 1, L, R + L], key positions [B, R + L]), then writes the new tokens into the ring.

    A ring slot is seen if it holds a real token inside the query's window (every ring
    token precedes the new ones); a new token as in training: causal, real, in the window.
    """
    ring_valid = self.variable('cache', 'ring_valid', None)
    ring_positions = self.variable('cache', 'ring_positions', None)
    start = self.get_variable('cache', 'index')
    old_valid_BR, old_pos_BR = ring_valid.value, ring_positions.value
    ring_mask = ops.combine_masks(ops.key_padding_mask(old_valid_BR),
                                  ops.sliding_window_mask(positions_BL, old_pos_BR, window))
    new_mask = local_attention_mask(self_attention_mask(valid_BL, causal=True), positions_BL,
                                    positions_BL, window, causal=True)
    ring_valid.value = write_ring(old_valid_BR, valid_BL, start, axis=1)
    ring_positions.value = write_ring(old_pos_BR, positions_BL, start, axis=1)
    return (jnp.concatenate([ring_mask, new_mask], axis=-1),
            jnp.concatenate([old_pos_BR, positions_BL], axis=1))
