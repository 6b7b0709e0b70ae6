"""BLOOM -> tx: ALiBi, LayerNorm after the embeddings, pre-norm, gelu_tanh, tied head.

`query_key_value` fuses q, k and v per head: its output rows are laid out [H, 3, Dh]
(head major, then q | k | v), unlike GPT-2's [3, H, Dh].
"""

from __future__ import annotations

from tx.config.model import ModelConfig
from tx.interop.hf_config import HFConfig
from tx.interop.tensors import Tensors, linear, linear_out_bias, norm, put, put_head, with_embedding

PREFIX = 'transformer.'
IGNORE = ()


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """BloomConfig fields -> ModelConfig (ALiBi has no table, so max_len only bounds data)."""
  hf.expect('apply_residual_connection_post_layernorm', (False,), default=False)
  hf.expect('slow_but_exact', (False,), default=False)
  d = hf.require('hidden_size', 'n_embed')
  return ModelConfig(
      family='decoder', vocab_size=hf.require('vocab_size'), d_model=d,
      num_heads=hf.require('n_head', 'num_attention_heads'),
      num_layers=hf.require('n_layer', 'num_hidden_layers'), d_ff=4 * d,
      max_len=hf.get('seq_length', default=2048), position='alibi', norm='layernorm',
      norm_position='pre', norm_eps=hf.get('layer_norm_epsilon', default=1e-5),
      embed_norm=True, ffn='gelu_tanh', use_bias=True,
      tie_embeddings=hf.get('tie_word_embeddings', default=True))


def params_from_hf(cfg: ModelConfig, t: Tensors) -> dict:
  """BLOOM tensors -> tx DecoderOnly params."""
  d, h, f = cfg.d_model, cfg.num_heads, cfg.d_ff
  dh = cfg.resolved_head_dim
  p, embedding = with_embedding(t, 'word_embeddings.weight', cfg)
  put(p, 'decoder/embedder/embed_norm', norm(t, 'word_embeddings_layernorm', d))
  for i in range(cfg.num_layers):
    src, dst = f'h.{i}.', f'decoder/stack/layer_{i}/'
    put(p, dst + 'self_attention_norm', norm(t, src + 'input_layernorm', d))
    qkv_w = t.take(src + 'self_attention.query_key_value.weight', (3 * d, d))
    qkv_b = t.take(src + 'self_attention.query_key_value.bias', (3 * d,))
    w_DH3K = qkv_w.T.reshape(d, h, 3, dh)
    b_H3K = qkv_b.reshape(h, 3, dh)
    for j, name in enumerate(('query', 'key', 'value')):
      put(p, dst + f'self_attention/{name}/kernel', w_DH3K[:, :, j].copy())
      put(p, dst + f'self_attention/{name}/bias', b_H3K[:, j].copy())
    put(p, dst + 'self_attention/out', linear_out_bias(t, src + 'self_attention.dense', d, h, dh))
    put(p, dst + 'ffn_norm', norm(t, src + 'post_attention_layernorm', d))
    put(p, dst + 'ffn/wi', linear(t, src + 'mlp.dense_h_to_4h', (f, d)))
    put(p, dst + 'ffn/wo', linear(t, src + 'mlp.dense_4h_to_h', (d, f)))
  put(p, 'decoder/stack/final_norm', norm(t, 'ln_f', d))
  return put_head(p, 'head/lm_head/kernel', t, 'lm_head.weight', embedding, cfg.tie_embeddings)
