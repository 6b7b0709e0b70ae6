"""Token embeddings (with `attend` for a tied output head) and position embeddings."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tx import ops
from tx.config.base import choice, config
from tx.config.choices import MATMUL_IMPLS
from tx.layers.common import constrain, dtype, partitioned
from tx.ops.matmul import dense


def gathered(table_ND, rows: str):
  """The table with its embed dimension whole (under fsdp: all-gathered), rows as `rows`.

  A lookup from an embed-sharded table gives embed-sharded rows, which the batch-sharded
  activations cannot take without a full rematerialization, and the gradient's
  scatter-add of batch-sharded rows into an embed-sharded table is the same reshard
  backwards (XLA warns "Involuntary full rematerialization"). Gathering the table first is
  what fsdp does for every weight; its gradient is reduce-scattered back to the shards.
  """
  return constrain(table_ND, (rows, None))


@config
class EmbedConfig:
  vocab_size: int
  d_model: int
  scale_by_sqrt_dim: bool = False  # the 2017 paper multiplies embeddings by sqrt(d_model)
  init_stddev: float | None = None  # None = d_model ** -0.5 (unit-norm rows)
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  matmul: str = choice(*MATMUL_IMPLS)  # the tied output projection's product


class Embed(nn.Module):
  """tokens [B, L] int -> [B, L, D]; `attend(x [B, L, D]) -> logits [B, L, V]` reuses the table."""
  cfg: EmbedConfig

  def setup(self):
    cfg = self.cfg
    std = cfg.d_model ** -0.5 if cfg.init_stddev is None else cfg.init_stddev
    self.embedding = self.param(
        'embedding', partitioned(nn.initializers.normal(std), ('vocab', 'embed')),
        (cfg.vocab_size, cfg.d_model), dtype(cfg.param_dtype))

  def __call__(self, tokens_BL):
    cfg = self.cfg
    x_BLD = jnp.take(gathered(self.embedding, 'vocab'), tokens_BL, axis=0).astype(dtype(cfg.dtype))
    if cfg.scale_by_sqrt_dim:
      x_BLD = x_BLD * jnp.sqrt(jnp.asarray(cfg.d_model, dtype(cfg.dtype)))
    return x_BLD

  def attend(self, x_BLD):
    """The tied output projection: x · Eᵀ, logits [B, L, V] in the compute dtype."""
    table = self.embedding.astype(dtype(self.cfg.dtype))
    # one 2-D matmul (tx/ops/matmul.py)
    return dense(x_BLD.astype(table.dtype), table.T, impl=self.cfg.matmul)


@config
class PositionConfig:
  kind: str = choice('learned', 'sinusoidal')
  max_len: int = 512
  d_model: int = 256
  dtype: str = 'float32'
  param_dtype: str = 'float32'


class PositionEmbedding(nn.Module):
  """positions [B, L] int -> [B, L, D] added to the token embeddings.

  learned: a [max_len, D] table (GPT-2, BERT); sinusoidal: the 2017 paper's formula,
  computed at the given positions (so packed rows and cached decoding work).
  """
  cfg: PositionConfig

  @nn.compact
  def __call__(self, positions_BL):
    cfg = self.cfg
    if cfg.kind == 'sinusoidal':
      return ops.sinusoidal_embedding(positions_BL, cfg.d_model).astype(dtype(cfg.dtype))
    table = self.param('embedding',
                       partitioned(nn.initializers.normal(0.02), ('length', 'embed')),
                       (cfg.max_len, cfg.d_model), dtype(cfg.param_dtype))
    return jnp.take(gathered(table, 'length'), positions_BL, axis=0,
                    mode='clip').astype(dtype(cfg.dtype))
