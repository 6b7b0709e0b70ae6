"""`export_hf(config, params, path)`: tx params -> a directory `transformers` loads.

GPT-2 (learned positions, LayerNorm) and LLaMA (RoPE, RMSNorm, SwiGLU) layouts; the config
must be expressible in the chosen architecture, else a ConfigError names the field.
Writes config.json and model.safetensors (float32, or the params' dtype).
"""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.data.tokenizers.specials import BOS_ID, EOS_ID, PAD_ID
from tx.interop import files, gpt2, llama
from tx.interop import mistral, qwen3  # LLaMA-like (tx.interop.llama)
from tx.interop import gemma2, gemma3  # Gemma-2, Gemma-3 text
from tx.interop import gpt_neox  # GPT-NeoX / Pythia

EXPORTERS = {'gpt2': gpt2, 'llama': llama}
EXPORTERS.update({'mistral': mistral, 'qwen3': qwen3})
EXPORTERS.update({'gemma2': gemma2, 'gemma3': gemma3})  # gemma3: model_type gemma3_text
EXPORTERS['gpt_neox'] = gpt_neox


def default_architecture(cfg: ModelConfig) -> str:
  """'llama' for RoPE models ('qwen3' with qk_norm, 'mistral' with a window on every
  layer), else 'gpt2'."""
  if cfg.position == 'rope' and cfg.sandwich_norm and cfg.norm_scale_offset:  # Gemma
    return 'gemma3' if cfg.qk_norm != 'none' or cfg.rope_local_theta is not None else 'gemma2'
  if cfg.position == 'rope' and cfg.qk_norm == 'rmsnorm':
    return 'qwen3'
  if cfg.position == 'rope' and cfg.attention_window and cfg.attention_pattern == 'local':
    return 'mistral'
  if cfg.position == 'rope' and (cfg.norm == 'layernorm' or cfg.parallel_block != 'none'):
    return 'gpt_neox'
  return 'llama' if cfg.position == 'rope' else 'gpt2'


def export_hf(cfg: ModelConfig, params, path: str | Path, *, arch: str | None = None) -> Path:
  """Writes `params` (a tx DecoderOnly tree, boxed or not) as a Hugging Face checkpoint.

  arch: 'gpt2' | 'llama' | 'mistral' | 'qwen3' | 'gemma2' | 'gemma3' | 'gpt_neox' | None
  (`default_architecture`; sandwich norms with norm_scale_offset -> Gemma; RoPE with
  LayerNorm or a parallel block -> GPT-NeoX).
  Returns the directory, which holds config.json and model.safetensors.
  """
  arch = arch or default_architecture(cfg)
  if arch not in EXPORTERS:
    raise ConfigError(f'export arch={arch!r}: tx exports {", ".join(sorted(EXPORTERS))}')
  module = EXPORTERS[arch]
  hf_config = module.config_to_hf(cfg)
  arrays = jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(params)))
  tensors = {k: np.ascontiguousarray(v) for k, v in module.params_to_hf(cfg, arrays).items()}
  path = Path(path).expanduser()
  path.mkdir(parents=True, exist_ok=True)
  try:
    # optional (the interop extra)
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError('export needs the safetensors package: pip install safetensors '
                      '(or the interop extra)') from None
  save_file(tensors, str(path / files.SAFETENSORS), metadata={'format': 'pt'})
  hf_config['dtype'] = str(next(iter(tensors.values())).dtype)
  hf_config.update(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)  # tx's ids
  (path / files.CONFIG).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + '\n')
  return path
