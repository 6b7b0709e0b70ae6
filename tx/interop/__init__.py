"""tx.interop: Hugging Face checkpoints in and out.

## Hugging Face checkpoints

Import a local checkpoint directory (`config.json` + `model.safetensors`, its shards, or a
`pytorch_model.bin`; no hub access) as tx params, or export tx params to a directory
`transformers` loads with `from_pretrained`:

```python
from tx.interop import load_hf, export_hf
cfg, params = load_hf('path/to/gpt2')             # tx.ModelConfig, plain float32 param tree
logits = tx.build_model(cfg).apply({'params': params}, tokens)     # tokens [B, L], pad id 0
export_hf(cfg, params, 'out/dir')                  # GPT-2 or LLaMA layout (RoPE -> LLaMA)
```

```bash
tx convert --hf path/to/checkpoint --workdir runs/gpt2 [--experiment NAME] \\
    [--set train.steps=100 ...]
```

`tx convert` writes a run directory (`config.json` + an Orbax checkpoint at step 0 with a
fresh optimizer state) whose `data.*`, `optim.*`, `train.*` and `decode.*` come from
experiment NAME (default: tx's defaults, run name `hf_<dir name>`); `model.*` comes from the
checkpoint (`--set` may change only `model.dropout`, `attention_dropout`, `remat`, `dtype`,
`attention_impl`). Reading safetensors needs only `safetensors` (bfloat16 included), a
`pytorch_model.bin` needs torch (read with `weights_only=True`), export needs `safetensors`:
`pip install -e ".[interop]"` installs them with torch 2.13 (CPU) and transformers 5.

| model_type | tx config it becomes |
|---|---|
| `gpt2` | decoder, `position=learned`, `norm=layernorm` pre-norm, `ffn=gelu_tanh`, biases, tied head (fused `c_attn` split into q/k/v) |
| `bert` (MLM head) | encoder, `position=learned`, `norm_position=post`, `norm_eps=1e-12`, `embed_norm`, `type_vocab_size`, `ffn=gelu` (exact), `mlm_activation=gelu`; MLM transform + tied decoder + separate bias |
| `t5` v1.0 / v1.1 | encoder_decoder, `position=t5` (one bucketed table per stack, none in cross-attention), `scale_attention=False`, `norm=rmsnorm` (no mean, no bias), `use_bias=False`, `ffn=relu` / `geglu_tanh`, `logits_scale=d_model^-0.5` when the original ties the head |
| `llama` (incl. 3.1) | decoder, `position=rope` (half-split), `norm=rmsnorm`, `ffn=swiglu`, `num_kv_heads` (GQA), `use_bias=False`, untied head; `rope_parameters` / `rope_scaling` `llama3`, `linear`, `dynamic`, `yarn` -> `rope_scaling.*` (tx/interop/hf_rope.py) |
| `mistral` | LLaMA's mapping + `attention_window` from `sliding_window` on every layer; export `arch='mistral'` (tx/interop/mistral.py) |
| `qwen3` | LLaMA's mapping + `qk_norm=rmsnorm` (per-head `q_norm` / `k_norm`), explicit `head_dim`, tie option, `attention_window` + `attention_pattern` from `use_sliding_window` / `sliding_window` / `layer_types` (or `max_window_layers`); export `arch='qwen3'` (tx/interop/qwen3.py) |
| `bloom` | decoder, `position=alibi` (any head count), `embed_norm`, `ffn=gelu_tanh`, biases, tied head (per-head fused qkv split) |
| `gpt_neox` (Pythia) | decoder, `position=rope` with `rope_fraction` = `rotary_pct` (half-split on the rotated dims; scaled kinds as LLaMA), `parallel_block=two_norms` (`use_parallel_residual`) or sequential pre-norm, `norm=layernorm` with biases, `ffn` from `hidden_act` (`gelu` exact), biases, untied `embed_out` (tie option), per-head fused qkv split; export `arch='gpt_neox'`, the default for RoPE with LayerNorm (tx/interop/gpt_neox.py) |
| `gemma2` | decoder, `position=rope`, `norm=rmsnorm` with `norm_scale_offset` (x̂·(1+w)), `sandwich_norm`, `ffn=geglu_tanh`, `scale_embeddings`, `query_pre_attn_scalar`, `attention_softcap`, `logits_softcap`, `attention_window` + `attention_pattern` from `sliding_window` + `layer_types`, GQA, tied head; export `arch='gemma2'` (tx/interop/gemma2.py) |
| `gemma3_text` | Gemma-2's mapping + `qk_norm=rmsnorm` (1+w), `rope_local_theta` (sliding layers' base, unscaled), `rope_scaling` `linear` on the global layers; `attn_logit_softcapping` ignored as transformers does; export `arch='gemma3'` (tx/interop/gemma3.py) |

Export: GPT-2 and LLaMA (`export_hf(cfg, params, dir, arch='gpt2'|'llama')`; RoPE models
with `qk_norm=rmsnorm` default to `qwen3`, with a window on every layer to `mistral`, with
LayerNorm or a parallel block to `gpt_neox`); a config
the target cannot express (e.g. ALiBi as GPT-2) is a ConfigError naming the field.
Tests (`tests/interop/`, skipped without torch + transformers) build each reference model
with random weights, require float32 logits within 1e-4 on padded batches, greedy
generation equal token for token (tx's KV cache vs `generate`), and bitwise export ->
import round trips.

Limitations:
- tx's pad id is 0 and masks come from `tokens != 0`: on raw ids GPT-2's id 0 ("!") counts
  as padding and is never generated, unless you pass explicit validity (`segment_ids` to the
  model; `prompt_valid=` and `pad_id=-1` to `tx.decode.generate_lm`, which is what
  `tx generate` does with GPT-2's own tokenizer). T5 starts decoding from id 0: pass
  `tgt_segment_ids` (1 on real target tokens, the start included) to the model and
  `bos_id=0` to `tx.decode.generate_seq2seq`.
- Tokenizers: `tx convert` copies the checkpoint's `tokenizer.json` (+ its tokenizer configs)
  into OUT/tokenizer/ and sets `data.tokenizer=hf`, so `tx generate --workdir OUT --prompt
  TEXT` works with no further flags and `tx eval` works given a dataset (`--set
  data.dataset=text data.files=...` for decoders and BERT, `data.dataset=parallel
  data.source_files=... data.target_files=...` for T5, when converting); commands and the
  special-id design: `tx/interop/convert.py`, `tx/data/tokenizers/hf.py`. `tx eval` of BERT
  (MLM) masks with the checkpoint's [MASK] and frames rows [CLS] ... [SEP]; of T5 builds
  rows as transformers does (source + </s>, decoder inputs from id 0 with segment ids);
  without a tokenizer.json, generate / eval stop with a one-line error saying to add one.
  `tx train --workdir OUT [--set train.steps=N ...]` (no experiment name) fine-tunes a
  converted run with its own config: it resumes from the step-0 checkpoint
  (tests/interop/test_tokenizer.py for GPT-2, test_t5_tokenizer.py for T5).
- Not reproduced (ConfigError naming the field): LLaMA-family RoPE scaling other than
  llama3 / linear / dynamic / yarn (e.g. `longrope`), a scaled `partial_rotary_factor`
  != 1, Qwen3 `attention_bias` (no MLP bias) or unknown `layer_types`, LLaMA with
  `attention_bias != mlp_bias`, BLOOM with `apply_residual_connection_post_layernorm`,
  GPT-2 `scale_attn_by_inverse_layer_idx` / `reorder_and_upcast_attn`, BERT relative
  position embeddings. BERT's pooler and next-sentence head are not imported. Imported
  params are float32.
"""

from tx.interop.export import export_hf
from tx.interop.load import load_hf, read_hf_config

__all__ = ['export_hf', 'load_hf', 'read_hf_config']
