"""Qwen3 <-> tx: LLaMA (tx.interop.llama) with a per-head RMSNorm of q and k before RoPE
(`model.qk_norm=rmsnorm`, eps = rms_norm_eps; tensors `self_attn.q_norm` / `k_norm`
[head_dim]), an explicit head_dim, and optional sliding-window layers.

The window: `use_sliding_window` + `sliding_window` W, and per layer `layer_types`
('full_attention' | 'sliding_attention'; when absent transformers derives it: sliding from
layer `max_window_layers` on) <-> `model.attention_window=W` and `model.attention_pattern`
(the layer kinds, shortened to their repeating unit). Any such pattern is expressible;
unknown layer types are refused, as are attention biases (Qwen3 biases q/k/v/o but not
the MLP, and tx has one `model.use_bias`).
"""

from __future__ import annotations

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.interop import llama
from tx.interop.hf_config import ANY, HFConfig

PREFIX, IGNORE = llama.PREFIX, llama.IGNORE
params_from_hf, params_to_hf = llama.params_from_hf, llama.params_to_hf
_KINDS = {'full_attention': 'global', 'sliding_attention': 'local'}


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """Qwen3Config fields -> ModelConfig."""
  if hf.get('attention_bias', default=False):
    raise ConfigError(f'{hf.source}: attention_bias=True is not supported (Qwen3 biases '
                      'q/k/v/o but not the MLP; tx has one model.use_bias)')
  hf.require('head_dim')  # Qwen3Config's default is 128, not hidden_size / heads
  return llama.base_config(hf, qk_norm='rmsnorm', **_window(hf))


def _window(hf: HFConfig) -> dict:
  """{attention_window, attention_pattern} of the sliding-window fields ({} = global)."""
  n = hf.require('num_hidden_layers')
  window = hf.get('sliding_window') if hf.get('use_sliding_window', default=False) else None
  first = hf.get('max_window_layers', default=28)
  types = hf.get('layer_types') or [
      'sliding_attention' if window is not None and i >= first else 'full_attention'
      for i in range(n)]
  if len(types) != n or set(types) - set(_KINDS):
    raise ConfigError(f'{hf.source}: layer_types={types!r} is not supported (tx needs '
                      f'{n} entries of {" / ".join(_KINDS)})')
  if 'sliding_attention' not in types:
    return {}
  if window is None:
    raise ConfigError(f'{hf.source}: layer_types has sliding_attention layers but '
                      'use_sliding_window / sliding_window give no window')
  kinds = [_KINDS[t] for t in types]
  period = next(p for p in range(1, n + 1) if n % p == 0 and kinds == kinds[:p] * (n // p))
  return dict(attention_window=window, attention_pattern=','.join(kinds[:period]))


def check_exportable(cfg: ModelConfig) -> None:
  """ConfigError naming the first field Qwen3 cannot express."""
  llama.check_exportable(cfg, {'qk_norm': 'rmsnorm', 'attention_window': ANY,
                               'attention_pattern': ANY}, 'Qwen3')


def config_to_hf(cfg: ModelConfig) -> dict:
  """ModelConfig -> Qwen3Config fields (config.json); the window as explicit layer_types."""
  check_exportable(cfg)
  types = ['sliding_attention' if w else 'full_attention'
           for w in cfg.layer_windows(cfg.num_layers)]
  leading_full = (types + ['sliding_attention']).index('sliding_attention')
  return {'model_type': 'qwen3', 'architectures': ['Qwen3ForCausalLM'],
          **llama.base_to_hf(cfg), 'attention_bias': False,
          'use_sliding_window': bool(cfg.attention_window),
          'sliding_window': cfg.attention_window or None, 'max_window_layers': leading_full,
          'layer_types': types}
