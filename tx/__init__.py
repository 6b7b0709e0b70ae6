"""tx: a functional JAX/Flax research codebase for Transformers.

    import tx
    cfg = tx.ModelConfig(family='decoder', vocab_size=256, position='rope')
    model = tx.build_model(cfg)

Submodules (tx.ops, tx.layers, tx.models, tx.data, ...) load on first use, so importing
one part (say tx.ops from another JAX project) does not import the others.
"""

import importlib

from tx.config import ConfigError, DataConfig, ModelConfig, MoEConfig, RopeScalingConfig

_LAZY = {'build_model': 'tx.models', 'count_params': 'tx.models', 'init_params': 'tx.models'}


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f'module tx has no attribute {name!r}')
