"""The issue-20 model knobs as config: defaults, dotted overrides, and one ConfigError naming
the key for each impossible value or combination (no JAX needed)."""

import pytest

from tx.config import ConfigError, ModelConfig, RopeScalingConfig, override, parse_overrides
from tx.config.experiment import ExperimentConfig

ROPE = dict(position='rope', d_model=32, num_heads=2)


def test_defaults_are_the_plain_transformer():
  cfg = ModelConfig()
  assert cfg.rope_scaling == RopeScalingConfig() and cfg.rope_scaling.kind == 'none'
  assert (cfg.rope_interleaved, cfg.sandwich_norm, cfg.parallel_block, cfg.query_pre_attn_scalar,
          cfg.norm_scale_offset) == (False, False, 'none', None, False)


def test_command_line_overrides_reach_every_knob():
  pairs = ['model.position=rope', 'model.rope_scaling.kind=yarn', 'model.rope_scaling.factor=4',
           'model.rope_scaling.original_max_len=128', 'model.rope_scaling.attention_factor=1.2',
           'model.rope_interleaved=true', 'model.sandwich_norm=True',
           'model.parallel_block=shared_norm', 'model.query_pre_attn_scalar=144',
           'model.norm_scale_offset=true']
  m = override(ExperimentConfig(), parse_overrides(pairs)).model
  assert m.rope_scaling == RopeScalingConfig(kind='yarn', factor=4.0, original_max_len=128,
                                             attention_factor=1.2)
  assert (m.rope_interleaved, m.sandwich_norm, m.parallel_block, m.query_pre_attn_scalar,
          m.norm_scale_offset) == (True, True, 'shared_norm', 144.0, True)
  # A nested mapping in Python works as for model.moe.
  assert ModelConfig(**ROPE, rope_scaling={'kind': 'linear', 'factor': 2}).rope_scaling.factor == 2


@pytest.mark.parametrize('kwargs,key', [
    (dict(rope_scaling=dict(kind='ntk')), 'model.rope_scaling.kind'),
    (dict(**ROPE, rope_scaling=dict(kind='linear', factor=0.5)), 'model.rope_scaling.factor'),
    (dict(**ROPE, rope_scaling=dict(kind='yarn', factor=4, original_max_len=0)),
     'model.rope_scaling.original_max_len'),
    (dict(**ROPE, rope_scaling=dict(kind='llama3', factor=8, low_freq_factor=4,
                                    high_freq_factor=1)), 'model.rope_scaling.high_freq_factor'),
    (dict(**ROPE, rope_scaling=dict(kind='yarn', factor=4, beta_fast=1, beta_slow=32)),
     'model.rope_scaling.beta_fast'),
    (dict(**ROPE, rope_scaling=dict(kind='yarn', factor=4, attention_factor=0.0)),
     'model.rope_scaling.attention_factor'),
    (dict(position='learned', rope_scaling=dict(kind='linear', factor=2)),
     'model.rope_scaling.kind'),
    (dict(position='alibi', rope_interleaved=True), 'model.rope_interleaved'),
    (dict(position='rope', d_model=8, num_heads=2, rope_fraction=0.5,
          rope_scaling=dict(kind='dynamic', factor=2)), 'model.rope_scaling.kind'),  # rot dim 2
    (dict(norm_position='post', sandwich_norm=True), 'model.sandwich_norm'),
    (dict(norm_position='post', parallel_block='two_norms'), 'model.parallel_block'),
    (dict(family='encoder_decoder', parallel_block='shared_norm'), 'model.parallel_block'),
    (dict(parallel_block='yes'), 'model.parallel_block'),
    (dict(query_pre_attn_scalar=0.0), 'model.query_pre_attn_scalar'),
    (dict(query_pre_attn_scalar=64.0, scale_attention=False), 'model.query_pre_attn_scalar'),
    (dict(query_pre_attn_scalar=64.0, parametrization='mup'), 'model.query_pre_attn_scalar'),
    (dict(norm_scale_offset='one_plus'), 'model.norm_scale_offset'),
])
def test_impossible_knob_values_name_the_key(kwargs, key):
  with pytest.raises(ConfigError) as e:
    ModelConfig(**kwargs)
  assert str(e.value).startswith(key + ':'), str(e.value)
  assert '\n' not in str(e.value)


def test_allowed_neighbours_of_the_errors():
  ModelConfig(**ROPE, rope_scaling=dict(kind='dynamic', factor=2), rope_interleaved=True)
  ModelConfig(position='learned', rope_scaling=dict(kind='none', factor=4))  # unused: fine
  ModelConfig(family='encoder_decoder', sandwich_norm=True, norm_scale_offset=True)
  ModelConfig(family='encoder', parallel_block='two_norms', sandwich_norm=True)
  ModelConfig(norm_position='post', norm_scale_offset=True, query_pre_attn_scalar=64.0)


def test_unknown_kind_lists_the_allowed_kinds():
  with pytest.raises(ConfigError) as e:
    override(ModelConfig(), {'rope_scaling.kind': 'ntk'})
  assert all(k in str(e.value) for k in ('none', 'linear', 'dynamic', 'yarn', 'llama3'))
