"""T5's learned, bucketed relative position bias (one table per stack, shared by its layers)."""

from __future__ import annotations

import flax.linen as nn

from tx import ops
from tx.config.base import config
from tx.layers.common import dtype, partitioned


@config
class RelativeBiasConfig:
  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = True  # encoders; decoders use causal buckets
  param_dtype: str = 'float32'


class RelativePositionBias(nn.Module):
  """q_pos [B, L], k_pos [B, S] -> additive bias [B, H, L, S] (float32)."""
  cfg: RelativeBiasConfig

  @nn.compact
  def __call__(self, q_pos_BL, k_pos_BS):
    cfg = self.cfg
    table_NH = self.param('rel_embedding',
                          partitioned(nn.initializers.normal(1.0), (None, 'heads')),
                          (cfg.num_buckets, cfg.num_heads), dtype(cfg.param_dtype))
    return ops.t5_relative_bias(table_NH, q_pos_BL, k_pos_BS, bidirectional=cfg.bidirectional,
                                num_buckets=cfg.num_buckets, max_distance=cfg.max_distance)
