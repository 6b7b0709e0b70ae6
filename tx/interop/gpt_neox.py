"""GPT-NeoX / Pythia <-> tx: partial RoPE, LayerNorm with biases, parallel residual.

GPT-NeoX (transformers' GPTNeoXForCausalLM) in tx's vocabulary:
    rotary_pct / partial_rotary_factor    model.rope_fraction (half-split on the first
      (default 0.25)                        int(head_size * pct) dims; the rest pass through)
    rotary_emb_base / rope_theta          model.rope_theta (scaled kinds: tx.interop.hf_rope)
    use_parallel_residual=True            model.parallel_block='two_norms':
                                            x + attn(ln1(x)) + mlp(ln2(x))
    use_parallel_residual=False           model.parallel_block='none' (sequential pre-norm)
    input_layernorm / post_attention_     self_attention_norm / ffn_norm (LayerNorm, bias,
      layernorm, final_layer_norm           eps layer_norm_eps), decoder final_norm
    mlp.dense_h_to_4h / dense_4h_to_h     ffn wi / wo (hidden_act: 'gelu' is the exact erf
                                            form, Pythia's), always biased
    embed_out (transformers 5's lm_head,  head/lm_head (untied unless tie_word_embeddings)
      which it saves as embed_out)
`attention.query_key_value` fuses q, k and v per head: its output rows are laid out
[H, 3, Dh] (head major, then q | k | v), as BLOOM's. Scores are scaled by head_size^-1/2.
hidden_dropout / attention_dropout are training-only and not imported (tx convert --set
model.dropout=...). Refused: attention_bias=False (the MLP keeps its biases; tx has one
model.use_bias), a rotary_pct giving an odd or zero number of rotated dims (HF rounds it
up with frequencies of the odd count), RoPE kinds other than tx.interop.hf_rope's.
"""

from __future__ import annotations

import numpy as np

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.interop.hf_config import ANY, HFConfig, check_fields
from tx.interop.hf_rope import rope_from_hf, rope_to_hf
from tx.interop.tensors import (Tensors, linear, linear_out_bias, norm, put, put_head,
                                with_embedding)

PREFIX = 'gpt_neox.'
# Buffers older savers kept (causal masks, inverse frequencies).
IGNORE = ('layers.*.attention.bias', 'layers.*.attention.masked_bias',
          'layers.*.attention.rotary_emb.inv_freq')
_ACT_OUT = {'gelu': 'gelu', 'gelu_tanh': 'gelu_new', 'relu': 'relu', 'silu': 'silu'}
_HEAD, _ALT_HEAD = 'embed_out.weight', 'lm_head.weight'  # on disk; the module's name
DEFAULT_ROTARY_PCT = 0.25  # GPTNeoXConfig's default when neither field is present


