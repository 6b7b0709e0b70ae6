"""LayerNorm and RMSNorm with their own small config."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config.base import choice, config, fail
from tx.layers.common import dtype, partitioned
from tx.ops import torch_norm


@config
class NormConfig:
  kind: str = choice('layernorm', 'rmsnorm')
  eps: float = 1e-6
  use_bias: bool = True  # LayerNorm only; RMSNorm has neither mean nor bias (T5, LLaMA)
  axis: str = 'embed'  # logical axis of scale / bias ('kv' for per-head q/k norms)
  scale_offset: bool = False  # True: multiply by (1 + scale), scale initialised at 0 (Gemma)
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  # 'torch': PyTorch's CPU LayerNorm kernels through callbacks (tx/ops/torch_norm.py); XLA's
  # off the CPU. LayerNorm only: torch has no CPU kernel for a fused RMSNorm's backward.
  impl: str = choice('xla', 'torch')

  def validate(self):
    if self.impl == 'torch' and self.kind != 'layernorm':
      fail('impl', f"'torch' (PyTorch's CPU LayerNorm) takes kind=layernorm, not {self.kind!r}")


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
    init = nn.initializers.zeros if cfg.scale_offset else nn.initializers.ones
    scale = self.param('scale', partitioned(init, (cfg.axis,)), (d,), dtype(cfg.param_dtype))
    scale = scale.astype(jnp.float32)
    scale = 1.0 + scale if cfg.scale_offset else scale
    bias = None
    if cfg.kind == 'layernorm' and cfg.use_bias:
      bias = self.param('bias', partitioned(nn.initializers.zeros, (cfg.axis,)), (d,),
                        dtype(cfg.param_dtype)).astype(jnp.float32)
    x32 = x.astype(jnp.float32)
    if cfg.impl == 'torch' and torch_norm.on_this_backend():
      bias = jnp.zeros((d,), jnp.float32) if bias is None else bias
      # bf16 in and out: torch's kernel reads and writes bf16 itself (float32 inside)
      rows = x if x.dtype == jnp.bfloat16 == dtype(cfg.dtype) else x32
      y = torch_norm.torch_layer_norm(rows.reshape(-1, d), scale, bias, cfg.eps)
      return y.reshape(x.shape).astype(dtype(cfg.dtype))
    if cfg.kind == 'layernorm':
      x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + cfg.eps) * scale
    if bias is not None:
      y = y + bias
    return y.astype(dtype(cfg.dtype))
