"""T5 v1.0 (relu) and v1.1 (gated gelu_tanh) -> tx encoder-decoder.

RMSNorm without mean or bias, no biases, no 1/sqrt(d) score scaling, one bucketed
relative-bias table per stack held by its first layer (tx: the stack's `position_bias`)
and none in cross-attention; the output is scaled by d_model^-0.5 when the original
config ties the head (v1.0), which `transformers` 5 records as `scale_decoder_outputs`.

T5 starts decoding from its pad id 0, which tx's masks (`tokens != 0`) would treat as
padding: pass `tgt_segment_ids` (1 on real target tokens, the start token included) to
the model, and `bos_id=0` to `tx.decode.generate_seq2seq` (it then marks the start slot
as a real token).
"""

from __future__ import annotations

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.interop.hf_config import ACTIVATIONS, HFConfig
from tx.interop.tensors import (Tensors, dense, linear_in, linear_out, norm, put, put_head,
                                with_embedding)

PREFIX = ''
IGNORE = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight')  # = shared.weight
_GATED = {'relu': 'reglu', 'gelu_tanh': 'geglu_tanh', 'gelu': 'geglu', 'silu': 'swiglu'}


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """T5Config fields -> ModelConfig."""
  proj = hf.get('feed_forward_proj', default='relu')
  gated = proj.startswith('gated-')
  act = proj.split('-')[-1]
  if proj == 'gated-gelu':
    act = 'gelu_new'  # T5 v1.1's historical meaning of 'gated-gelu'
  if act not in ACTIVATIONS:
    raise ConfigError(f'{hf.source}: feed_forward_proj={proj!r} is not supported')
  ffn = ACTIVATIONS[act]
  if gated:
    ffn = _GATED[ffn]
  d, heads = hf.require('d_model'), hf.require('num_heads')
  d_kv = hf.get('d_kv', default=d // heads)
  scale = hf.get('scale_decoder_outputs', default=hf.get('tie_word_embeddings', default=True))
  layers = hf.require('num_layers')
  return ModelConfig(
      family='encoder_decoder', vocab_size=hf.require('vocab_size'), d_model=d,
      num_heads=heads, head_dim=None if d_kv * heads == d else d_kv, d_ff=hf.require('d_ff'),
      num_layers=layers, num_encoder_layers=layers,
      num_decoder_layers=hf.get('num_decoder_layers', default=layers),
      max_len=hf.get('n_positions', default=512), position='t5',
      t5_num_buckets=hf.get('relative_attention_num_buckets', default=32),
      t5_max_distance=hf.get('relative_attention_max_distance', default=128),
      scale_attention=False, norm='rmsnorm', norm_position='pre',
      norm_eps=hf.get('layer_norm_epsilon', default=1e-6), ffn=ffn, use_bias=False,
      share_embeddings=True, tie_embeddings=hf.get('tie_word_embeddings', default=True),
      logits_scale=d ** -0.5 if scale else 1.0)


def _attention(t: Tensors, p: dict, src: str, dst: str, cfg: ModelConfig) -> None:
  d, h, dh = cfg.d_model, cfg.num_heads, cfg.resolved_head_dim
  for name, proj in (('query', 'q'), ('key', 'k'), ('value', 'v')):
    put(p, f'{dst}/{name}/kernel', linear_in(t.take(f'{src}.{proj}.weight', (h * dh, d)), h, dh))
  put(p, f'{dst}/out/kernel', linear_out(t.take(f'{src}.o.weight', (d, h * dh)), h, dh))


def _ffn(t: Tensors, p: dict, src: str, dst: str, cfg: ModelConfig) -> None:
  d, f = cfg.d_model, cfg.d_ff
  names = ('wi_0', 'wi_1') if cfg.ffn in _GATED.values() else ('wi',)
  for name in names:
    put(p, f'{dst}/{name}/kernel', dense(t.take(f'{src}.{name}.weight', (f, d))))
  put(p, f'{dst}/wo/kernel', dense(t.take(f'{src}.wo.weight', (d, f))))


def params_from_hf(cfg: ModelConfig, t: Tensors) -> dict:
  """T5 tensors -> tx EncoderDecoder params."""
  d = cfg.d_model
  name = 'shared.weight' if t.has('shared.weight') else 'encoder.embed_tokens.weight'
  p, embedding = with_embedding(t, name, cfg)
  for stack, layers in (('encoder', cfg.encoder_layers), ('decoder', cfg.decoder_layers)):
    put(p, f'{stack}/position_bias/relative_bias/rel_embedding', t.take(
        f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
        (cfg.t5_num_buckets, cfg.num_heads)))
    for i in range(layers):
      src, dst = f'{stack}.block.{i}.layer', f'{stack}/stack/layer_{i}'
      _attention(t, p, f'{src}.0.SelfAttention', f'{dst}/self_attention', cfg)
      put(p, f'{dst}/self_attention_norm', norm(t, f'{src}.0.layer_norm', d, bias=False))
      ffn_index = 1
      if stack == 'decoder':
        _attention(t, p, f'{src}.1.EncDecAttention', f'{dst}/cross_attention', cfg)
        put(p, f'{dst}/cross_attention_norm', norm(t, f'{src}.1.layer_norm', d, bias=False))
        ffn_index = 2
      _ffn(t, p, f'{src}.{ffn_index}.DenseReluDense', f'{dst}/ffn', cfg)
      put(p, f'{dst}/ffn_norm', norm(t, f'{src}.{ffn_index}.layer_norm', d, bias=False))
    put(p, f'{stack}/stack/final_norm', norm(t, f'{stack}.final_layer_norm', d, bias=False))
  return put_head(p, 'head/lm_head/kernel', t, 'lm_head.weight', embedding, cfg.tie_embeddings)
