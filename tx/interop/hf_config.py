"""Reading the fields of a Hugging Face config.json, with one-line errors naming the field.

An architecture module maps the fields it understands onto a tx `ModelConfig` and refuses
values that would change the network in a way tx does not reproduce (a RoPE scaling
scheme, post-layernorm residuals in BLOOM, ...), so an import either matches the
reference exactly or fails saying which field is the reason.
"""

from __future__ import annotations

import functools

from tx.config.base import ConfigError

# config.json activation names -> tx FFN activation names (HF "gelu" is the exact erf form;
# "gelu_new" / "gelu_pytorch_tanh" the tanh approximation).
ACTIVATIONS = {'relu': 'relu', 'gelu': 'gelu', 'gelu_new': 'gelu_tanh',
               'gelu_pytorch_tanh': 'gelu_tanh', 'gelu_fast': 'gelu_tanh', 'silu': 'silu',
               'swish': 'silu'}


class HFConfig:
  """config.json fields, looked up by any of their historical names."""

  def __init__(self, data: dict, source: str):
    self.data = data
    self.source = source
    self.model_type = data.get('model_type')

  def get(self, *names: str, default=None):
    """The first of `names` present (and not null), else `default`."""
    for name in names:
      if self.data.get(name) is not None:
        return self.data[name]
    return default

  def require(self, *names: str):
    value = self.get(*names)
    if value is None:
      raise ConfigError(f'{self.source}: field {names[0]!r} is missing; a {self.model_type} '
                        'config.json needs it')
    return value

  def expect(self, name: str, allowed: tuple, default=None):
    """The field's value, which must be one of `allowed` (tx reproduces only those)."""
    value = self.get(name, default=default)
    if value not in allowed:
      raise ConfigError(f'{self.source}: {name}={value!r} is not supported by the '
                        f'{self.model_type} import (supported: '
                        f'{", ".join(repr(a) for a in allowed)})')
    return value

  def activation(self, name: str, default: str) -> str:
    """The tx name of the activation in field `name`."""
    value = self.get(name, default=default)
    if value not in ACTIVATIONS:
      raise ConfigError(f'{self.source}: {name}={value!r} is not supported (supported: '
                        f'{", ".join(sorted(ACTIVATIONS))})')
    return ACTIVATIONS[value]

  def rope_theta(self) -> float:
    """RoPE base; only unscaled ('default') RoPE is reproduced (architectures that map
    RoPE scaling read it with tx.interop.hf_rope.rope_from_hf instead)."""
    params = self.get('rope_parameters') or {}
    scaling = self.get('rope_scaling') or {}
    kind = params.get('rope_type') or scaling.get('rope_type') or scaling.get('type') or 'default'
    if kind != 'default':
      raise ConfigError(f'{self.source}: rope_type={kind!r} is not supported (tx reproduces '
                        "unscaled RoPE only: rope_type 'default')")
    return float(params.get('rope_theta') or self.get('rope_theta', default=10000.0))


# Knobs no exported layout (GPT-2, LLaMA) has a place for: their tx defaults.
NOT_EXPORTABLE = dict(qk_norm='none', attention_softcap=0.0, logits_softcap=0.0,
                      parametrization='standard')
# Issue 20 architecture knobs (dotted names are nested fields).
NOT_EXPORTABLE.update({'rope_scaling.kind': 'none', 'rope_interleaved': False,
                       'sandwich_norm': False, 'parallel_block': 'none',
                       'query_pre_attn_scalar': None, 'norm_scale_offset': False})

NOT_EXPORTABLE['attention_window'] = 0  # sliding-window attention: no field in GPT-2 / LLaMA
NOT_EXPORTABLE['rope_local_theta'] = None  # a local layers' RoPE base: Gemma-3 only


ANY = object()  # a `wanted` value: the layout expresses every value of this field


def check_fields(cfg, wanted: dict, arch: str) -> None:
  """ConfigError naming the first `model.*` field of `cfg` that `arch` cannot express.

  `wanted` maps dotted field names to the value `arch` needs; its entries override
  NOT_EXPORTABLE's, so a layout that has a place for a knob lists it (the value it
  needs, or ANY when it expresses every value, e.g. Mistral's `attention_window`).
  """
  for name, value in {**NOT_EXPORTABLE, **wanted}.items():
    if value is ANY:
      continue
    got = functools.reduce(getattr, name.split('.'), cfg)
    if got != value:
      raise ConfigError(f'model.{name}={got!r}: {arch} export needs {value!r}')
  if cfg.is_moe or not cfg.use_final_norm:
    raise ConfigError(f'model.moe / model.final_norm: {arch} export needs a dense FFN and a '
                      'final norm')
