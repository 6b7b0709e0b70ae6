"""tx: a functional JAX/Flax research codebase for Transformers."""

from tx.config import ConfigError, DataConfig, ModelConfig, MoEConfig
