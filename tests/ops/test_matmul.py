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


def test_bf16_product_values_gradients_and_dtype():
  """bf16 inputs: the float32 accumulator comes back (equal to the float32 product of the
  same bf16 values up to summation order); gradients match float32 autodiff of the same
  inputs to bf16 precision, and come back in the inputs' dtype."""
  x, w = _pair((4, 16, 32), (32, 24))
  xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  y = dense(xb, wb)
  assert y.dtype == jnp.float32
  want = jnp.tensordot(xb.astype(jnp.float32), wb.astype(jnp.float32), 1)
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
  # A linear loss, so the gradients do not depend on how the forward result was rounded.
  c = jax.random.normal(jax.random.PRNGKey(1), y.shape).astype(jnp.bfloat16).astype(jnp.float32)
  loss = lambda f: lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) * c)
  got = jax.grad(loss(dense), argnums=(0, 1))(xb, wb)
  ref = jax.grad(loss(lambda x, w: jnp.tensordot(x, w, 1)), argnums=(0, 1))(
      xb.astype(jnp.float32), wb.astype(jnp.float32))
  for g, e in zip(got, ref):
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(g.astype(jnp.float32), e, rtol=2e-2, atol=2e-2 * np.abs(e).max())
  # An explicit float32 result keeps the plain product.
  assert dense(xb, wb, preferred_element_type=jnp.float32).dtype == jnp.float32
  # An explicit bf16 result is the fast product rounded to bf16.
  explicit = dense(xb, wb, preferred_element_type=jnp.bfloat16)
  assert explicit.dtype == jnp.bfloat16
  np.testing.assert_array_equal(explicit, dense(xb, wb).astype(jnp.bfloat16))


def test_bf16_products_compile_to_float32_accumulating_row_major_dots():
  """All three products of a bf16 layer (forward, input and weight gradients) are dots of bf16
  operands with a float32 result, none contracting its left operand's first dimension: the
  forms XLA:CPU's bf16 kernels take (the module docstring)."""
  x, w = _pair((4, 16, 32), (32, 64))
  xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  grad = jax.jit(jax.grad(lambda x, w: jnp.sum(dense(x, w).astype(jnp.float32) ** 2),
                          argnums=(0, 1)))
  hlo = grad.lower(xb, wb).compile().as_text()
  dots = re.findall(r'= (\w+)\[[\d,]*\]\{[\d,]*\} dot\((%[\w.]+), (%[\w.]+)\), '
                    r'lhs_contracting_dims=\{([\d,]*)\}', hlo)
  assert len(dots) == 3, dots
  for out_dtype, lhs, rhs, lhs_contract in dots:
    assert out_dtype == 'f32' and lhs_contract != '0', (out_dtype, lhs_contract)
    for operand in (lhs, rhs):
      shape = re.search(re.escape(operand) + r'(?:\s*=|:) (\w+)\[', hlo).group(1)
      assert shape == 'bf16', (operand, shape)
