"""Output heads: next-token LM head, BERT's MLM head, a pooled classification head."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from tx.config.model import ModelConfig
from tx.layers.common import ACTIVATIONS, constrain, dense_layer, dtype, partitioned
from tx.layers.embed import Embed
from tx.layers.norm import Norm
from tx.models.layer_configs import norm_config


def output_multiplier(cfg: ModelConfig) -> float:
  """What the final hidden state is multiplied by before the vocabulary projection:
  logits_scale, over μP's width multiplier (1/width_mult; 1 under the standard
  parametrization and at the μP base width)."""
  return cfg.logits_scale / cfg.width_mult


def softcap_logits(logits, cap: float):
  """cap · tanh(logits / cap), bounded by ±cap (Gemma 2); cap 0 = unchanged."""
  if not cap:
    return logits
  return cap * jnp.tanh(logits / cap)


def _dense(cfg: ModelConfig, features, axes, name, use_bias=True):
  return dense_layer(features, axes, use_bias=use_bias, dtype=cfg.dtype,
                     param_dtype=cfg.param_dtype, matmul=cfg.matmul, name=name)


class LMHead(nn.Module):
  """hidden [B, L, D] -> float32 logits [B, L, V].

  Tied: (hidden · logits_scale) · Eᵀ with the token table (the 2017 paper shares it with
  the embeddings; T5 scales by d_model^-0.5). Untied: a separate bias-free projection.
  Under μP the hidden state is also divided by width_mult (`output_multiplier`); then
  `model.logits_softcap` bounds the float32 logits.
  """
  cfg: ModelConfig
  embed: Embed | None = None

  @nn.compact
  def __call__(self, x_BLD):
    cfg = self.cfg
    scale = output_multiplier(cfg)
    if scale != 1.0:
      x_BLD = x_BLD * jnp.asarray(scale, x_BLD.dtype)
    if cfg.tie_embeddings:
      logits = self.embed.attend(x_BLD)
    else:
      logits = _dense(cfg, cfg.vocab_size, ('embed', 'vocab'), 'lm_head', use_bias=False)(x_BLD)
    logits = softcap_logits(logits.astype(jnp.float32), cfg.logits_softcap)
    return constrain(logits, ('batch', 'length', 'vocab'))


class MLMHead(nn.Module):
  """BERT's masked-LM head: dense + activation + norm, tied projection, separate bias.

  hidden [B, L, D] -> float32 logits [B, L, V]. μP's 1/width_mult multiplies the
  transformed state before the projection (not the bias); `model.logits_softcap` applies last.
  """
  cfg: ModelConfig
  embed: Embed | None = None

  @nn.compact
  def __call__(self, x_BLD):
    cfg = self.cfg
    h = _dense(cfg, cfg.d_model, ('embed', 'mlp'), 'transform')(x_BLD)
    h = Norm(norm_config(cfg), name='transform_norm')(ACTIVATIONS[cfg.mlm_activation](h))
    if cfg.width_mult != 1.0:
      h = h * jnp.asarray(1.0 / cfg.width_mult, h.dtype)
    if cfg.tie_embeddings:
      logits = self.embed.attend(h)
    else:
      logits = _dense(cfg, cfg.vocab_size, ('embed', 'vocab'), 'decoder', use_bias=False)(h)
    bias = self.param('bias', partitioned(nn.initializers.zeros, ('vocab',)), (cfg.vocab_size,),
                      dtype(cfg.param_dtype))
    logits = (logits + bias.astype(logits.dtype)).astype(jnp.float32)
    return softcap_logits(logits, cfg.logits_softcap)


class ClassifierHead(nn.Module):
  """BERT's pooler + classifier: tanh(dense(hidden[:, 0])) -> float32 logits [B, C]."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BLD, *, deterministic=True):
    cfg = self.cfg
    pooled = jnp.tanh(_dense(cfg, cfg.d_model, ('embed', 'mlp'), 'pooler')(x_BLD[:, 0]))
    pooled = nn.Dropout(cfg.dropout)(pooled, deterministic=deterministic)
    return _dense(cfg, cfg.num_classes, ('mlp', None), 'classifier')(pooled).astype(jnp.float32)
