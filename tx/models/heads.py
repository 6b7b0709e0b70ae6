"""Output heads: next-token LM head, BERT's MLM head, a pooled classification head."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.layers.common import ACTIVATIONS, constrain, dense_layer, dtype, partitioned
from tx.layers.embed import Embed
from tx.layers.norm import Norm
from tx.models.layer_configs import norm_config


def _dense(cfg: ModelConfig, features, axes, name, use_bias=True):
  return dense_layer(features, axes, use_bias=use_bias, dtype=cfg.dtype,
                     param_dtype=cfg.param_dtype, name=name)


class LMHead(nn.Module):
  """hidden [B, L, D] -> float32 logits [B, L, V].

  Tied: (hidden · logits_scale) · Eᵀ with the token table (the 2017 paper shares it with
  the embeddings; T5 scales by d_model^-0.5). Untied: a separate bias-free projection.
  """
  cfg: ModelConfig
  embed: Embed | None = None

  @nn.compact
  def __call__(self, x_BLD):
    cfg = self.cfg
    if cfg.logits_scale != 1.0:
      x_BLD = x_BLD * jnp.asarray(cfg.logits_scale, x_BLD.dtype)
    if cfg.tie_embeddings:
      logits = self.embed.attend(x_BLD)
    else:
      logits = _dense(cfg, cfg.vocab_size, ('embed', 'vocab'), 'lm_head', use_bias=False)(x_BLD)
    return constrain(logits.astype(jnp.float32), ('batch', 'length', 'vocab'))


class MLMHead(nn.Module):
  """BERT's masked-LM head: dense + activation + norm, tied projection, separate bias.

  hidden [B, L, D] -> float32 logits [B, L, V].
  """
  cfg: ModelConfig
  embed: Embed | None = None

  @nn.compact
  def __call__(self, x_BLD):
    cfg = self.cfg
    h = _dense(cfg, cfg.d_model, ('embed', 'mlp'), 'transform')(x_BLD)
    h = Norm(norm_config(cfg), name='transform_norm')(ACTIVATIONS[cfg.mlm_activation](h))
    if cfg.tie_embeddings:
      logits = self.embed.attend(h)
    else:
      logits = _dense(cfg, cfg.vocab_size, ('embed', 'vocab'), 'decoder', use_bias=False)(h)
    bias = self.param('bias', partitioned(nn.initializers.zeros, ('vocab',)), (cfg.vocab_size,),
                      dtype(cfg.param_dtype))
    return (logits + bias.astype(logits.dtype)).astype(jnp.float32)


class ClassifierHead(nn.Module):
  """BERT's pooler + classifier: tanh(dense(hidden[:, 0])) -> float32 logits [B, C]."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BLD, *, deterministic=True):
    cfg = self.cfg
    pooled = jnp.tanh(_dense(cfg, cfg.d_model, ('embed', 'mlp'), 'pooler')(x_BLD[:, 0]))
    pooled = nn.Dropout(cfg.dropout)(pooled, deterministic=deterministic)
    return _dense(cfg, cfg.num_classes, ('mlp', None), 'classifier')(pooled).astype(jnp.float32)
