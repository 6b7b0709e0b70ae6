"""The encoder tower: embeddings + a bidirectional stack (BERT, the encoder of T5 / 2017)."""

from __future__ import annotations

import flax.linen as nn

from tx import ops
from tx.config.model import ModelConfig
from tx.layers.embed import Embed
from tx.models.attention_inputs import (PositionBias, default_positions, local_attention_mask,
                                        self_attention_mask, token_validity)
from tx.models.embedder import InputEmbedder
from tx.models.layer_configs import block_configs, norm_config
from tx.models.stack import Stack


class Encoder(nn.Module):
  """tokens [B, S] -> (hidden [B, S, D], valid [B, S]).

  Every real token attends to every real token of its row (or of its segment when
  `segment_ids` [B, S] describe packed examples); padding keys are masked. Local layers
  (`model.attention_window` W) see only the keys within |i - j| < W positions.
  """
  cfg: ModelConfig
  embed: Embed
  num_layers: int

  @nn.compact
  def __call__(self, tokens_BS, *, positions=None, segment_ids=None, token_types=None,
               deterministic=True, sow_weights=False):
    cfg = self.cfg
    valid_BS = token_validity(tokens_BS, segment_ids)
    if positions is None:
      positions = default_positions(tokens_BS, segment_ids)
    x_BSD = InputEmbedder(cfg, self.embed, name='embedder')(
        tokens_BS, positions, token_types, deterministic=deterministic)
    mask = self_attention_mask(valid_BS, segment_ids, causal=False)
    bias = PositionBias(cfg, causal=False, name='position_bias')(positions, positions)
    blocks = tuple(block_configs(cfg, self.num_layers))
    local_mask = None
    if any(b.attention.window for b in blocks):
      local_mask = local_attention_mask(mask, positions, positions, cfg.attention_window,
                                        causal=False)
    stack = Stack(blocks, final_norm=norm_config(cfg) if cfg.use_final_norm else None,
                  scan=cfg.scan_layers, remat=cfg.remat, deterministic=deterministic,
                  sow_weights=sow_weights, name='stack')
    return stack(x_BSD, mask, bias, positions, None, None, valid_BS, None, local_mask,
                 bias), valid_BS


def cross_attention_mask(encoder_valid_BS, segment_ids_BL=None, encoder_segment_ids_BS=None):
  """Decoder queries x encoder keys: padding masked; packed rows stay within their pair."""
  if segment_ids_BL is not None and encoder_segment_ids_BS is not None:
    return ops.segment_mask(segment_ids_BL, encoder_segment_ids_BS)
  return ops.key_padding_mask(encoder_valid_BS)
