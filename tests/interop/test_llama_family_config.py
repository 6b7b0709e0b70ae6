"""Qwen3 / Mistral / LLaMA config.json <-> ModelConfig: the window and RoPE-scaling fields
as transformers reads them, and one-line errors for what tx cannot reproduce.
Only config.json is read (`read_hf_config`) or written: no torch."""

import json

import pytest

import tx
from tx.config.base import ConfigError
from tx.interop import export_hf, read_hf_config

BASE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            num_hidden_layers=4, vocab_size=101, max_position_embeddings=32)


def _read(tmp_path, model_type, **fields):
  (tmp_path / 'config.json').write_text(json.dumps({'model_type': model_type, **BASE, **fields}))
  return read_hf_config(tmp_path)


@pytest.mark.parametrize('fields, window, pattern', [
    (dict(use_sliding_window=False, sliding_window=4), 0, 'local'),
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=3), 4,
     'global,global,global,local'),                  # transformers: sliding from layer 3 on
    (dict(use_sliding_window=True, sliding_window=4, layer_types=['sliding_attention',
          'full_attention'] * 2), 4, 'local,global'),  # explicit layer_types win
])
def test_qwen3_window_fields(tmp_path, fields, window, pattern):
  cfg = _read(tmp_path, 'qwen3', head_dim=16, **fields)
  assert (cfg.attention_window, cfg.attention_pattern, cfg.qk_norm) == (window, pattern,
                                                                         'rmsnorm')


def test_mistral_without_window_is_global(tmp_path):
  assert _read(tmp_path, 'mistral', sliding_window=None).attention_window == 0


@pytest.mark.parametrize('fields, expected', [
    (dict(rope_scaling={'type': 'linear', 'factor': 2}, rope_theta=500.0),   # legacy names
     dict(kind='linear', factor=2.0)),
    (dict(rope_parameters={'rope_type': 'yarn', 'factor': None, 'rope_theta': 1e4},
          original_max_position_embeddings=8),  # a top-level original wins; factor = 32 / 8
     dict(kind='yarn', factor=4.0, original_max_len=8, attention_factor=None)),
    (dict(rope_parameters={'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0,
                           'high_freq_factor': 4.0, 'original_max_position_embeddings': 32}),
     dict(kind='llama3', factor=8.0, original_max_len=None)),  # None = max_len
])
def test_rope_scaling_fields(tmp_path, fields, expected):
  cfg = _read(tmp_path, 'llama', **fields)
  assert all(getattr(cfg.rope_scaling, k) == v for k, v in expected.items()), cfg.rope_scaling
  assert cfg.rope_theta == fields.get('rope_theta', 1e4)


@pytest.mark.parametrize('model_type, fields, match', [
    ('qwen3', dict(head_dim=16, use_sliding_window=True, sliding_window=4,
                   layer_types=['chunked_attention'] * 4), 'layer_types=.*not supported'),
    ('qwen3', dict(head_dim=16, layer_types=['sliding_attention'] * 4),
     'sliding_attention layers but use_sliding_window'),
    ('qwen3', dict(head_dim=16, attention_bias=True), 'attention_bias=True is not supported'),
    ('qwen3', {}, "field 'head_dim' is missing"),
    ('llama', dict(rope_parameters={'rope_type': 'longrope', 'factor': 2.0}),
     "rope_type='longrope' is not supported"),
    ('mistral', dict(rope_parameters={'rope_type': 'llama3', 'factor': 8.0}),
     r"rope_parameters\['low_freq_factor'\] is missing"),
    ('llama', dict(rope_parameters={'rope_type': 'linear', 'factor': 2.0,
                                    'partial_rotary_factor': 0.5}), 'partial_rotary_factor'),
])
def test_unsupported_fields_are_one_line_errors(tmp_path, model_type, fields, match):
  with pytest.raises(ConfigError, match=match) as info:
    _read(tmp_path, model_type, **fields)
  assert '\n' not in str(info.value)


def _model(**kw):
  base = dict(family='decoder', vocab_size=50, d_model=16, num_heads=2, d_ff=32, num_layers=2,
              max_len=16, position='rope', norm='rmsnorm', ffn='swiglu', use_bias=False)
  return tx.ModelConfig(**{**base, **kw})


@pytest.mark.parametrize('arch, kw, name', [
    ('llama', dict(attention_window=4), 'attention_window'),
    ('mistral', dict(attention_window=4, attention_pattern='local,global'), 'attention_pattern'),
    ('mistral', dict(qk_norm='rmsnorm'), 'qk_norm'),
    ('qwen3', {}, 'qk_norm'),
    ('qwen3', dict(qk_norm='layernorm'), 'qk_norm'),
    ('qwen3', dict(qk_norm='rmsnorm', use_bias=True), 'use_bias'),
    ('llama', dict(rope_scaling=dict(kind='dynamic', factor=2.0, original_max_len=8)),
     'rope_scaling.original_max_len'),
])
def test_unexportable_knobs_are_one_line_errors(tmp_path, arch, kw, name):
  with pytest.raises(ConfigError, match=rf'^model\.{name}=') as info:
    export_hf(_model(**kw), {}, tmp_path, arch=arch)  # the config is checked first
  assert '\n' not in str(info.value)
