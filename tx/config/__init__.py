"""Typed configs and the dotted-override machinery (see tx/config/base.py)."""

from tx.config.base import (ConfigError, choice, config, fail, flatten, from_dict, is_config,
                            nested, override, parse_literal, parse_overrides, to_dict)
from tx.config.data import DataConfig
from tx.config.model import ModelConfig, MoEConfig
from tx.config.optim import OptimConfig
from tx.config.rope import RopeScalingConfig
