"""model.logits_softcap: c · tanh(logits / c) on the output logits of every family's head."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.config.model import ModelConfig
from tx.models.build import build_model, dummy_inputs


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder'])
def test_softcap_bounds_the_logits(family):
  cfg = ModelConfig(family=family, d_model=32, num_heads=2, d_ff=64, num_layers=1, vocab_size=40,
                    max_len=16)
  inputs = tuple(jax.random.randint(jax.random.key(i), (2, 8), 1, 40) for i in range(2))
  inputs = inputs[:len(dummy_inputs(cfg))]
  variables = nn.unbox(build_model(cfg).init(jax.random.key(0), *inputs))
  # A large tied table blows the raw logits up well past the cap.
  variables['params']['embed']['embedding'] = variables['params']['embed']['embedding'] * 100.0
  raw = build_model(cfg).apply(variables, *inputs)
  capped = build_model(cfg.replace(logits_softcap=3.0)).apply(variables, *inputs)
  assert float(jnp.abs(raw).max()) > 10.0
  assert float(jnp.abs(capped).max()) <= 3.0
  np.testing.assert_allclose(capped, 3.0 * np.tanh(np.asarray(raw) / 3.0), rtol=1e-5, atol=1e-6)
