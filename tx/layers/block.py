"""The Transformer block: self-attention, optional cross-attention, FFN (dense or MoE),
each wrapped by the residual rule.

    pre:  x + dropout(f(norm(x)))      (GPT-2, T5, LLaMA; the stack adds a final norm)
    post: norm(x + dropout(f(x)))      (the 2017 paper, BERT)
"""

from __future__ import annotations

import flax.linen as nn

from tx.config.base import choice, config, fail
from tx.layers.attention import AttentionConfig, MultiHeadAttention
from tx.layers.common import constrain, dropout
from tx.layers.ffn import FeedForward, FFNConfig
from tx.layers.moe import MoEFeedForward, MoELayerConfig
from tx.layers.norm import Norm, NormConfig


@config
class BlockConfig:
  attention: AttentionConfig
  norm: NormConfig
  ffn: FFNConfig | None = None
  moe: MoELayerConfig | None = None  # replaces the dense FFN when set
  cross_attention: AttentionConfig | None = None  # decoder of an encoder-decoder
  norm_position: str = choice('pre', 'post')
  dropout: float = 0.0  # on each sublayer output, before the residual add

  def validate(self):
    if (self.ffn is None) == (self.moe is None):
      fail('ffn', 'a BlockConfig needs exactly one of ffn and moe')


class Block(nn.Module):
  """x [B, L, D] -> [B, L, D].

  self_mask / self_bias: broadcastable to [B, H, L, S]; positions [B, L] (RoPE);
  encoded [B, S_enc, D] with cross_mask [B, 1, L, S_enc] for cross-attention (with
  decode=True, None after the first call reuses the cached cross keys/values); valid [B, L]
  marks real tokens (MoE does not route padding). `deterministic` and `decode` are
  attributes, not call arguments, so the block can be scanned and rematerialised.
  """
  cfg: BlockConfig
  deterministic: bool = True
  decode: bool = False
  sow_weights: bool = False  # sow attention weights into 'intermediates'
  scan_output: bool = False  # return (x, None), the carry/output pair nn.scan expects

  def _residual(self, name, f, x):
    cfg = self.cfg
    if cfg.norm_position == 'pre':
      return x + dropout(self, f(Norm(cfg.norm, name=f'{name}_norm')(x)), cfg.dropout,
                         self.deterministic)
    return Norm(cfg.norm, name=f'{name}_norm')(x + dropout(self, f(x), cfg.dropout,
                                                             self.deterministic))

  @nn.compact
  def __call__(self, x_BLD, self_mask=None, self_bias=None, positions_BL=None, encoded_BSD=None,
               cross_mask=None, valid_BL=None, cache_index=None):
    cfg = self.cfg
    x_BLD = constrain(x_BLD, ('batch', 'length', 'embed'))
    attn = MultiHeadAttention(cfg.attention, decode=self.decode, name='self_attention')
    x_BLD = self._residual('self_attention', lambda h: attn(
        h, mask=self_mask, bias=self_bias, q_pos_BL=positions_BL, cache_index=cache_index,
        deterministic=self.deterministic, return_weights=self.sow_weights), x_BLD)
    if cfg.cross_attention is not None:
      cross = MultiHeadAttention(cfg.cross_attention, decode=self.decode, cross=True,
                                 name='cross_attention')
      x_BLD = self._residual('cross_attention', lambda h: cross(
          h, encoded_BSD, mask=cross_mask, deterministic=self.deterministic,
          return_weights=self.sow_weights), x_BLD)
    if cfg.moe is not None:
      ffn = MoEFeedForward(cfg.moe, name='moe')
      f = lambda h: ffn(h, valid_BL=valid_BL, deterministic=self.deterministic)
    else:
      ffn = FeedForward(cfg.ffn, name='ffn')
      f = lambda h: ffn(h, deterministic=self.deterministic)
    x_BLD = constrain(self._residual('ffn', f, x_BLD), ('batch', 'length', 'embed'))
    return (x_BLD, None) if self.scan_output else x_BLD
