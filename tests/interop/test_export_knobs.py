"""Hugging Face export refuses, in one line naming the key, every issue-20 knob that the
exported layouts (GPT-2, LLaMA) cannot express. Only the config is checked: no torch."""

import pytest

import tx
from tx.config.base import ConfigError
from tx.interop import export_hf
from tx.interop.hf_config import NOT_EXPORTABLE

KNOBS = [dict(sandwich_norm=True), dict(parallel_block='two_norms'),
         dict(parallel_block='shared_norm'), dict(query_pre_attn_scalar=64.0),
         dict(norm_scale_offset=True)]
# RoPE knobs LLaMA refuses (it exports rope_scaling: test_llama_family.py), and the knobs
# only the Mistral / Qwen3 layouts hold.
LLAMA_REFUSES = [dict(rope_interleaved=True), dict(attention_window=4), dict(qk_norm='rmsnorm')]
BASE = {'gpt2': dict(position='learned', norm='layernorm', ffn='gelu'),
        'llama': dict(position='rope', norm='rmsnorm', ffn='swiglu', use_bias=False)}


def test_every_knob_is_listed_with_its_default():
  cfg = tx.ModelConfig()
  for name in ('rope_scaling.kind', 'rope_interleaved', 'sandwich_norm', 'parallel_block',
               'query_pre_attn_scalar', 'norm_scale_offset'):
    value = cfg
    for part in name.split('.'):
      value = getattr(value, part)
    assert NOT_EXPORTABLE[name] == value, name


@pytest.mark.parametrize('arch,knob', [(a, k) for a in BASE for k in KNOBS]
                         + [('llama', k) for k in LLAMA_REFUSES])
def test_knobs_no_layout_holds_are_refused_in_one_line(tmp_path, arch, knob):
  cfg = tx.ModelConfig(family='decoder', vocab_size=50, d_model=16, num_heads=2, d_ff=32,
                       num_layers=1, **BASE[arch], **knob)
  name = next(iter(knob)) + ('.kind' if 'rope_scaling' in knob else '')
  with pytest.raises(ConfigError, match=rf'^model\.{name}=.*export needs') as e:
    export_hf(cfg, {}, tmp_path, arch=arch)
  assert '\n' not in str(e.value)
