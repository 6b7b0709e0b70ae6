"""The decoder tower: embeddings + a causal stack, optional cross-attention, a KV cache."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.layers.embed import Embed
from tx.models.attention_inputs import (PositionBias, default_positions, self_attention_mask,
                                        token_validity)
from tx.models.embedder import InputEmbedder
from tx.models.layer_configs import block_configs, norm_config
from tx.models.stack import Stack


class Decoder(nn.Module):
  """tokens [B, L] -> hidden [B, L, D]; position t sees positions <= t only.

  encoded [B, S, D] with cross_mask [B, 1, L|1, S] adds cross-attention (encoder-decoder).

  decode=True keeps a cache (collection 'cache'): the call made at init allocates it for
  its input length S_max; every later call appends its L tokens at the cache index and
  attends over everything cached so far. The tower keeps the index, which cache slots
  hold real tokens and their positions; each attention layer keeps its keys/values.
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
    valid_BL = token_validity(tokens_BL, segment_ids)
    cache_index = None
    if self.decode and self.has_variable('cache', 'index'):
      cache_index, positions, mask, k_pos = self._cached_inputs(tokens_BL, valid_BL, positions)
    else:
      if self.decode:
        self._allocate_cache(tokens_BL)
      if positions is None:
        positions = default_positions(tokens_BL, segment_ids)
      mask = self_attention_mask(valid_BL, segment_ids, causal=True)
      k_pos = positions
    x_BLD = InputEmbedder(cfg, self.embed, name='embedder')(
        tokens_BL, positions, deterministic=deterministic)
    bias = PositionBias(cfg, causal=True, name='position_bias')(positions, k_pos)
    stack = Stack(tuple(block_configs(cfg, self.num_layers, cross=self.cross, causal=True)),
                  final_norm=norm_config(cfg) if cfg.use_final_norm else None,
                  scan=cfg.scan_layers, remat=cfg.remat, deterministic=deterministic,
                  decode=self.decode, sow_weights=sow_weights, name='stack')
    return stack(x_BLD, mask, bias, positions, encoded, cross_mask, valid_BL, cache_index)

  def _allocate_cache(self, tokens_BL):
    b, s = tokens_BL.shape
    self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))
    self.variable('cache', 'key_valid', lambda: jnp.zeros((b, s), bool))
    self.variable('cache', 'key_positions', lambda: jnp.zeros((b, s), jnp.int32))

  def _cached_inputs(self, tokens_BL, valid_BL, positions):
    """Appends the new tokens' validity/positions; returns (index, positions, mask, k_pos)."""
    index = self.variable('cache', 'index', None)
    key_valid = self.variable('cache', 'key_valid', None)
    key_positions = self.variable('cache', 'key_positions', None)
    b, l = tokens_BL.shape
    start = index.value
    if positions is None:
      positions = default_positions(tokens_BL, offset=start)
    key_valid.value = jax.lax.dynamic_update_slice(key_valid.value, valid_BL, (0, start))
    key_positions.value = jax.lax.dynamic_update_slice(
        key_positions.value, positions.astype(jnp.int32), (0, start))
    index.value = start + l
    s = key_valid.value.shape[1]
    q_slot_L = start + jnp.arange(l)
    causal_LS = jnp.arange(s)[None, :] <= q_slot_L[:, None]
    mask = causal_LS[None, None] & key_valid.value[:, None, None, :]
    return start, positions, mask, key_positions.value
