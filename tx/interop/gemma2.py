"""Gemma-2 <-> tx: RoPE, Gemma RMSNorm (x̂ · (1 + w)), sandwich norms, GeGLU, soft-caps.

Gemma-2 (transformers' Gemma2ForCausalLM) in tx's vocabulary:
    embeddings x sqrt(hidden_size)        model.scale_embeddings
    RMSNorm x̂ · (1 + w), in float32       model.norm='rmsnorm', model.norm_scale_offset
    input / post_attention_layernorm,     model.sandwich_norm (self_attention_norm /
    pre / post_feedforward_layernorm        _post_norm, ffn_norm / ffn_post_norm)
    gelu_pytorch_tanh(gate) * up          model.ffn='geglu_tanh' (gate_proj = wi_0)
    scores · query_pre_attn_scalar^-1/2   model.query_pre_attn_scalar
    attn_logit_softcapping                model.attention_softcap
    final_logit_softcapping               model.logits_softcap
    sliding_window + layer_types          model.attention_window + model.attention_pattern
Projections are `nn.Linear` ([out, in]) without biases; the head is tied by default.
`tx.interop.gemma3` reuses this mapping and adds q/k norms and a local RoPE base.
"""

from __future__ import annotations

import numpy as np

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.interop.hf_config import ACTIVATIONS, ANY, HFConfig, check_fields
from tx.interop.tensors import (Tensors, dense, linear_in, linear_out, norm, put, put_head,
                                with_embedding)

PREFIX = 'model.'
IGNORE = ()
SLIDING, FULL = 'sliding_attention', 'full_attention'  # transformers' layer_types
_GATED = {'gelu_tanh': 'geglu_tanh', 'gelu': 'geglu', 'silu': 'swiglu', 'relu': 'reglu'}
_ACT_OUT = {'geglu_tanh': 'gelu_pytorch_tanh', 'geglu': 'gelu', 'swiglu': 'silu',
            'reglu': 'relu'}
# tx norm name -> Gemma norm name, per layer (sandwich: each sublayer normed in and out).
_NORMS = (('self_attention_norm', 'input_layernorm'),
          ('self_attention_post_norm', 'post_attention_layernorm'),
          ('ffn_norm', 'pre_feedforward_layernorm'),
          ('ffn_post_norm', 'post_feedforward_layernorm'))


def attention_layout(hf: HFConfig, num_layers: int, period: int) -> dict:
  """{attention_window, attention_pattern} of `layer_types` (default: every `period`-th layer
  full, the others sliding), as the shortest repeating local/global pattern."""
  types = hf.get('layer_types') or [FULL if (i + 1) % period == 0 else SLIDING
                                    for i in range(num_layers)]
  if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
    raise ConfigError(f'{hf.source}: layer_types={types!r} is not supported (tx needs '
                      f'{num_layers} entries, each {SLIDING!r} or {FULL!r})')
  if SLIDING not in types:
    return dict(attention_window=0, attention_pattern='local')
  p = next(p for p in range(1, num_layers + 1)
           if all(types[i] == types[i % p] for i in range(num_layers)))
  return dict(attention_window=hf.get('sliding_window', default=4096),
              attention_pattern=','.join('local' if t == SLIDING else 'global'
                                         for t in types[:p]))


def layer_types(cfg: ModelConfig) -> list[str]:
  """transformers' layer_types of cfg's layers (local -> sliding_attention)."""
  return [SLIDING if w else FULL for w in cfg.layer_windows(cfg.num_layers)]


def softcap(hf: HFConfig, name: str, default: float | None) -> float:
  """A soft-cap field as tx's float (null = 0 = off; absent = transformers' default)."""
  return float(hf.data.get(name, default) or 0.0)


