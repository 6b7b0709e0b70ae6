"""tx/ops/matmul.py: the flattened dense product equals dot_general, values and gradients,
and compiles the weight gradient without the copies of the 3-D form."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.ops.matmul import dense, dense_dot_general

_K = jax.random.PRNGKey(0)


def _pair(lhs_shape, rhs_shape):
  a, b = jax.random.split(_K)
  return jax.random.normal(a, lhs_shape), jax.random.normal(b, rhs_shape)


@pytest.mark.parametrize('lhs_shape,rhs_shape,in_dims', [
    ((2, 5, 8), (8, 3), 1),          # FFN / nn.Dense on [B, L, D]
    ((2, 5, 8), (8, 4, 3), 1),       # q/k/v projection to [B, L, H, K]
    ((2, 5, 4, 3), (4, 3, 8), 2),    # output projection from [B, L, H, K]
    ((7, 8), (8, 3), 1),             # already 2-D
])
def test_dense_equals_tensordot_values_and_gradients(lhs_shape, rhs_shape, in_dims):
  x, w = _pair(lhs_shape, rhs_shape)
  np.testing.assert_allclose(dense(x, w, in_dims), jnp.tensordot(x, w, in_dims), rtol=1e-5,
                             atol=1e-5)
  loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
  got = jax.grad(loss(lambda x, w: dense(x, w, in_dims)), argnums=(0, 1))(x, w)
  want = jax.grad(loss(lambda x, w: jnp.tensordot(x, w, in_dims)), argnums=(0, 1))(x, w)
  for g, e in zip(got, want):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_other_dimension_numbers_fall_through_unchanged():
  x, w = _pair((2, 5, 8), (2, 8, 3))  # a batch dimension: not a dense layer's product
  dims = (((2,), (1,)), ((0,), (0,)))
  np.testing.assert_array_equal(dense_dot_general(x, w, dims), jax.lax.dot_general(x, w, dims))
  x, w = _pair((8, 5), (8, 3))  # contracting lhs's first dimension
  dims = (((0,), (0,)), ((), ()))
  np.testing.assert_array_equal(dense_dot_general(x, w, dims), jax.lax.dot_general(x, w, dims))


def _weight_grad_hlo(product):
  x, w = _pair((4, 16, 32), (32, 64))
  grad = jax.jit(jax.grad(lambda w, x: jnp.sum(product(x, w) ** 2)))
  return grad.lower(w, x).compile().as_text()


def test_the_weight_gradient_contracts_one_dimension():
  """The point of the op: the 3-D form's weight gradient contracts B and L together, which
  XLA emits with two contracting dimensions or transposed copies; the flat form contracts
  one dimension of size B·L. Checks the optimized HLO, so it fails if flattening is lost."""
  def contracted(hlo):
    return [m.group(1) for m in re.finditer(r'lhs_contracting_dims=\{([\d,]*)\}', hlo)]
  flat = _weight_grad_hlo(lambda x, w: dense(x, w))
  assert flat.count(' dot(') >= 1
  assert all(',' not in c for c in contracted(flat)), contracted(flat)
  assert 'transpose' not in re.sub(r'metadata=\{[^}]*\}', '', flat)
