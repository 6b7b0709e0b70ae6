"""Configs: invalid values fail at construction naming the key; overrides parse literals only."""

import dataclasses
import json

import pytest

from tx.config import (ConfigError, DataConfig, ModelConfig, MoEConfig, from_dict,
                       override, parse_literal, parse_overrides, to_dict)
from tx.config.experiment import ExperimentConfig
from tx.config.model import FAMILIES, FFNS, POSITIONS


@pytest.mark.parametrize('kwargs,key', [
    (dict(d_model=30, num_heads=4), 'model.d_model'),
    (dict(d_model=32, num_heads=4, num_kv_heads=3), 'model.num_kv_heads'),
    (dict(position='rope', head_dim=6, rope_fraction=0.5), 'model.position'),  # rotary dim 3
    (dict(position='rope', d_model=20, num_heads=4), 'model.position'),  # head_dim 5
    (dict(family='decoder', type_vocab_size=2), 'model.type_vocab_size'),
    (dict(family='encoder_decoder', type_vocab_size=2), 'model.type_vocab_size'),
    (dict(family='decoder', num_classes=3), 'model.num_classes'),
    (dict(moe=MoEConfig(num_experts=2, top_k=1, every=2), scan_layers=True),
     'model.scan_layers'),
    (dict(family='decoder', num_encoder_layers=2), 'model.num_encoder_layers'),
    (dict(dropout=1.0), 'model.dropout'),
])
def test_invalid_model_config_names_the_field(kwargs, key):
  with pytest.raises(ConfigError) as e:
    ModelConfig(**kwargs)
  assert str(e.value).startswith(key + ':'), str(e.value)


def test_valid_neighbours_of_the_invalid_configs():
  assert ModelConfig(position='rope', d_model=24, num_heads=4).rotary_dim == 6
  # explicit head_dim
  assert ModelConfig(d_model=30, num_heads=4, head_dim=8).resolved_head_dim == 8
  assert ModelConfig(num_heads=4, num_kv_heads=2).kv_heads == 2
  assert ModelConfig(family='encoder', type_vocab_size=2).type_vocab_size == 2


def test_moe_top_k_above_num_experts():
  with pytest.raises(ConfigError, match=r'^model\.moe\.top_k:'):
    MoEConfig(num_experts=2, top_k=3)
  with pytest.raises(ConfigError, match=r'^model\.moe\.top_k:'):
    override(ModelConfig(), {'moe.num_experts': 2, 'moe.top_k': 3})
  assert MoEConfig(num_experts=0, top_k=3).num_experts == 0  # dense: top_k is unused


@pytest.mark.parametrize('field,allowed', [('position', POSITIONS), ('ffn', FFNS),
                                           ('family', FAMILIES)])
def test_unknown_names_list_the_allowed_values(field, allowed):
  with pytest.raises(ConfigError) as e:
    ModelConfig(**{field: 'nonsense'})
  message = str(e.value)
  assert message.startswith(f'model.{field}:') and "'nonsense'" in message
  assert all(name in message for name in allowed)


def test_unknown_override_key_is_named_with_the_allowed_keys():
  with pytest.raises(ConfigError) as e:
    override(ModelConfig(), {'d_modle': 64})
  assert str(e.value).startswith('model.d_modle: unknown key') and 'd_model' in str(e.value)
  with pytest.raises(ConfigError, match=r'^model\.moe\.experts: unknown key.*num_experts'):
    override(ModelConfig(), {'moe.experts': 4})
  with pytest.raises(ConfigError, match=r'^model\.d_modle: unknown key'):
    override(ExperimentConfig(), parse_overrides(['model.d_modle=64']))
  with pytest.raises(ConfigError, match=r'^modle: unknown key'):
    override(ExperimentConfig(), parse_overrides(['modle.d_model=64']))
  with pytest.raises(TypeError):
    ModelConfig(d_modle=64)  # in Python the dataclass rejects it