def common_config(hf: HFConfig, period: int, max_len: int, final_softcap: float | None) -> dict:
  """The ModelConfig fields Gemma-2 and Gemma-3 text share (everything but RoPE / q-k norm);
  absent fields take transformers' defaults (period: of the default layer_types)."""
  hf.expect('attention_bias', (False,), default=False)
  hf.expect('use_bidirectional_attention', (False,), default=False)
  act = hf.get('hidden_activation', 'hidden_act', default='gelu_pytorch_tanh')
  if ACTIVATIONS.get(act) not in _GATED:
    raise ConfigError(f'{hf.source}: hidden_activation={act!r} is not supported (supported: '
                      f'{", ".join(sorted(k for k, v in ACTIVATIONS.items() if v in _GATED))})')
  d = hf.require('hidden_size')
  heads = hf.require('num_attention_heads')
  head_dim = hf.get('head_dim', default=256)
  kv_heads = hf.get('num_key_value_heads', default=4)
  scalar = float(hf.get('query_pre_attn_scalar', default=256))
  layers = hf.require('num_hidden_layers')
  return dict(
      family='decoder', vocab_size=hf.require('vocab_size'), d_model=d, num_heads=heads,
      num_kv_heads=None if kv_heads == heads else kv_heads,
      head_dim=None if head_dim * heads == d else head_dim,
      d_ff=hf.require('intermediate_size'), num_layers=layers,
      max_len=hf.get('max_position_embeddings', default=max_len), position='rope',
      norm='rmsnorm', norm_position='pre', norm_eps=hf.get('rms_norm_eps', default=1e-6),
      norm_scale_offset=True, sandwich_norm=True, ffn=_GATED[ACTIVATIONS[act]], use_bias=False,
      scale_embeddings=True, query_pre_attn_scalar=None if scalar == head_dim else scalar,
      logits_softcap=softcap(hf, 'final_logit_softcapping', final_softcap),
      tie_embeddings=hf.get('tie_word_embeddings', default=True),
      **attention_layout(hf, layers, period))


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """Gemma2Config fields -> ModelConfig."""
  return ModelConfig(**common_config(hf, period=2, max_len=8192, final_softcap=30.0),
                     rope_theta=hf.rope_theta(),
                     attention_softcap=softcap(hf, 'attn_logit_softcapping', 50.0))


def params_from_hf(cfg: ModelConfig, t: Tensors) -> dict:
  """Gemma-2 / Gemma-3 text tensors -> tx DecoderOnly params."""
  d, h, k, f = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_ff
  dh = cfg.resolved_head_dim
  p, embedding = with_embedding(t, 'embed_tokens.weight', cfg)
  for i in range(cfg.num_layers):
    src, dst = f'layers.{i}.', f'decoder/stack/layer_{i}/'
    for ours, theirs in _NORMS:
      put(p, dst + ours, norm(t, src + theirs, d, bias=False))
    for name, proj, heads in (('query', 'q', h), ('key', 'k', k), ('value', 'v', k)):
      w = t.take(src + f'self_attn.{proj}_proj.weight', (heads * dh, d))
      put(p, dst + f'self_attention/{name}/kernel', linear_in(w, heads, dh))
    put(p, dst + 'self_attention/out/kernel',
        linear_out(t.take(src + 'self_attn.o_proj.weight', (d, h * dh)), h, dh))
    if cfg.qk_norm != 'none':
      for name, proj in (('query_norm', 'q'), ('key_norm', 'k')):
        put(p, dst + f'self_attention/{name}', norm(t, src + f'self_attn.{proj}_norm', dh,
                                                    bias=False))
    for name, proj, shape in (('wi_0', 'gate', (f, d)), ('wi_1', 'up', (f, d)),
                              ('wo', 'down', (d, f))):
      put(p, dst + f'ffn/{name}/kernel', dense(t.take(src + f'mlp.{proj}_proj.weight', shape)))
  put(p, 'decoder/stack/final_norm', norm(t, 'norm', d, bias=False))
  return put_head(p, 'head/lm_head/kernel', t, 'lm_head.weight', embedding, cfg.tie_embeddings)


