"""`build_model(config) -> flax.linen.Module` and small helpers around it."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.models.families import DecoderOnly, EncoderDecoder, EncoderOnly


# Settings that put PyTorch's CPU kernels into XLA's program through host callbacks: a
# training step's choice (`tx tune`). A cached decoding step multiplies a few rows, where each
# callback's hand-off costs more than the kernel saves (gpt_6l on the Intel 167 host: 5x
# slower at batch 1, 3x at batch 8; benchmarks/NOTES.md attempt 75), so decoding runs XLA's.
TORCH_KERNEL_SETTINGS = ('attention_impl', 'matmul_impl', 'norm_impl')


def build_model(cfg: ModelConfig, *, decode: bool = False) -> nn.Module:
  """The network for `cfg.family`; `decode=True` builds the cached-generation variant,
  which runs XLA's kernels where `cfg` asks for torch's (`TORCH_KERNEL_SETTINGS`)."""
  if decode:
    cfg = cfg.replace(**{k: 'auto' for k in TORCH_KERNEL_SETTINGS
                         if getattr(cfg, k).startswith('torch')})
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
