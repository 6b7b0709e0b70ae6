"""tx/config/choices.py: the config accepts exactly the names of its tables, without JAX."""

import dataclasses
import subprocess
import sys

import pytest

from tx.config import ConfigError, ModelConfig
from tx.config.choices import (ATTENTION_IMPLS, BIAS, DTYPES, EMBEDDING, FFN_ACTIVATIONS,
                               MATMUL_IMPLS, NONE, POSITION_KINDS, ROTARY)
from tx.layers.moe import MoELayerConfig


def _choices(cls, name):
  return {f.name: f for f in dataclasses.fields(cls)}[name].metadata['choices']


def test_config_choices_are_the_tables_keys():
  assert _choices(ModelConfig, 'position') == tuple(POSITION_KINDS)
  assert _choices(ModelConfig, 'ffn') == tuple(FFN_ACTIVATIONS)
  assert _choices(ModelConfig, 'dtype') == _choices(ModelConfig, 'param_dtype') == DTYPES
  assert _choices(ModelConfig, 'matmul_impl') == ('auto', *MATMUL_IMPLS)
  assert _choices(ModelConfig, 'attention_impl') == ('auto', *ATTENTION_IMPLS)
  assert set(POSITION_KINDS.values()) <= {EMBEDDING, ROTARY, BIAS, NONE}


@pytest.mark.parametrize('position', POSITION_KINDS)
def test_every_position_scheme_is_accepted(position):
  assert ModelConfig(position=position).position_kind == POSITION_KINDS[position]


@pytest.mark.parametrize('ffn', FFN_ACTIVATIONS)
def test_every_ffn_activation_is_accepted_dense_and_moe(ffn):
  assert ModelConfig(ffn=ffn).ffn == ffn
  moe = MoELayerConfig(d_model=8, d_ff=8, activation=ffn, num_experts=2)
  assert moe.gated == FFN_ACTIVATIONS[ffn].gated


@pytest.mark.parametrize('dtype', DTYPES)
def test_every_dtype_is_accepted(dtype):
  assert ModelConfig(dtype=dtype, param_dtype=dtype).dtype == dtype
  MoELayerConfig(d_model=8, d_ff=8, activation='relu', num_experts=2, dtype=dtype)
  with pytest.raises(ConfigError, match='dtype'):
    MoELayerConfig(d_model=8, d_ff=8, activation='relu', num_experts=2, dtype='int8')


def test_rotary_checks_follow_the_kind():
  rotary = [name for name, kind in POSITION_KINDS.items() if kind == ROTARY]
  for name in rotary:
    with pytest.raises(ConfigError, match='^model.position:'):
      ModelConfig(position=name, d_model=20, num_heads=4)  # head_dim 5
  for name in set(POSITION_KINDS) - set(rotary):
    ModelConfig(position=name, d_model=20, num_heads=4)


def test_importing_the_config_imports_no_jax_flax_or_upper_layers():
  code = ('import sys, tx.config, tx.config.choices, tx.config.experiment; '
          "bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'flax') "
          "or m.startswith(('tx.ops', 'tx.layers', 'tx.models'))]; "
          'assert not bad, bad')
  subprocess.run([sys.executable, '-c', code], check=True)
