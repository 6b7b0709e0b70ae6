"""The three model families, each composed from the same towers, stacks and blocks.

    decoder          tokens [B, L]              -> logits [B, L, V]   (next token)
    encoder          tokens [B, L]              -> logits [B, L, V]   (masked LM)
    encoder_decoder  src [B, S], tgt_in [B, L]  -> logits [B, L, V]   (teacher forcing)

Pad id 0: masks come from the tokens unless `segment_ids` (packed rows) are given.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.layers.embed import Embed
from tx.models.decoder import Decoder
from tx.models.encoder import Encoder, cross_attention_mask
from tx.models.heads import ClassifierHead, LMHead, MLMHead
from tx.models.layer_configs import embed_config


class DecoderOnly(nn.Module):
  """GPT-style causal LM. `decode=True` for cached generation (see `Decoder`)."""
  cfg: ModelConfig
  decode: bool = False

  def setup(self):
    cfg = self.cfg
    self.embed = Embed(embed_config(cfg, cfg.vocab_size))
    self.decoder = Decoder(cfg, self.embed, cfg.num_layers, decode=self.decode)
    self.head = LMHead(cfg, self.embed)

  def __call__(self, tokens_BL, *, positions=None, segment_ids=None, deterministic=True,
               return_hidden=False, sow_weights=False):
    """tokens [B, L] int -> logits [B, L, V] float32 (hidden [B, L, D] if return_hidden)."""
    hidden = self.decoder(tokens_BL, positions=positions, segment_ids=segment_ids,
                          deterministic=deterministic, sow_weights=sow_weights)
    return hidden if return_hidden else self.head(hidden)


class EncoderOnly(nn.Module):
  """BERT-style bidirectional encoder with an MLM head and a pooled classifier."""
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.embed = Embed(embed_config(cfg, cfg.vocab_size))
    self.encoder = Encoder(cfg, self.embed, cfg.num_layers)
    self.mlm_head = MLMHead(cfg, self.embed)
    if cfg.num_classes:
      self.classifier = ClassifierHead(cfg)

  def __call__(self, tokens_BL, *, positions=None, segment_ids=None, token_types=None,
               deterministic=True, head='mlm', sow_weights=False, predict_at=None):
    """tokens [B, L] -> head 'mlm': logits [B, L, V]; 'classify': [B, C]; 'hidden': [B, L, D].

    predict_at: int [B, P] positions; the MLM head then runs only there: logits [B, P, V].
    """
    hidden, _ = self.encoder(tokens_BL, positions=positions, segment_ids=segment_ids,
                             token_types=token_types, deterministic=deterministic,
                             sow_weights=sow_weights)
    if self.is_initializing():  # init creates every head's params, whichever head is asked for
      self.mlm_head(hidden)
      if self.cfg.num_classes:
        self.classifier(hidden, deterministic=deterministic)
    if head == 'hidden':
      return hidden
    if head == 'classify':
      if not self.cfg.num_classes:
        raise ValueError("head='classify' needs model.num_classes > 0")
      return self.classifier(hidden, deterministic=deterministic)
    if predict_at is not None:
      hidden = jnp.take_along_axis(hidden, predict_at[..., None], axis=1)
    return self.mlm_head(hidden)


class EncoderDecoder(nn.Module):
  """The 2017 Transformer / T5: the encoder runs once, the decoder cross-attends to it."""
  cfg: ModelConfig
  decode: bool = False

  def setup(self):
    cfg = self.cfg
    self.embed = Embed(embed_config(cfg, cfg.vocab_size))
    if not cfg.share_embeddings:
      self.src_embed = Embed(embed_config(cfg, cfg.source_vocab_size))
    self.encoder = Encoder(cfg, self.embed if cfg.share_embeddings else self.src_embed,
                           cfg.encoder_layers)
    self.decoder = Decoder(cfg, self.embed, cfg.decoder_layers, cross=True, decode=self.decode)
    self.head = LMHead(cfg, self.embed)

  def encode(self, src_BS, *, positions=None, segment_ids=None, deterministic=True,
             sow_weights=False):
    """src [B, S] -> (encoded [B, S, D], valid [B, S])."""
    return self.encoder(src_BS, positions=positions, segment_ids=segment_ids,
                        deterministic=deterministic, sow_weights=sow_weights)

  def decode_step(self, encoded_BSD, src_valid_BS, tgt_BL, *, positions=None, segment_ids=None,
                  src_segment_ids=None, deterministic=True, return_hidden=False,
                  sow_weights=False):
    """encoded [B, S, D], src_valid [B, S], tgt_in [B, L] -> logits [B, L, V].

    With decode=True, `encoded` may be None after the first call: each layer's
    cross-attention keys/values were projected once and cached.
    """
    cross_mask = cross_attention_mask(src_valid_BS, segment_ids, src_segment_ids)
    hidden = self.decoder(tgt_BL, encoded=encoded_BSD, cross_mask=cross_mask,
                          positions=positions, segment_ids=segment_ids,
                          deterministic=deterministic, sow_weights=sow_weights)
    return hidden if return_hidden else self.head(hidden)

  def __call__(self, src_BS, tgt_BL, *, src_positions=None, tgt_positions=None,
               src_segment_ids=None, tgt_segment_ids=None, deterministic=True,
               return_hidden=False, sow_weights=False):
    """src [B, S], tgt_in [B, L] -> logits [B, L, V] float32."""
    encoded, src_valid = self.encode(src_BS, positions=src_positions, segment_ids=src_segment_ids,
                                     deterministic=deterministic, sow_weights=sow_weights)
    return self.decode_step(encoded, src_valid, tgt_BL, positions=tgt_positions,
                            segment_ids=tgt_segment_ids, src_segment_ids=src_segment_ids,
                            deterministic=deterministic, return_hidden=return_hidden,
                            sow_weights=sow_weights)
