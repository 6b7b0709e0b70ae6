"""From one `ModelConfig` to the small per-layer configs of `tx.layers`, and the builder
of each position scheme (`POSITION_BUILDERS`).

This is the only place that reads the whole model config on behalf of layers, so the
layers stay reusable on their own: a layer sees only its own small config, never the
model or experiment config.
"""

from __future__ import annotations

import functools

from tx import ops
from tx.config.choices import EMBEDDING, ROTARY
from tx.config.model import ModelConfig
from tx.config.rope import RopeScalingConfig
from tx.layers.attention import AttentionConfig
from tx.layers.block import BlockConfig
from tx.layers.embed import EmbedConfig, PositionConfig, PositionEmbedding
from tx.layers.ffn import FFNConfig
from tx.layers.moe import MoELayerConfig
from tx.layers.norm import NormConfig
from tx.layers.relative_bias import RelativeBiasConfig, RelativePositionBias


def norm_config(cfg: ModelConfig) -> NormConfig:
  return NormConfig(kind=cfg.norm, eps=cfg.norm_eps, use_bias=cfg.norm_bias,
                    scale_offset=cfg.norm_scale_offset, dtype=cfg.dtype,
                    param_dtype=cfg.param_dtype, impl=cfg.norm_kernels)


def rope_scaling_config(cfg: ModelConfig) -> RopeScalingConfig:
  """`model.rope_scaling` with original_max_len resolved (None = model.max_len)."""
  s = cfg.rope_scaling
  if s.kind == 'none' or s.original_max_len is not None:
    return s
  return s.replace(original_max_len=cfg.max_len)


def attention_config(cfg: ModelConfig, *, cross: bool = False, causal: bool = False,
                     window: int = 0) -> AttentionConfig:
  """causal: the decoder's self-attention (its query blocks may skip masked keys);
  window: > 0 for a local self-attention layer (`ModelConfig.layer_windows`), which
  rotates with base `model.rope_local_theta` and no scaling when that is set."""
  window = 0 if cross else window
  theta, scaling = cfg.rope_theta, rope_scaling_config(cfg)
  if window and cfg.rope_local_theta is not None:
    theta, scaling = cfg.rope_local_theta, RopeScalingConfig()
  return AttentionConfig(
      d_model=cfg.d_model, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, use_bias=cfg.use_bias, dropout=cfg.attention_dropout,
      scale=cfg.scale_attention, qk_norm=cfg.qk_norm, qk_norm_eps=cfg.norm_eps,
      query_pre_attn_scalar=cfg.query_pre_attn_scalar,
      qk_norm_scale_offset=cfg.norm_scale_offset,
      softcap=cfg.attention_softcap, rope=cfg.position_kind == ROTARY and not cross,
      rope_theta=theta, rope_fraction=cfg.rope_fraction,
      rope_interleaved=cfg.rope_interleaved, rope_scaling=scaling,
      implementation=cfg.attention_impl, scale_multiplier=mup_attention_multiplier(cfg),
      causal_blocks=cfg.attention_causal_blocks if causal else 1,
      window=window, dtype=cfg.dtype,
      param_dtype=cfg.param_dtype, matmul=cfg.matmul)


def mup_attention_multiplier(cfg: ModelConfig) -> float:
  """μP's 1/head_dim score scale matched at the base width: sqrt(base head_dim / head_dim),
  base head_dim = head_dim at d_model = mup_base_width, same heads (1 under standard)."""
  if cfg.parametrization != 'mup':
    return 1.0
  base = cfg.head_dim or cfg.mup_base_width / cfg.num_heads
  return (base / cfg.resolved_head_dim) ** 0.5


def ffn_config(cfg: ModelConfig) -> FFNConfig:
  return FFNConfig(d_model=cfg.d_model, d_ff=cfg.d_ff, activation=cfg.ffn, use_bias=cfg.use_bias,
                   dtype=cfg.dtype, param_dtype=cfg.param_dtype, matmul=cfg.matmul)


