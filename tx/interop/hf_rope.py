"""RoPE and its context extension: a Hugging Face config.json <-> `model.rope_theta` and
`model.rope_scaling.*` (LLaMA, Mistral, Qwen3).

transformers 5 keeps RoPE in `rope_parameters` {'rope_type', 'rope_theta', 'factor', ...};
older files have `rope_scaling` {'type' or 'rope_type', ...} and a top-level `rope_theta`.
The kinds tx reproduces, with the fields each reads (formulas: tx.ops.rope_frequencies):

    default  rope_theta (10000)
    linear   factor
    dynamic  factor; the NTK base grows past max_position_embeddings, which is therefore
             tx's original_max_len (stored as None = model.max_len)
    yarn     factor (None = max_position_embeddings / original), original_max_position_
             embeddings, beta_fast (32), beta_slow (1), truncate (true), attention_factor
             (None = 0.1 ln(factor) + 1, or HF's ratio of mscale / mscale_all_dim)
    llama3   factor, low_freq_factor, high_freq_factor, original_max_position_embeddings

original_max_position_embeddings defaults to max_position_embeddings, and a top-level field
of that name wins over the one in the dict (transformers' `standardize_rope_params`); tx
keeps None for "equal to max_position_embeddings" so that export -> import is exact.
Other kinds (longrope, ...) and a partial_rotary_factor under scaling are ConfigErrors.
"""

from __future__ import annotations

import math

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.config.rope import RopeScalingConfig

KINDS = ('default', 'linear', 'dynamic', 'yarn', 'llama3')  # HF rope_type tx reproduces


def _parameters(hf) -> dict:
  """The one RoPE dict of `hf` (per-layer-type dicts must agree: tx has one RoPE)."""
  params = dict(hf.get('rope_parameters') or hf.get('rope_scaling') or {})
  nested = [params[k] for k in set(params) & set(hf.get('layer_types') or ())]
  if nested:
    if any(p != nested[0] for p in nested):
      raise ConfigError(f'{hf.source}: rope_parameters differ between layer types; tx has '
                        'one RoPE for every layer')
    params = dict(nested[0] or {})
  return params


def rope_from_hf(hf) -> tuple[float, RopeScalingConfig]:
  """(rope_theta, RopeScalingConfig) of an HFConfig, or a one-line ConfigError."""
  params = _parameters(hf)
  kind = params.get('rope_type') or params.get('type') or 'default'
  theta = float(params.get('rope_theta') or hf.get('rope_theta', default=10000.0))
  if kind not in KINDS:
    raise ConfigError(f'{hf.source}: rope_type={kind!r} is not supported (tx reproduces '
                      f'{", ".join(repr(k) for k in KINDS)})')
  if kind == 'default':
    return theta, RopeScalingConfig()
  if params.get('partial_rotary_factor', 1.0) != 1.0:
    raise ConfigError(f'{hf.source}: partial_rotary_factor={params["partial_rotary_factor"]} '
                      f'with rope_type={kind!r} is not supported (tx rotates the whole head)')
  max_len = hf.get('max_position_embeddings', default=2048)
  original = hf.get('original_max_position_embeddings',
                    default=params.get('original_max_position_embeddings') or max_len)

  def field(name, default=None):
    value = params.get(name, default)
    if value is None:
      raise ConfigError(f'{hf.source}: rope_parameters[{name!r}] is missing; rope_type='
                        f'{kind!r} needs it')
    return value

  fields = {}
  if kind in ('yarn', 'llama3'):
    fields['original_max_len'] = None if original == max_len else int(original)
  if kind == 'llama3':
    fields.update(low_freq_factor=float(field('low_freq_factor')),
                  high_freq_factor=float(field('high_freq_factor')))
  factor = params.get('factor')
  if kind == 'yarn':
    factor = max_len / original if factor is None else factor
    attention = params.get('attention_factor')
    mscale, mscale_all_dim = params.get('mscale'), params.get('mscale_all_dim')
    if attention is None and mscale and mscale_all_dim:
      attention = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
    fields.update(beta_fast=float(params.get('beta_fast') or 32),
                  beta_slow=float(params.get('beta_slow') or 1),
                  truncate=bool(params.get('truncate', True)),
                  attention_factor=None if attention is None else float(attention))
  if factor is None:
    field('factor')
  return theta, RopeScalingConfig(kind=kind, factor=float(factor), **fields)


def _mscale(scale: float, mscale: float) -> float:
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_to_hf(cfg: ModelConfig) -> dict:
  """The `rope_parameters` dict of `cfg` (ConfigError if HF cannot express its scaling)."""
  s = cfg.rope_scaling
  out = {'rope_type': 'default' if s.kind == 'none' else s.kind, 'rope_theta': cfg.rope_theta}
  if s.kind == 'none':
    return out
  out['factor'] = s.factor
  original = s.original_max_len or cfg.max_len
  if s.kind == 'dynamic' and original != cfg.max_len:
    raise ConfigError(f'model.rope_scaling.original_max_len={s.original_max_len}: HF dynamic '
                      f'RoPE scales from max_position_embeddings; export needs None or '
                      f'model.max_len={cfg.max_len}')
  if s.kind in ('yarn', 'llama3'):
    out['original_max_position_embeddings'] = original
  if s.kind == 'llama3':
    out.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor)
  if s.kind == 'yarn':
    out.update(beta_fast=s.beta_fast, beta_slow=s.beta_slow, truncate=s.truncate)
    if s.attention_factor is not None:
      out['attention_factor'] = s.attention_factor
  return out
