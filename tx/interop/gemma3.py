"""Gemma-3 (text) <-> tx: Gemma-2's layout plus q/k norms and two RoPEs.

model_type 'gemma3_text' (transformers' Gemma3ForCausalLM; the multimodal 'gemma3'
checkpoints are not imported). Against Gemma-2 (`tx.interop.gemma2`, which holds the
shared mapping):
    q_norm / k_norm, Gemma RMSNorm per head   model.qk_norm='rmsnorm' (1 + w: norm_scale_offset)
    5 sliding : 1 full layers by default      model.attention_pattern (sliding_window_pattern)
    sliding layers: rope_local_base_freq,     model.rope_local_theta (local layers rotate
      unscaled; full layers: rope_theta,        unscaled; model.rope_scaling acts on the
      with rope_scaling)                        global layers only)
transformers' Gemma-3 ignores attn_logit_softcapping (its attention never receives it), so
the import ignores it too and export writes null. Global RoPE scaling: 'default' and
'linear' (the released Gemma-3 models); other rope_types are refused in one line.
"""

from __future__ import annotations

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.config.rope import RopeScalingConfig
from tx.interop.gemma2 import (FULL, IGNORE, PREFIX, SLIDING, check_common, common_config,
                               common_to_hf, params_from_hf, params_to_hf)
from tx.interop.hf_config import ANY, HFConfig

__all__ = ['IGNORE', 'PREFIX', 'check_exportable', 'config_from_hf', 'config_to_hf',
           'params_from_hf', 'params_to_hf']
_SCALINGS = ('default', 'linear')


def _rope_fields(hf: HFConfig) -> tuple[dict, dict]:
  """(full-attention, sliding-attention) RoPE dicts {'rope_type', 'rope_theta', ...} from
  transformers 5's per-layer-type rope_parameters or the older flat fields."""
  params = hf.get('rope_parameters') or {}
  if FULL in params or SLIDING in params:
    full, local = dict(params.get(FULL) or {}), dict(params.get(SLIDING) or {})
  else:  # rope_theta + rope_scaling + rope_local_base_freq (transformers 4)
    full = {**(hf.get('rope_scaling') or {}), **params}
    local = {'rope_theta': hf.get('rope_local_base_freq', default=10000.0)}
  full.setdefault('rope_theta', hf.get('rope_theta', default=1e6))
  local.setdefault('rope_theta', 10000.0)
  return full, local


def _rope_config(hf: HFConfig, local_layers: bool) -> dict:
  """rope_theta, rope_scaling and rope_local_theta of the config.json's two RoPEs."""
  full, local = _rope_fields(hf)
  kind = full.get('rope_type') or full.get('type') or 'default'
  local_kind = local.get('rope_type') or local.get('type') or 'default'
  if kind not in _SCALINGS or local_kind != 'default':
    raise ConfigError(f'{hf.source}: rope_parameters (full_attention rope_type={kind!r}, '
                      f'sliding_attention rope_type={local_kind!r}) is not supported by the '
                      "gemma3_text import (full: 'default' or 'linear'; sliding: 'default')")
  if kind == 'linear' and full.get('factor') is None:
    raise ConfigError(f"{hf.source}: rope_parameters['factor'] is missing; rope_type='linear' "
                      'needs it')
  theta, local_theta = float(full['rope_theta']), float(local['rope_theta'])
  scaling = (RopeScalingConfig(kind='linear', factor=float(full['factor']))
             if kind == 'linear' else RopeScalingConfig())
  same = kind == 'default' and local_theta == theta
  return dict(rope_theta=theta, rope_scaling=scaling,
              rope_local_theta=None if same or not local_layers else local_theta)


def config_from_hf(hf: HFConfig) -> ModelConfig:
  """Gemma3TextConfig fields -> ModelConfig."""
  common = common_config(hf, period=hf.get('sliding_window_pattern', default=6),
                         max_len=131072, final_softcap=None)
  return ModelConfig(**common, qk_norm='rmsnorm',
                     **_rope_config(hf, local_layers=common['attention_window'] > 0))


def check_exportable(cfg: ModelConfig) -> None:
  """ConfigError naming the first field that Gemma-3's architecture cannot express."""
  check_common(cfg, 'Gemma-3', qk_norm='rmsnorm', rope_local_theta=ANY,
               **{'rope_scaling.kind': ANY})
  if cfg.rope_scaling.kind not in ('none', 'linear'):
    raise ConfigError(f'model.rope_scaling.kind={cfg.rope_scaling.kind!r}: Gemma-3 export '
                      "needs 'none' or 'linear'")
  if cfg.rope_scaling.kind != 'none' and cfg.attention_window and cfg.rope_local_theta is None:
    raise ConfigError('model.rope_local_theta=None: Gemma-3 export needs it set with '
                      'model.rope_scaling (its local layers rotate unscaled)')


def config_to_hf(cfg: ModelConfig) -> dict:
  """ModelConfig -> Gemma3TextConfig fields (config.json)."""
  check_exportable(cfg)
  full = {'rope_type': 'default', 'rope_theta': cfg.rope_theta}
  if cfg.rope_scaling.kind == 'linear':
    full.update(rope_type='linear', factor=cfg.rope_scaling.factor)
  local = cfg.rope_theta if cfg.rope_local_theta is None else cfg.rope_local_theta
  return {'model_type': 'gemma3_text', 'architectures': ['Gemma3ForCausalLM'],
          **common_to_hf(cfg), 'attn_logit_softcapping': None,
          'rope_parameters': {FULL: full, SLIDING: {'rope_type': 'default', 'rope_theta': local}}}

