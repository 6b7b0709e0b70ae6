"""LLaMA <-> tx: RoPE (half-split), RMSNorm, SwiGLU, grouped-query attention, untied head.

Projections are `nn.Linear` ([out, in]); q/k/v are separate; `gate_proj` is the SiLU
branch (tx `wi_0`), `up_proj` the linear one (`wi_1`). RoPE scaling (LLaMA 3.1's llama3,
linear, dynamic, yarn) maps to `model.rope_scaling.*` (tx.interop.hf_rope).

Mistral (tx.interop.mistral) and Qwen3 (tx.interop.qwen3) reuse this mapping: the shared
config fields (`base_config`, `base_to_hf`), the tensors (with Qwen3's per-head
`self_attn.q_norm` / `k_norm` [head_dim] when `model.qk_norm` is set) and the export check.
"""

from __future__ import annotations

import numpy as np

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.interop.hf_config import ANY, HFConfig, check_fields
from tx.interop.hf_rope import rope_from_hf, rope_to_hf
from tx.interop.tensors import (Tensors, dense, linear_in, linear_out, norm, put, put_head,
                                with_embedding)

PREFIX = 'model.'
IGNORE = ('layers.*.self_attn.rotary_emb.inv_freq',)  # a buffer some savers kept
# What a LLaMA-layout export needs (Mistral and Qwen3 add their knobs to it).
WANTED = {'family': 'decoder', 'position': 'rope', 'rope_fraction': 1.0, 'norm': 'rmsnorm',
          'norm_position': 'pre', 'ffn': 'swiglu', 'use_bias': False, 'embed_norm': False,
          'scale_embeddings': False, 'logits_scale': 1.0, 'scale_attention': True,
          'rope_scaling.kind': ANY}


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """LlamaConfig fields -> ModelConfig."""
  attention_bias = hf.get('attention_bias', default=False)
  if hf.get('mlp_bias', default=False) != attention_bias:
    raise ConfigError(f'{hf.source}: attention_bias={attention_bias} with mlp_bias='
                      f'{hf.get("mlp_bias")} is not supported (tx has one model.use_bias)')
  return base_config(hf, use_bias=bool(attention_bias))


