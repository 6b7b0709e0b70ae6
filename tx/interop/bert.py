"""BERT (with its masked-LM head) -> tx: post-norm, token types, LayerNorm after the
embeddings, exact GELU, eps 1e-12, MLM transform + tied decoder + separate bias.

The pooler and the next-sentence head of a pre-training checkpoint are not imported
(tx's classifier head is trained per task; set model.num_classes to add one).
"""

from __future__ import annotations

from tx.config.model import ModelConfig
from tx.interop.hf_config import HFConfig
from tx.interop.tensors import (Tensors, linear, linear_in, linear_out_bias, norm, put, put_head,
                                with_embedding)

PREFIX = 'bert.'
IGNORE = ('pooler.*', 'cls.seq_relationship.*', 'embeddings.position_ids',
          'cls.predictions.decoder.bias')  # the latter is the same tensor as cls.predictions.bias


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """BertConfig fields -> ModelConfig."""
  hf.expect('position_embedding_type', ('absolute',), default='absolute')
  hf.expect('is_decoder', (False,), default=False)
  act = hf.activation('hidden_act', 'gelu')
  return ModelConfig(
      family='encoder', vocab_size=hf.require('vocab_size'), d_model=hf.require('hidden_size'),
      num_heads=hf.require('num_attention_heads'), d_ff=hf.require('intermediate_size'),
      num_layers=hf.require('num_hidden_layers'),
      max_len=hf.get('max_position_embeddings', default=512), position='learned',
      norm='layernorm', norm_position='post', norm_eps=hf.get('layer_norm_eps', default=1e-12),
      embed_norm=True, ffn=act, mlm_activation=act, use_bias=True,
      type_vocab_size=hf.get('type_vocab_size', default=2),
      tie_embeddings=hf.get('tie_word_embeddings', default=True))


def params_from_hf(cfg: ModelConfig, t: Tensors) -> dict:
  """BERT tensors -> tx EncoderOnly params."""
  d, h, f, v = cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.vocab_size
  dh = cfg.resolved_head_dim
  p, embedding = with_embedding(t, 'embeddings.word_embeddings.weight', cfg)
  put(p, 'encoder/embedder/position_embedding/embedding',
      t.take('embeddings.position_embeddings.weight', (cfg.max_len, d)))
  put(p, 'encoder/embedder/token_type_embedding',
      t.take('embeddings.token_type_embeddings.weight', (cfg.type_vocab_size, d)))
  put(p, 'encoder/embedder/embed_norm', norm(t, 'embeddings.LayerNorm', d))
  for i in range(cfg.num_layers):
    src, dst = f'encoder.layer.{i}.', f'encoder/stack/layer_{i}/'
    for name in ('query', 'key', 'value'):
      put(p, dst + f'self_attention/{name}/kernel',
          linear_in(t.take(src + f'attention.self.{name}.weight', (d, d)), h, dh))
      put(p, dst + f'self_attention/{name}/bias',
          t.take(src + f'attention.self.{name}.bias', (d,)).reshape(h, dh))
    put(p, dst + 'self_attention/out', linear_out_bias(t, src + 'attention.output.dense', d, h, dh))
    put(p, dst + 'self_attention_norm', norm(t, src + 'attention.output.LayerNorm', d))
    put(p, dst + 'ffn/wi', linear(t, src + 'intermediate.dense', (f, d)))
    put(p, dst + 'ffn/wo', linear(t, src + 'output.dense', (d, f)))
    put(p, dst + 'ffn_norm', norm(t, src + 'output.LayerNorm', d))
  put(p, 'mlm_head/transform', linear(t, 'cls.predictions.transform.dense', (d, d)))
  put(p, 'mlm_head/transform_norm', norm(t, 'cls.predictions.transform.LayerNorm', d))
  bias = t.take_optional('cls.predictions.bias', (v,))
  put(p, 'mlm_head/bias', t.take('cls.predictions.decoder.bias', (v,)) if bias is None else bias)
  return put_head(p, 'mlm_head/decoder/kernel', t, 'cls.predictions.decoder.weight',
                  embedding, cfg.tie_embeddings)
