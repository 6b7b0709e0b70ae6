"""Mistral <-> tx: LLaMA (tx.interop.llama) with sliding-window attention on every layer.

config.json `sliding_window` W (null = global attention) <-> `model.attention_window=W`,
`model.attention_pattern='local'`: the query at position i attends to the keys at
i - W + 1 .. i, as transformers' sliding-window causal mask (`kv_idx > q_idx - W`) and its
sliding KV cache. Mistral has no biases (`attention_bias` in a config.json is ignored, as
transformers does); RoPE scaling as LLaMA's. Tensor names are LLaMA's.
"""

from __future__ import annotations

from tx.config.model import ModelConfig
from tx.interop import llama
from tx.interop.hf_config import ANY, HFConfig

PREFIX, IGNORE = llama.PREFIX, llama.IGNORE
params_from_hf, params_to_hf = llama.params_from_hf, llama.params_to_hf


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """MistralConfig fields -> ModelConfig."""
  return llama.base_config(hf, attention_window=hf.get('sliding_window') or 0)


def check_exportable(cfg: ModelConfig) -> None:
  """ConfigError naming the first field Mistral cannot express (a window on some layers
  only: Qwen3's layer_types can, see tx.interop.qwen3)."""
  llama.check_exportable(cfg, {'attention_window': ANY, 'attention_pattern': 'local'},
                         'Mistral')


def config_to_hf(cfg: ModelConfig) -> dict:
  """ModelConfig -> MistralConfig fields (config.json)."""
  check_exportable(cfg)
  return {'model_type': 'mistral', 'architectures': ['MistralForCausalLM'],
          **llama.base_to_hf(cfg), 'sliding_window': cfg.attention_window or None}