def test_wrong_type_in_an_override_names_the_key():
  with pytest.raises(ConfigError, match=r"^model\.d_model: expected an integer, got 'abc'"):
    override(ExperimentConfig(), parse_overrides(['model.d_model=abc']))
  with pytest.raises(ConfigError, match=r'^model\.d_model:'):
    override(ModelConfig(), {'d_model': 1.5})
  with pytest.raises(ConfigError, match=r'^model\.scan_layers:'):
    override(ModelConfig(), {'scan_layers': 1})  # a bool must be a bool
  with pytest.raises(ConfigError, match=r'^model\.d_model:'):
    ModelConfig(d_model='64')  # Python construction is typed too


def test_override_parses_literals():
  assert parse_literal('512') == 512 and isinstance(parse_literal('512'), int)
  assert parse_literal('true') is True and parse_literal('False') is False
  assert parse_literal('none') is None
  assert parse_literal('(0.9, 0.98)') == (0.9, 0.98)
  assert parse_literal('1e-3') == 1e-3
  assert parse_literal('rope') == 'rope'  # not a literal: stays a string
  cfg = override(ModelConfig(), {'d_model': '512', 'scan_layers': 'true', 'position': 'rope',
                                 'moe.num_experts': '4', 'dropout': '0.1'})
  assert (cfg.d_model, cfg.scan_layers, cfg.position, cfg.moe.num_experts, cfg.dropout) == (
      512, True, 'rope', 4, 0.1)
  data = override(DataConfig(), {'source_files': "('train.de', 'val.de')"})
  assert data.source_files == ('train.de', 'val.de')
  exp = override(ExperimentConfig(), parse_overrides(['optim.b2=0.98', 'model.num_heads=8',
                                                      'model.d_model=512']))
  assert (exp.optim.b2, exp.model.num_heads) == (0.98, 8)
  assert ModelConfig().d_model != 512  # override returned a new config, the default is intact


def test_string_fields_keep_text_that_parses_as_another_literal():
  # `none` is a position and a remat policy: a str field must not turn it into None.
  exp = override(ExperimentConfig(), parse_overrides(['model.position=none',
                                                      'model.remat=none']))
  assert (exp.model.position, exp.model.remat) == ('none', 'none')
  assert override(ModelConfig(), {'position': "'none'"}).position == 'none'  # quoted works too
  assert override(ModelConfig(), {'final_norm': 'none'}).final_norm is None  # Optional: None
  with pytest.raises(ConfigError, match=r'^model\.d_model:'):
    override(ModelConfig(), {'d_model': 'none'})


def test_override_never_evaluates_code(tmp_path):
  marker = tmp_path / 'ran'
  code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
  assert parse_literal(code) == code  # a string, not a call
  assert parse_overrides([f'model.position={code}'])['model.position'] == code
  with pytest.raises(ConfigError, match=r'^model\.position:'):
    override(ModelConfig(), {'position': code})
  with pytest.raises(ConfigError, match=r'^model\.d_model:'):
    override(ModelConfig(), {'d_model': code})
  with pytest.raises(ConfigError, match=r'^model\.d_model:'):
    override(ModelConfig(), {'d_model': '2 ** 9'})  # not a literal either
  assert not marker.exists()


def test_configs_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    ModelConfig().d_model = 8


@pytest.mark.parametrize('cfg', [
    ModelConfig(family='encoder_decoder', position='t5', num_kv_heads=2, moe=MoEConfig(
        num_experts=4, top_k=2), share_embeddings=False, src_vocab_size=300, dtype='bfloat16'),
    DataConfig(source_files=('a.de', 'b.de'), target_files=('a.en', 'b.en'), seq_len=64),
    ExperimentConfig(name='x', model=ModelConfig(family='encoder', type_vocab_size=2)),
])
def test_to_dict_from_dict_round_trip(cfg):
  data = to_dict(cfg)
  assert from_dict(type(cfg), data) == cfg
  assert from_dict(type(cfg), json.loads(json.dumps(data))) == cfg  # via JSON (lists)
  assert override(cfg, {}) == cfg


def test_from_dict_rejects_unknown_and_invalid_nested_keys():
  with pytest.raises(ConfigError, match=r'^model\.moe\.experts: unknown key'):
    from_dict(ModelConfig, {'moe': {'experts': 2}})
  with pytest.raises(ConfigError, match=r'^model\.moe\.top_k:'):
    from_dict(ModelConfig, {'moe': {'num_experts': 2, 'top_k': 5}})
