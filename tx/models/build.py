"""`build_model(config) -> flax.linen.Module` and small helpers around it."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.models.families import DecoderOnly, EncoderDecoder, EncoderOnly


def build_model(cfg: ModelConfig, *, decode: bool = False) -> nn.Module:
  """The network for `cfg.family`; `decode=True` builds the cached-generation variant."""
  if cfg.family == 'decoder':
    return DecoderOnly(cfg, decode=decode)
  if cfg.family == 'encoder':
    if decode:
      raise ValueError('model.family=encoder does not generate; decode=True needs a decoder')
    return EncoderOnly(cfg)
  return EncoderDecoder(cfg, decode=decode)


def dummy_inputs(cfg: ModelConfig, batch: int = 1, length: int | None = None):
  """Positional arguments for `init`: token arrays of ones, [batch, length]."""
  length = length or min(cfg.max_len, 8)
  tokens = jnp.ones((batch, length), jnp.int32)
  return (tokens, tokens) if cfg.family == 'encoder_decoder' else (tokens,)


def init_params(cfg: ModelConfig, rng, batch: int = 1, length: int | None = None):
  """Initialised parameters (logically boxed: `nn.unbox` them for plain arrays)."""
  return build_model(cfg).init(rng, *dummy_inputs(cfg, batch, length))['params']


def count_params(params) -> int:
  """Number of scalars in a parameter tree (boxed or not)."""
  return sum(x.size for x in jax.tree_util.tree_leaves(nn.unbox(params)))
