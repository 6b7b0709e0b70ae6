"""The Transformer block: self-attention, optional cross-attention, FFN (dense or MoE),
each wrapped by the residual rule.

    pre:       x + dropout(f(norm(x)))           (GPT-2, T5, LLaMA; the stack adds a final norm)
    post:      norm(x + dropout(f(x)))           (the 2017 paper, BERT)
    sandwich:  x + dropout(norm'(f(norm(x))))    (pre only; Gemma 2: `{name}_post_norm`)
    parallel:  x + (attn(norm1(x)) + ffn(norm2(x)))  (pre only, no cross-attention)
               'two_norms': norm1, norm2 = self_attention_norm, ffn_norm (GPT-NeoX's
               use_parallel_residual); 'shared_norm': one `shared_norm` (GPT-J, PaLM)

Norm parameter names: `{sublayer}_norm` on the input, `{sublayer}_post_norm` on the output
under the sandwich, sublayer one of self_attention, cross_attention, ffn (also for MoE).
"""

from __future__ import annotations

import flax.linen as nn

from tx.config.base import choice, config, fail
from tx.layers.attention import AttentionConfig, MultiHeadAttention
from tx.layers.common import constrain, dropout
from tx.layers.ffn import FeedForward, FFNConfig
from tx.layers.moe import MoEFeedForward, MoELayerConfig
from tx.layers.norm import Norm, NormConfig

PARALLEL = ('none', 'two_norms', 'shared_norm')


@config
class BlockConfig:
  attention: AttentionConfig
  norm: NormConfig
  ffn: FFNConfig | None = None
  moe: MoELayerConfig | None = None  # replaces the dense FFN when set
  cross_attention: AttentionConfig | None = None  # decoder of an encoder-decoder
  norm_position: str = choice('pre', 'post')
  dropout: float = 0.0  # on each sublayer output, before the residual add
  sandwich_norm: bool = False  # pre only: also norm each sublayer's output (Gemma 2)
  parallel: str = choice(*PARALLEL)  # pre only: attention and FFN from the same x

  def validate(self):
    if (self.ffn is None) == (self.moe is None):
      fail('ffn', 'a BlockConfig needs exactly one of ffn and moe')
    if self.norm_position != 'pre':
      if self.sandwich_norm:
        fail('sandwich_norm', 'needs norm_position=pre')
      if self.parallel != 'none':
        fail('parallel', 'needs norm_position=pre')
    if self.parallel != 'none' and self.cross_attention is not None:
      fail('parallel', 'is not defined for a block with cross-attention')


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

  def _branch(self, name, f, h):
    """dropout(f(h)), normed first under the sandwich (`{name}_post_norm`)."""
    cfg = self.cfg
    y = f(h)
    if cfg.sandwich_norm:
      y = Norm(cfg.norm, name=f'{name}_post_norm')(y)
    return dropout(self, y, cfg.dropout, self.deterministic)

  def _residual(self, name, f, x):
    cfg = self.cfg
    if cfg.norm_position == 'pre':
      return x + self._branch(name, f, Norm(cfg.norm, name=f'{name}_norm')(x))
    return Norm(cfg.norm, name=f'{name}_norm')(x + dropout(self, f(x), cfg.dropout,
                                                             self.deterministic))

  def _parallel(self, attn, ffn, x):
    """x + (attn(norm1(x)) + ffn(norm2(x))), norm1 = norm2 = shared_norm if shared."""
    cfg = self.cfg
    if cfg.parallel == 'shared_norm':
      h_attn = h_ffn = Norm(cfg.norm, name='shared_norm')(x)
    else:
      h_attn = Norm(cfg.norm, name='self_attention_norm')(x)
      h_ffn = Norm(cfg.norm, name='ffn_norm')(x)
    return x + (self._branch('self_attention', attn, h_attn) + self._branch('ffn', ffn, h_ffn))

  @nn.compact
  def __call__(self, x_BLD, self_mask=None, self_bias=None, positions_BL=None, encoded_BSD=None,
               cross_mask=None, valid_BL=None, cache_index=None):
    cfg = self.cfg
    x_BLD = constrain(x_BLD, ('batch', 'length', 'embed'))
    in_dtype = x_BLD.dtype
    attn = MultiHeadAttention(cfg.attention, decode=self.decode, name='self_attention')
    attn_f = lambda h: attn(h, mask=self_mask, bias=self_bias, q_pos_BL=positions_BL,
                            cache_index=cache_index, deterministic=self.deterministic,
                            return_weights=self.sow_weights)
    if cfg.moe is not None:
      moe = MoEFeedForward(cfg.moe, name='moe')
      ffn_f = lambda h: moe(h, valid_BL=valid_BL, deterministic=self.deterministic)
    else:
      ffn = FeedForward(cfg.ffn, name='ffn')
      ffn_f = lambda h: ffn(h, deterministic=self.deterministic)
    if cfg.parallel != 'none':
      x_BLD = self._parallel(attn_f, ffn_f, x_BLD)
    else:
      x_BLD = self._residual('self_attention', attn_f, x_BLD)
      if cfg.cross_attention is not None:
        cross = MultiHeadAttention(cfg.cross_attention, decode=self.decode, cross=True,
                                   name='cross_attention')
        x_BLD = self._residual('cross_attention', lambda h: cross(
            h, encoded_BSD, mask=cross_mask, deterministic=self.deterministic,
            return_weights=self.sow_weights), x_BLD)
      x_BLD = self._residual('ffn', ffn_f, x_BLD)
    # Inside the block a bf16 model's residual adds run in float32 (tx/ops/matmul.py); the
    # block hands on its input's dtype (a scanned stack's carry must keep it).
    x_BLD = constrain(x_BLD.astype(in_dtype), ('batch', 'length', 'embed'))
    return (x_BLD, None) if self.scan_output else x_BLD
