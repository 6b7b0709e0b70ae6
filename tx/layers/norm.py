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
  scale_offset: bool = False  # True: multiply by (1 + scale), scale initialised at 0 (Gemma)
  dtype: str = 'float32'
  param_dtype: str = 'float32'


class Norm(nn.Module):
  """Normalises the last axis in float32 and returns `cfg.dtype`.

  layernorm: (x - mean) / sqrt(var + eps) * scale + bias
  rmsnorm:   x / sqrt(mean(x^2) + eps) * scale
  x [..., D] -> [..., D]

  With `scale_offset` the factor is (1 + scale) and `scale` starts at 0 (Gemma's
  RMSNorm), so a checkpoint stored that way loads bitwise; at init both forms are the
  identity factor.
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
    init = nn.initializers.zeros if cfg.scale_offset else nn.initializers.ones
    scale = self.param('scale', partitioned(init, (cfg.axis,)), (d,), dtype(cfg.param_dtype))
    scale = scale.astype(jnp.float32)
    y = y * (1.0 + scale if cfg.scale_offset else scale)
    if cfg.kind == 'layernorm' and cfg.use_bias:
      bias = self.param('bias', partitioned(nn.initializers.zeros, (cfg.axis,)), (d,),
                        dtype(cfg.param_dtype))
      y = y + bias.astype(jnp.float32)
    return y.astype(dtype(cfg.dtype))
