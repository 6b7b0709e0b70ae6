"""LayerNorm and RMSNorm with their own small config."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config.base import choice, config
from tx.layers.common import dtype, partitioned


@config
class NormConfig:
  kind: str = choice('layernorm', 'rmsnorm')
  eps: float = 1e-6
  use_bias: bool = True  # LayerNorm only; RMSNorm has neither mean nor bias (T5, LLaMA)
  axis: str = 'embed'  # logical axis of scale / bias ('kv' for per-head q/k norms)
  dtype: str = 'float32'
  param_dtype: str = 'float32'


class Norm(nn.Module):
  """Normalises the last axis in float32 and returns `cfg.dtype`.

  layernorm: (x - mean) / sqrt(var + eps) * scale + bias
  rmsnorm:   x / sqrt(mean(x^2) + eps) * scale
  x [..., D] -> [..., D]
  """
  cfg: NormConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    d = x.shape[-1]
    x32 = x.astype(jnp.float32)
    if cfg.kind == 'layernorm':
      x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + cfg.eps)
    scale = self.param('scale', partitioned(nn.initializers.ones, (cfg.axis,)), (d,),
                       dtype(cfg.param_dtype))
    y = y * scale.astype(jnp.float32)
    if cfg.kind == 'layernorm' and cfg.use_bias:
      bias = self.param('bias', partitioned(nn.initializers.zeros, (cfg.axis,)), (d,),
                        dtype(cfg.param_dtype))
      y = y + bias.astype(jnp.float32)
    return y.astype(dtype(cfg.dtype))