def _rope(hf: HFConfig, head_dim: int) -> tuple[float, float, object]:
  """(rope_fraction, rope_theta, RopeScalingConfig): HF's rope_parameters wins over the
  legacy rotary_pct / rotary_emb_base, as GPTNeoXConfig.convert_rope_params_to_dict."""
  params = dict(hf.get('rope_scaling') or hf.get('rope_parameters') or {})
  fraction = float(params.pop('partial_rotary_factor', None)
                   or hf.get('rotary_pct', 'partial_rotary_factor', default=DEFAULT_ROTARY_PCT))
  rot = int(head_dim * fraction)
  if rot <= 0 or rot % 2:
    raise ConfigError(f'{hf.source}: rotary_pct={fraction} gives {rot} rotated dims of '
                      f'head_size {head_dim}; tx needs a positive even number')
  params['rope_theta'] = (params.get('rope_theta')
                          or hf.get('rotary_emb_base', 'rope_theta', default=10000.0))
  # The partial factor is ours; hf_rope scales the rotated dims exactly as HF does.
  view = HFConfig({**hf.data, 'rope_parameters': params, 'rope_scaling': None}, hf.source)
  theta, scaling = rope_from_hf(view)
  return fraction, theta, scaling


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """GPTNeoXConfig fields -> ModelConfig."""
  if not hf.get('attention_bias', default=True):
    raise ConfigError(f'{hf.source}: attention_bias=False is not supported (the GPT-NeoX '
                      'MLP keeps its biases; tx has one model.use_bias)')
  d = hf.require('hidden_size')
  heads = hf.require('num_attention_heads')
  fraction, theta, scaling = _rope(hf, d // heads)
  parallel = hf.get('use_parallel_residual', default=True)
  return ModelConfig(
      family='decoder', vocab_size=hf.require('vocab_size'), d_model=d, num_heads=heads,
      d_ff=hf.require('intermediate_size'), num_layers=hf.require('num_hidden_layers'),
      max_len=hf.get('max_position_embeddings', default=2048), position='rope',
      rope_theta=float(theta), rope_fraction=fraction, rope_scaling=scaling,
      norm='layernorm', norm_position='pre', norm_eps=hf.get('layer_norm_eps', default=1e-5),
      parallel_block='two_norms' if parallel else 'none',
      ffn=hf.activation('hidden_act', 'gelu'), use_bias=True,
      tie_embeddings=hf.get('tie_word_embeddings', default=False))


def params_from_hf(cfg: ModelConfig, t: Tensors) -> dict:
  """GPT-NeoX tensors -> tx DecoderOnly params."""
  d, h, f = cfg.d_model, cfg.num_heads, cfg.d_ff
  dh = cfg.resolved_head_dim
  p, embedding = with_embedding(t, 'embed_in.weight', cfg)
  for i in range(cfg.num_layers):
    src, dst = f'layers.{i}.', f'decoder/stack/layer_{i}/'
    put(p, dst + 'self_attention_norm', norm(t, src + 'input_layernorm', d))
    w_DH3K = t.take(src + 'attention.query_key_value.weight', (3 * d, d)).T.reshape(d, h, 3, dh)
    b_H3K = t.take(src + 'attention.query_key_value.bias', (3 * d,)).reshape(h, 3, dh)
    for j, name in enumerate(('query', 'key', 'value')):
      put(p, dst + f'self_attention/{name}/kernel', np.ascontiguousarray(w_DH3K[:, :, j]))
      put(p, dst + f'self_attention/{name}/bias', np.ascontiguousarray(b_H3K[:, j]))
    put(p, dst + 'self_attention/out', linear_out_bias(t, src + 'attention.dense', d, h, dh))
    put(p, dst + 'ffn_norm', norm(t, src + 'post_attention_layernorm', d))
    put(p, dst + 'ffn/wi', linear(t, src + 'mlp.dense_h_to_4h', (f, d)))
    put(p, dst + 'ffn/wo', linear(t, src + 'mlp.dense_4h_to_h', (d, f)))
  put(p, 'decoder/stack/final_norm', norm(t, 'final_layer_norm', d))
  head = _ALT_HEAD if t.has(_ALT_HEAD) and not t.has(_HEAD) else _HEAD
  return put_head(p, 'head/lm_head/kernel', t, head, embedding, cfg.tie_embeddings)


def check_exportable(cfg: ModelConfig) -> None:
  """ConfigError naming the first field that GPT-NeoX's architecture cannot express."""
  wanted = {'family': 'decoder', 'position': 'rope', 'rope_fraction': ANY,
            'rope_scaling.kind': ANY, 'parallel_block': ANY, 'norm': 'layernorm',
            'norm_position': 'pre', 'norm_bias': True, 'use_bias': True, 'embed_norm': False,
            'scale_embeddings': False, 'logits_scale': 1.0, 'num_kv_heads': None,
            'head_dim': None, 'scale_attention': True}
  check_fields(cfg, wanted, 'GPT-NeoX')
  if cfg.parallel_block == 'shared_norm':
    raise ConfigError("model.parallel_block='shared_norm': GPT-NeoX export needs 'two_norms' "
                      "or 'none' (use_parallel_residual keeps two LayerNorms)")
  if cfg.ffn not in _ACT_OUT:
    raise ConfigError(f'model.ffn={cfg.ffn!r}: GPT-NeoX export needs one of {sorted(_ACT_OUT)}')
  rope_to_hf(cfg)


def config_to_hf(cfg: ModelConfig) -> dict:
  """ModelConfig -> GPTNeoXConfig fields (config.json)."""
  check_exportable(cfg)
  rope = {**rope_to_hf(cfg), 'partial_rotary_factor': cfg.rope_fraction}
  return {'model_type': 'gpt_neox', 'architectures': ['GPTNeoXForCausalLM'],
          'vocab_size': cfg.vocab_size, 'hidden_size': cfg.d_model,
          'num_attention_heads': cfg.num_heads, 'intermediate_size': cfg.d_ff,
          'num_hidden_layers': cfg.num_layers, 'max_position_embeddings': cfg.max_len,
          'layer_norm_eps': cfg.norm_eps, 'hidden_act': _ACT_OUT[cfg.ffn],
          'rope_parameters': rope, 'use_parallel_residual': cfg.parallel_block == 'two_norms',
          'attention_bias': True, 'tie_word_embeddings': cfg.tie_embeddings,
          'hidden_dropout': 0.0, 'attention_dropout': 0.0}


def params_to_hf(cfg: ModelConfig, p: dict) -> dict[str, np.ndarray]:
  """tx DecoderOnly params -> GPT-NeoX tensors (full names, 'gpt_neox.' prefix)."""
  d = cfg.d_model
  out = {'embed_in.weight': p['embed']['embedding']}
  stack = p['decoder']['stack']
  for i in range(cfg.num_layers):
    layer, src = stack[f'layer_{i}'], f'layers.{i}.'
    attn = layer['self_attention']
    for tx_name, hf_name in (('self_attention_norm', 'input_layernorm'),
                             ('ffn_norm', 'post_attention_layernorm')):
      out[src + f'{hf_name}.weight'] = layer[tx_name]['scale']
      out[src + f'{hf_name}.bias'] = layer[tx_name]['bias']
    names = ('query', 'key', 'value')
    w_DH3K = np.stack([attn[n]['kernel'] for n in names], axis=2)
    out[src + 'attention.query_key_value.weight'] = w_DH3K.reshape(d, 3 * d).T
    out[src + 'attention.query_key_value.bias'] = np.stack(
        [attn[n]['bias'] for n in names], axis=1).reshape(3 * d)
    out[src + 'attention.dense.weight'] = attn['out']['kernel'].reshape(d, d).T
    out[src + 'attention.dense.bias'] = attn['out']['bias']
    for tx_name, hf_name in (('wi', 'dense_h_to_4h'), ('wo', 'dense_4h_to_h')):
      out[src + f'mlp.{hf_name}.weight'] = layer['ffn'][tx_name]['kernel'].T
      out[src + f'mlp.{hf_name}.bias'] = layer['ffn'][tx_name]['bias']
  out['final_layer_norm.weight'] = stack['final_norm']['scale']
  out['final_layer_norm.bias'] = stack['final_norm']['bias']
  out = {PREFIX + k: v for k, v in out.items()}
  if not cfg.tie_embeddings:
    out[_HEAD] = p['head']['lm_head']['kernel'].T
  return out
