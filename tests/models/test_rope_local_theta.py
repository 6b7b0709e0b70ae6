"""model.rope_local_theta: local (windowed) layers rotate with their own base, unscaled, and
the global layers keep rope_theta and rope_scaling (Gemma-3). Parity with transformers'
Gemma-3: tests/interop/test_gemma.py."""

import numpy as np
import pytest

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.models import layer_configs

GEMMA3_LIKE = dict(position='rope', attention_window=2, attention_pattern='local,global',
                   rope_theta=1e6, rope_scaling=dict(kind='linear', factor=8.0))


@pytest.mark.parametrize('family', ['decoder', 'encoder'])
def test_local_layers_take_the_local_base_unscaled(tm, family):
  cfg = tm.tiny(family, **GEMMA3_LIKE, rope_local_theta=1e4)
  local, global_ = (b.attention for b in layer_configs.block_configs(cfg, 2))
  assert (local.window, local.rope_theta, local.rope_scaling.kind) == (2, 1e4, 'none')
  assert (global_.window, global_.rope_theta, global_.rope_scaling.kind) == (0, 1e6, 'linear')
  plain = tm.tiny(family, **GEMMA3_LIKE)  # None: one RoPE (scaled) for every layer
  assert all(b.attention.rope_theta == 1e6 and b.attention.rope_scaling.kind == 'linear'
             for b in layer_configs.block_configs(plain, 2))


def test_the_local_base_is_live_and_a_no_op_when_equal(tm):
  """Equal to rope_theta without scaling it is a no-op; a different base changes the logits."""
  base = dict(position='rope', attention_window=3, attention_pattern='local,global')
  model, variables = tm.build(tm.tiny(**base))
  ref = np.asarray(model.apply(variables, *tm.inputs(model.cfg)))
  for theta, same in ((10000.0, True), (50.0, False)):
    other = tm.tiny(**base, rope_local_theta=theta)
    out = np.asarray(tm.build(other)[0].apply(variables, *tm.inputs(other)))
    assert np.allclose(out, ref, atol=1e-6) == same


@pytest.mark.parametrize('kw', [dict(position='rope', rope_local_theta=1e4),  # no window
                                dict(position='learned', attention_window=2,
                                     rope_local_theta=1e4),
                                dict(position='rope', attention_window=2, rope_local_theta=0.0)])
def test_impossible_values_name_the_key(kw):
  with pytest.raises(ConfigError, match='model.rope_local_theta'):
    ModelConfig(**kw)
