"""Token embedding + position embedding (+ token types, + embedding norm, + dropout)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tx.config.choices import EMBEDDING
from tx.config.model import ModelConfig
from tx.layers.common import dropout, dtype, partitioned
from tx.layers.embed import Embed
from tx.layers.norm import Norm
from tx.models.layer_configs import norm_config, position_builder


class InputEmbedder(nn.Module):
  """tokens [B, L], positions [B, L] (, token_types [B, L]) -> x [B, L, D].

  The token table is passed in (`embed`) so an encoder-decoder can share it and a tied
  head can reuse it. EMBEDDING-kind positions (learned, sinusoidal) are added here; the
  other kinds (RoPE, ALiBi and T5 biases) act inside attention instead.
  """
  cfg: ModelConfig
  embed: Embed

  @nn.compact
  def __call__(self, tokens_BL, positions_BL, token_types_BL=None, *, deterministic=True):
    cfg = self.cfg
    x_BLD = self.embed(tokens_BL)
    build = position_builder(cfg, EMBEDDING)
    if build is not None:
      x_BLD = x_BLD + build(cfg)(positions_BL)
    if cfg.type_vocab_size:
      table = self.param('token_type_embedding',
                         partitioned(nn.initializers.normal(0.02), (None, 'embed')),
                         (cfg.type_vocab_size, cfg.d_model), dtype(cfg.param_dtype))
      types = jnp.zeros_like(tokens_BL) if token_types_BL is None else token_types_BL
      x_BLD = x_BLD + jnp.take(table, types, axis=0).astype(x_BLD.dtype)
    if cfg.embed_norm:
      x_BLD = Norm(norm_config(cfg), name='embed_norm')(x_BLD)
    return dropout(self, x_BLD, cfg.dropout, deterministic)
