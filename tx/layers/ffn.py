"""Position-wise feed-forward network: act(x·W1 + b1)·W2 + b2, or a gated variant."""

from __future__ import annotations

import flax.linen as nn

from tx.config.base import choice, config
from tx.config.choices import FFN_ACTIVATIONS, MATMUL_IMPLS
from tx.layers.common import activation, constrain, dense_layer, dropout


@config
class FFNConfig:
  d_model: int
  d_ff: int
  activation: str = choice(*FFN_ACTIVATIONS, default='gelu')
  use_bias: bool = True
  dropout: float = 0.0  # on the hidden activation (T5 style); sublayer dropout lives in Block
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  matmul: str = choice(*MATMUL_IMPLS)  # the products (tx/ops/matmul.py)


class FeedForward(nn.Module):
  """x [B, L, D] -> [B, L, D]. Gated activations (swiglu, geglu, reglu) use two input
  projections `wi_0` (activated) and `wi_1` (linear); others one, `wi`."""
  cfg: FFNConfig

  @nn.compact
  def __call__(self, x_BLD, *, deterministic: bool = True):
    cfg = self.cfg
    act, gated = activation(cfg.activation)

    def dense(features, axes, name):
      return dense_layer(features, axes, use_bias=cfg.use_bias, dtype=cfg.dtype,
                         param_dtype=cfg.param_dtype, matmul=cfg.matmul, name=name)

    if gated:
      h_BLF = act(dense(cfg.d_ff, ('embed', 'mlp'), 'wi_0')(x_BLD))
      h_BLF = h_BLF * dense(cfg.d_ff, ('embed', 'mlp'), 'wi_1')(x_BLD)
    else:
      h_BLF = act(dense(cfg.d_ff, ('embed', 'mlp'), 'wi')(x_BLD))
    h_BLF = constrain(h_BLF, ('batch', 'length', 'mlp'))
    h_BLF = dropout(self, h_BLF, cfg.dropout, deterministic)
    return dense(cfg.d_model, ('mlp', 'embed'), 'wo')(h_BLF)