def base_config(hf: HFConfig, **fields) -> ModelConfig:
  """The ModelConfig of the fields LLaMA, Mistral and Qwen3 share, RoPE scaling included;
  `fields` (ModelConfig keywords) add to or override them."""
  hf.expect('hidden_act', ('silu',), default='silu')
  hf.expect('pretraining_tp', (1,), default=1)
  d = hf.require('hidden_size')
  heads = hf.require('num_attention_heads')
  head_dim = hf.get('head_dim', default=d // heads)
  kv_heads = hf.get('num_key_value_heads', default=heads)
  theta, scaling = rope_from_hf(hf)
  common = dict(
      family='decoder', vocab_size=hf.require('vocab_size'), d_model=d, num_heads=heads,
      num_kv_heads=None if kv_heads == heads else kv_heads,
      head_dim=None if head_dim * heads == d else head_dim,
      d_ff=hf.require('intermediate_size'), num_layers=hf.require('num_hidden_layers'),
      max_len=hf.get('max_position_embeddings', default=2048), position='rope',
      rope_theta=theta, rope_scaling=scaling, norm='rmsnorm', norm_position='pre',
      norm_eps=hf.get('rms_norm_eps', default=1e-6), ffn='swiglu', use_bias=False,
      tie_embeddings=hf.get('tie_word_embeddings', default=False))
  return ModelConfig(**{**common, **fields})


def params_from_hf(cfg: ModelConfig, t: Tensors) -> dict:
  """LLaMA (Mistral, Qwen3) tensors -> tx DecoderOnly params."""
  d, h, k, f = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_ff
  dh = cfg.resolved_head_dim
  p, embedding = with_embedding(t, 'embed_tokens.weight', cfg)
  for i in range(cfg.num_layers):
    src, dst = f'layers.{i}.', f'decoder/stack/layer_{i}/'
    put(p, dst + 'self_attention_norm', norm(t, src + 'input_layernorm', d, bias=False))
    for name, proj, heads in (('query', 'q', h), ('key', 'k', k), ('value', 'v', k)):
      w = t.take(src + f'self_attn.{proj}_proj.weight', (heads * dh, d))
      put(p, dst + f'self_attention/{name}/kernel', linear_in(w, heads, dh))
      if cfg.use_bias:
        put(p, dst + f'self_attention/{name}/bias',
            t.take(src + f'self_attn.{proj}_proj.bias', (heads * dh,)).reshape(heads, dh))
    put(p, dst + 'self_attention/out/kernel',
        linear_out(t.take(src + 'self_attn.o_proj.weight', (d, h * dh)), h, dh))
    if cfg.qk_norm != 'none':  # Qwen3: per-head RMSNorm of q and k before RoPE
      for name, proj in (('query', 'q'), ('key', 'k')):
        put(p, dst + f'self_attention/{name}_norm',
            norm(t, src + f'self_attn.{proj}_norm', dh, bias=False))
    put(p, dst + 'ffn_norm', norm(t, src + 'post_attention_layernorm', d, bias=False))
    for name, proj, shape in (('wi_0', 'gate', (f, d)), ('wi_1', 'up', (f, d)),
                              ('wo', 'down', (d, f))):
      put(p, dst + f'ffn/{name}/kernel', dense(t.take(src + f'mlp.{proj}_proj.weight', shape)))
      if cfg.use_bias:
        put(p, dst + f'ffn/{name}/bias', t.take(src + f'mlp.{proj}_proj.bias', shape[:1]))
    if cfg.use_bias:
      put(p, dst + 'self_attention/out/bias', t.take(src + 'self_attn.o_proj.bias', (d,)))
  put(p, 'decoder/stack/final_norm', norm(t, 'norm', d, bias=False))
  return put_head(p, 'head/lm_head/kernel', t, 'lm_head.weight', embedding, cfg.tie_embeddings)


def check_exportable(cfg: ModelConfig, wanted: dict | None = None,
                     arch: str = 'LLaMA') -> None:
  """ConfigError naming the first field that LLaMA's architecture (or `arch`, which
  expresses `wanted` on top of it) cannot express."""
  check_fields(cfg, {**WANTED, **(wanted or {})}, arch)
  rope_to_hf(cfg)  # dynamic RoPE scaling from a length other than model.max_len


def base_to_hf(cfg: ModelConfig) -> dict:
  """The config.json fields LLaMA, Mistral and Qwen3 share (RoPE scaling included)."""
  return {'vocab_size': cfg.vocab_size, 'hidden_size': cfg.d_model,
          'num_attention_heads': cfg.num_heads, 'num_key_value_heads': cfg.kv_heads,
          'head_dim': cfg.resolved_head_dim, 'intermediate_size': cfg.d_ff,
          'num_hidden_layers': cfg.num_layers, 'max_position_embeddings': cfg.max_len,
          'rms_norm_eps': cfg.norm_eps, 'hidden_act': 'silu', 'rope_parameters': rope_to_hf(cfg),
          'tie_word_embeddings': cfg.tie_embeddings}


def config_to_hf(cfg: ModelConfig) -> dict:
  """ModelConfig -> LlamaConfig fields (config.json)."""
  check_exportable(cfg)
  return {'model_type': 'llama', 'architectures': ['LlamaForCausalLM'], **base_to_hf(cfg),
          'attention_bias': False, 'mlp_bias': False}


def params_to_hf(cfg: ModelConfig, p: dict) -> dict[str, np.ndarray]:
  """tx DecoderOnly params -> LLaMA (Mistral, Qwen3) tensors (full names, 'model.' prefix)."""
  d = cfg.d_model
  out = {'embed_tokens.weight': p['embed']['embedding']}
  stack = p['decoder']['stack']
  for i in range(cfg.num_layers):
    layer, src = stack[f'layer_{i}'], f'layers.{i}.'
    attn = layer['self_attention']
    out[src + 'input_layernorm.weight'] = layer['self_attention_norm']['scale']
    for name, proj in (('query', 'q'), ('key', 'k'), ('value', 'v')):
      out[src + f'self_attn.{proj}_proj.weight'] = attn[name]['kernel'].reshape(d, -1).T
    out[src + 'self_attn.o_proj.weight'] = attn['out']['kernel'].reshape(-1, d).T
    if cfg.qk_norm != 'none':
      for name, proj in (('query', 'q'), ('key', 'k')):
        out[src + f'self_attn.{proj}_norm.weight'] = attn[f'{name}_norm']['scale']
    out[src + 'post_attention_layernorm.weight'] = layer['ffn_norm']['scale']
    for name, proj in (('wi_0', 'gate'), ('wi_1', 'up'), ('wo', 'down')):
      out[src + f'mlp.{proj}_proj.weight'] = layer['ffn'][name]['kernel'].T
  out['norm.weight'] = stack['final_norm']['scale']
  out = {PREFIX + k: v for k, v in out.items()}
  if not cfg.tie_embeddings:
    out['lm_head.weight'] = p['head']['lm_head']['kernel'].T
  return out