def check_common(cfg: ModelConfig, arch: str, **wanted) -> None:
  """ConfigError naming the first field that the Gemma layout `arch` cannot express."""
  fields = dict(family='decoder', position='rope', rope_fraction=1.0, norm='rmsnorm',
                norm_position='pre', norm_scale_offset=True, sandwich_norm=True, use_bias=False,
                embed_norm=False, scale_embeddings=True, logits_scale=1.0, scale_attention=True,
                query_pre_attn_scalar=ANY, logits_softcap=ANY, attention_window=ANY)
  check_fields(cfg, {**fields, **wanted}, arch)
  if cfg.ffn not in _ACT_OUT:
    raise ConfigError(f'model.ffn={cfg.ffn!r}: {arch} export needs one of {sorted(_ACT_OUT)}')
  if not float(cfg.query_pre_attn_scalar or 0).is_integer():  # an int field in transformers
    raise ConfigError(f'model.query_pre_attn_scalar={cfg.query_pre_attn_scalar!r}: {arch} '
                      'export needs a whole number or None')


def check_exportable(cfg: ModelConfig) -> None:
  """ConfigError naming the first field that Gemma-2's architecture cannot express."""
  check_common(cfg, 'Gemma-2', attention_softcap=ANY)


def common_to_hf(cfg: ModelConfig) -> dict:
  """The config.json fields Gemma-2 and Gemma-3 text share."""
  dh = cfg.resolved_head_dim
  return {'vocab_size': cfg.vocab_size, 'hidden_size': cfg.d_model,
          'num_attention_heads': cfg.num_heads, 'num_key_value_heads': cfg.kv_heads,
          'head_dim': dh, 'intermediate_size': cfg.d_ff, 'num_hidden_layers': cfg.num_layers,
          'max_position_embeddings': cfg.max_len, 'rms_norm_eps': cfg.norm_eps,
          'hidden_activation': _ACT_OUT[cfg.ffn],
          'query_pre_attn_scalar': int(cfg.query_pre_attn_scalar or dh),
          'final_logit_softcapping': cfg.logits_softcap or None,
          # transformers builds a sliding mask even when no layer uses it: a window is needed.
          'sliding_window': cfg.attention_window or cfg.max_len,
          'layer_types': layer_types(cfg), 'attention_bias': False,
          'use_bidirectional_attention': False, 'tie_word_embeddings': cfg.tie_embeddings}


def config_to_hf(cfg: ModelConfig) -> dict:
  """ModelConfig -> Gemma2Config fields (config.json)."""
  check_exportable(cfg)
  return {'model_type': 'gemma2', 'architectures': ['Gemma2ForCausalLM'], **common_to_hf(cfg),
          'rope_parameters': {'rope_type': 'default', 'rope_theta': cfg.rope_theta},
          'attn_logit_softcapping': cfg.attention_softcap or None}


def params_to_hf(cfg: ModelConfig, p: dict) -> dict[str, np.ndarray]:
  """tx DecoderOnly params -> Gemma-2 / Gemma-3 text tensors (full names, 'model.' prefix)."""
  d = cfg.d_model
  out = {'embed_tokens.weight': p['embed']['embedding']}
  stack = p['decoder']['stack']
  for i in range(cfg.num_layers):
    layer, src = stack[f'layer_{i}'], f'layers.{i}.'
    attn = layer['self_attention']
    for ours, theirs in _NORMS:
      out[src + f'{theirs}.weight'] = layer[ours]['scale']
    for name, proj in (('query', 'q'), ('key', 'k'), ('value', 'v')):
      out[src + f'self_attn.{proj}_proj.weight'] = attn[name]['kernel'].reshape(d, -1).T
    out[src + 'self_attn.o_proj.weight'] = attn['out']['kernel'].reshape(-1, d).T
    if cfg.qk_norm != 'none':
      out[src + 'self_attn.q_norm.weight'] = attn['query_norm']['scale']
      out[src + 'self_attn.k_norm.weight'] = attn['key_norm']['scale']
    for name, proj in (('wi_0', 'gate'), ('wi_1', 'up'), ('wo', 'down')):
      out[src + f'mlp.{proj}_proj.weight'] = layer['ffn'][name]['kernel'].T
  out['norm.weight'] = stack['final_norm']['scale']
  out = {PREFIX + k: v for k, v in out.items()}
  if not cfg.tie_embeddings:
    out['lm_head.weight'] = p['head']['lm_head']['kernel'].T
  return out

