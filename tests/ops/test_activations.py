"""Exact GELU through erf: the same function and gradient as jax's erfc form and PyTorch's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx import ops
from tx.layers.common import activation

X = jnp.linspace(-12.0, 12.0, 48_001, dtype=jnp.float32)


def test_gelu_exact_matches_the_erfc_form_and_its_gradient():
  ref = lambda x: jax.nn.gelu(x, approximate=False)
  np.testing.assert_allclose(ops.gelu_exact(X), ref(X), atol=2e-6, rtol=1e-6)
  grad = jax.vmap(jax.grad(ops.gelu_exact))(X)
  np.testing.assert_allclose(grad, jax.vmap(jax.grad(ref))(X), atol=2e-6, rtol=1e-6)
  assert ops.gelu_exact(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


def test_gelu_exact_matches_pytorch():
  torch = pytest.importorskip('torch')
  got = torch.nn.functional.gelu(torch.from_numpy(np.array(X))).numpy()
  np.testing.assert_allclose(ops.gelu_exact(X), got, atol=2e-6, rtol=1e-6)


def test_the_ffn_gelu_lowers_to_erf_not_erfc():
  """erfc expands to ~3.6x erf's work on XLA:CPU: the exact-GELU FFN must not use it."""
  fn, gated = activation('gelu')
  text = jax.jit(jax.grad(lambda x: fn(x).sum())).lower(X).as_text()
  assert not gated and 'erf' in text and 'erfc' not in text