def moe_config(cfg: ModelConfig) -> MoELayerConfig:
  m = cfg.moe
  return MoELayerConfig(
      d_model=cfg.d_model, d_ff=cfg.d_ff, activation=cfg.ffn, num_experts=m.num_experts,
      top_k=m.top_k, capacity_factor=m.capacity_factor, aux_loss_weight=m.aux_loss_weight,
      router_z_loss_weight=m.router_z_loss_weight, use_bias=cfg.use_bias, dtype=cfg.dtype,
      param_dtype=cfg.param_dtype)


def block_config(cfg: ModelConfig, *, cross: bool = False, moe: bool = False,
                 causal: bool = False, window: int = 0) -> BlockConfig:
  return BlockConfig(
      attention=attention_config(cfg, causal=causal, window=window), norm=norm_config(cfg),
      ffn=None if moe else ffn_config(cfg), moe=moe_config(cfg) if moe else None,
      cross_attention=attention_config(cfg, cross=True) if cross else None,
      norm_position=cfg.norm_position, dropout=cfg.dropout, sandwich_norm=cfg.sandwich_norm,
      parallel=cfg.parallel_block)


def block_configs(cfg: ModelConfig, num_layers: int, *, cross: bool = False,
                  causal: bool = False) -> list[BlockConfig]:
  """One config per layer; with MoE every `moe.every`-th block (the last of each group) is MoE;
  local self-attention where `model.attention_pattern` says (`ModelConfig.layer_windows`)."""
  every = cfg.moe.every
  windows = cfg.layer_windows(num_layers)
  return [block_config(cfg, cross=cross, moe=cfg.is_moe and (i + 1) % every == 0, causal=causal,
                       window=windows[i])
          for i in range(num_layers)]


def embed_config(cfg: ModelConfig, vocab_size: int) -> EmbedConfig:
  # μP: the table's init std stays at the base width's (constant in width).
  std = cfg.mup_base_width ** -0.5 if cfg.parametrization == 'mup' else None
  return EmbedConfig(vocab_size=vocab_size, d_model=cfg.d_model,
                     scale_by_sqrt_dim=cfg.scale_embeddings, init_stddev=std, dtype=cfg.dtype,
                     param_dtype=cfg.param_dtype, matmul=cfg.matmul)


def position_config(cfg: ModelConfig) -> PositionConfig | None:
  if cfg.position_kind != EMBEDDING:
    return None
  return PositionConfig(kind=cfg.position, max_len=cfg.max_len, d_model=cfg.d_model,
                        dtype=cfg.dtype, param_dtype=cfg.param_dtype)


def relative_bias_config(cfg: ModelConfig, *, bidirectional: bool) -> RelativeBiasConfig:
  return RelativeBiasConfig(num_heads=cfg.num_heads, num_buckets=cfg.t5_num_buckets,
                            max_distance=cfg.t5_max_distance, bidirectional=bidirectional,
                            param_dtype=cfg.param_dtype)


# ------------------------------------------------------------- position schemes

def _embedding(cfg: ModelConfig):
  return PositionEmbedding(position_config(cfg), name='position_embedding')


def _alibi(cfg: ModelConfig, causal: bool):
  return functools.partial(ops.alibi_bias, cfg.num_heads, causal=causal)


def _t5(cfg: ModelConfig, causal: bool):
  return RelativePositionBias(relative_bias_config(cfg, bidirectional=not causal),
                              name='relative_bias')


# One builder per row of tx.config.choices.POSITION_KINDS (same keys), by kind:
#   EMBEDDING: build(cfg) -> module, positions [B, L] -> [B, L, D] added to the token
#     embeddings (called inside `InputEmbedder`);
#   BIAS: build(cfg, causal) -> callable, q_pos [B, L], k_pos [B, S] -> [B, H, L, S]
#     added to the self-attention scores (called inside `PositionBias`, once per stack);
#   ROTARY, NONE: None (`attention_config` turns RoPE on from the kind).
POSITION_BUILDERS = {
    'sinusoidal': _embedding,
    'learned': _embedding,
    'rope': None,
    'alibi': _alibi,
    't5': _t5,
    'none': None,
}


def position_builder(cfg: ModelConfig, kind: str):
  """The builder of `cfg.position` if the scheme is of `kind` (EMBEDDING or BIAS), else None."""
  return POSITION_BUILDERS[cfg.position] if cfg.position_kind == kind else None
