"""GPT-2 <-> tx: learned positions, pre-norm LayerNorm, gelu_tanh, tied head.

GPT-2 stores its projections as `Conv1D`, already [in, out], with q, k and v fused into
one `c_attn` [D, 3D] (columns q | k | v, heads major within each).
"""

from __future__ import annotations

import numpy as np

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.interop.hf_config import HFConfig, check_fields
from tx.interop.tensors import Tensors, norm, put, put_head, with_embedding

PREFIX = 'transformer.'
IGNORE = ('h.*.attn.bias', 'h.*.attn.masked_bias')  # causal-mask buffers of older savers
_ACT_OUT = {'gelu_tanh': 'gelu_new', 'gelu': 'gelu', 'relu': 'relu', 'silu': 'silu'}


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """GPT2Config fields -> ModelConfig."""
  for name in ('scale_attn_by_inverse_layer_idx', 'reorder_and_upcast_attn',
               'add_cross_attention'):
    hf.expect(name, (False,), default=False)
  hf.expect('scale_attn_weights', (True,), default=True)
  d = hf.require('n_embd', 'hidden_size')
  return ModelConfig(
      family='decoder', vocab_size=hf.require('vocab_size'), d_model=d,
      num_heads=hf.require('n_head', 'num_attention_heads'),
      num_layers=hf.require('n_layer', 'num_hidden_layers'), d_ff=hf.get('n_inner') or 4 * d,
      max_len=hf.get('n_positions', 'n_ctx', default=1024), position='learned',
      norm='layernorm', norm_position='pre', norm_eps=hf.get('layer_norm_epsilon', default=1e-5),
      ffn=hf.activation('activation_function', 'gelu_new'), use_bias=True,
      tie_embeddings=hf.get('tie_word_embeddings', default=True))


def params_from_hf(cfg: ModelConfig, t: Tensors) -> dict:
  """GPT-2 tensors -> tx DecoderOnly params."""
  d, h, f = cfg.d_model, cfg.num_heads, cfg.d_ff
  dh = cfg.resolved_head_dim
  p, embedding = with_embedding(t, 'wte.weight', cfg)
  put(p, 'decoder/embedder/position_embedding/embedding', t.take('wpe.weight', (cfg.max_len, d)))
  for i in range(cfg.num_layers):
    src, dst = f'h.{i}.', f'decoder/stack/layer_{i}/'
    put(p, dst + 'self_attention_norm', norm(t, src + 'ln_1', d))
    qkv_w = t.take(src + 'attn.c_attn.weight', (d, 3 * d))
    qkv_b = t.take(src + 'attn.c_attn.bias', (3 * d,))
    for j, name in enumerate(('query', 'key', 'value')):
      put(p, dst + f'self_attention/{name}/kernel', qkv_w[:, j * d:(j + 1) * d].reshape(d, h, dh))
      put(p, dst + f'self_attention/{name}/bias', qkv_b[j * d:(j + 1) * d].reshape(h, dh))
    put(p, dst + 'self_attention/out/kernel',
        t.take(src + 'attn.c_proj.weight', (d, d)).reshape(h, dh, d))
    put(p, dst + 'self_attention/out/bias', t.take(src + 'attn.c_proj.bias', (d,)))
    put(p, dst + 'ffn_norm', norm(t, src + 'ln_2', d))
    put(p, dst + 'ffn/wi', {'kernel': t.take(src + 'mlp.c_fc.weight', (d, f)),
                            'bias': t.take(src + 'mlp.c_fc.bias', (f,))})
    put(p, dst + 'ffn/wo', {'kernel': t.take(src + 'mlp.c_proj.weight', (f, d)),
                            'bias': t.take(src + 'mlp.c_proj.bias', (d,))})
  put(p, 'decoder/stack/final_norm', norm(t, 'ln_f', d))
  return put_head(p, 'head/lm_head/kernel', t, 'lm_head.weight', embedding, cfg.tie_embeddings)


def check_exportable(cfg: ModelConfig) -> None:
  """ConfigError naming the first field that GPT-2's architecture cannot express."""
  wanted = dict(family='decoder', position='learned', norm='layernorm', norm_position='pre',
                norm_bias=True, use_bias=True, embed_norm=False, scale_embeddings=False,
                logits_scale=1.0, num_kv_heads=None, head_dim=None, scale_attention=True)
  check_fields(cfg, wanted, 'GPT-2')
  if cfg.ffn not in _ACT_OUT:
    raise ConfigError(f'model.ffn={cfg.ffn!r}: GPT-2 export needs one of {sorted(_ACT_OUT)}')


def config_to_hf(cfg: ModelConfig) -> dict:
  """ModelConfig -> GPT2Config fields (config.json)."""
  check_exportable(cfg)
  return {'model_type': 'gpt2', 'architectures': ['GPT2LMHeadModel'],
          'vocab_size': cfg.vocab_size, 'n_embd': cfg.d_model, 'n_head': cfg.num_heads,
          'n_layer': cfg.num_layers, 'n_inner': cfg.d_ff, 'n_positions': cfg.max_len,
          'layer_norm_epsilon': cfg.norm_eps, 'activation_function': _ACT_OUT[cfg.ffn],
          'tie_word_embeddings': cfg.tie_embeddings, 'resid_pdrop': 0.0, 'embd_pdrop': 0.0,
          'attn_pdrop': 0.0}


def params_to_hf(cfg: ModelConfig, p: dict) -> dict[str, np.ndarray]:
  """tx DecoderOnly params -> GPT-2 tensors (full names, 'transformer.' prefix)."""
  d = cfg.d_model
  out = {'wte.weight': p['embed']['embedding'],
         'wpe.weight': p['decoder']['embedder']['position_embedding']['embedding']}
  stack = p['decoder']['stack']
  for i in range(cfg.num_layers):
    layer, src = stack[f'layer_{i}'], f'h.{i}.'
    attn = layer['self_attention']
    out[src + 'ln_1.weight'] = layer['self_attention_norm']['scale']
    out[src + 'ln_1.bias'] = layer['self_attention_norm']['bias']
    out[src + 'attn.c_attn.weight'] = np.concatenate(
        [attn[n]['kernel'].reshape(d, d) for n in ('query', 'key', 'value')], axis=1)
    out[src + 'attn.c_attn.bias'] = np.concatenate(
        [attn[n]['bias'].reshape(d) for n in ('query', 'key', 'value')])
    out[src + 'attn.c_proj.weight'] = attn['out']['kernel'].reshape(d, d)
    out[src + 'attn.c_proj.bias'] = attn['out']['bias']
    out[src + 'ln_2.weight'] = layer['ffn_norm']['scale']
    out[src + 'ln_2.bias'] = layer['ffn_norm']['bias']
    out[src + 'mlp.c_fc.weight'] = layer['ffn']['wi']['kernel']
    out[src + 'mlp.c_fc.bias'] = layer['ffn']['wi']['bias']
    out[src + 'mlp.c_proj.weight'] = layer['ffn']['wo']['kernel']
    out[src + 'mlp.c_proj.bias'] = layer['ffn']['wo']['bias']
  out['ln_f.weight'] = stack['final_norm']['scale']
  out['ln_f.bias'] = stack['final_norm']['bias']
  out = {PREFIX + k: v for k, v in out.items()}
  if not cfg.tie_embeddings:
    out['lm_head.weight'] = p['head']['lm_head']['kernel'].T
  return out
