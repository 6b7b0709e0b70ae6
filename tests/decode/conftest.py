"""Tiny models for the decoding tests, initialised once per session.

d_model 16, 2 heads, 1 layer (2 where layers interact: scanned stacks), vocab 32 and a
few fixed input shapes, so each jitted decoder compiles once and is reused by every
test that asks for the same (config, shapes, static arguments).
"""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx

VOCAB = 32
# Left-padded prompts (row 0 shorter) and right-padded sources (row 1 shorter).
PROMPT = jnp.array([[0, 0, 5, 9, 3], [7, 11, 30, 8, 6]], jnp.int32)
SOURCE = jnp.array([[4, 12, 13, 6, 2], [25, 3, 2, 0, 0]], jnp.int32)


def tiny(family='decoder', **kw) -> tx.ModelConfig:
  base = dict(family=family, vocab_size=VOCAB, d_model=16, num_heads=2, d_ff=32, num_layers=1,
              max_len=16)
  base.update(kw)
  return tx.ModelConfig(**base)


_PARAMS = {}


def params(cfg, seed=0):
  """Random parameters of `cfg`'s shapes, made once per session.

  Shapes come from an abstract init (`jax.eval_shape`) and values from numpy: a real
  init compiles a random-number program per config, several seconds each on 2 cores.
  Norm scales are near 1, everything else N(0, 0.5^2): logits are far from ties.
  """
  key = (cfg, seed)
  if key not in _PARAMS:
    model = tx.build_model(cfg)
    args = (SOURCE, PROMPT) if cfg.family == 'encoder_decoder' else (PROMPT,)
    shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), *args)['params']))
    rng = np.random.default_rng(seed)

    def fill(path, s):
      mean = 1.0 if 'scale' in jax.tree_util.keystr(path) else 0.0
      return jnp.asarray(rng.normal(mean, 0.1 if mean else 0.5, s.shape), s.dtype)
    _PARAMS[key] = jax.tree_util.tree_map_with_path(fill, shapes)
  return _PARAMS[key]


def quick_jit(fn, **kw):
  """jax.jit compiling with XLA's backend optimisations off: about half the compile time
  of these tiny programs, which run in microseconds anyway. Decoders called inside are
  traced into (and compiled as part of) this program."""
  return jax.jit(fn, compiler_options={'xla_backend_optimization_level': 0}, **kw)


def inputs(cfg):
  """What the family's generators take: prompts [2, 5] or sources [2, 5]."""
  return SOURCE if cfg.family == 'encoder_decoder' else PROMPT


@pytest.fixture(scope='session')
def dm():
  """The helpers above ("decode models"): conftest modules are not importable by name."""
  return types.SimpleNamespace(tiny=tiny, params=params, inputs=inputs, quick_jit=quick_jit,
                               PROMPT=PROMPT,
                               SOURCE=SOURCE, VOCAB=VOCAB)
