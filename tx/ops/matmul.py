"""Dense-layer products as one 2-D matmul: x [..., *in] · W [*in, *out] -> [..., *out].

A dense layer applied to [B, L, D] activations is a dot_general with two free dimensions
on the left. Its weight gradient then contracts two dimensions (B and L) at once, and
XLA:CPU lowers that to transposed copies of the activations and the output gradient
followed by a matmul its YNNPACK kernels do not take (Eigen's, which spends most of its
time packing). Flattening the leading dimensions first makes every product of the layer,
forward and backward, a plain 2-D matmul (benchmarks/NOTES.md has the measurements). The
reshapes are free (bitcasts) and the result is the same product.
"""

from __future__ import annotations

import math

import jax


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                      preferred_element_type=None, **kwargs):
  """`jax.lax.dot_general`, computed as one 2-D matmul when it is a dense layer's product.

  A dense layer's product contracts the last k dimensions of `lhs` [..., *in] with the
  first k of `rhs` [*in, *out], in order, with no batch dimensions; the result is
  [..., *out]. Any other `dimension_numbers` go to `jax.lax.dot_general` unchanged.
  Drop-in for flax's `nn.Dense(dot_general=...)`.
  """
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  k = len(lhs_contract)
  dense = (not lhs_batch and not rhs_batch and k > 0
           and tuple(lhs_contract) == tuple(range(lhs.ndim - k, lhs.ndim))
           and tuple(rhs_contract) == tuple(range(k)))
  if not dense:
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)
  lead, inner, out = lhs.shape[:-k], lhs.shape[-k:], rhs.shape[k:]
  y = jax.lax.dot_general(
      lhs.reshape(math.prod(lead), math.prod(inner)),
      rhs.reshape(math.prod(inner), math.prod(out)), (((1,), (0,)), ((), ())),
      precision=precision, preferred_element_type=preferred_element_type, **kwargs)
  return y.reshape(lead + out)


def dense(x, kernel, in_dims: int = 1, **kwargs):
  """x [..., *in] · kernel [*in, *out] -> [..., *out], contracting the last `in_dims` of x."""
  contract = (tuple(range(x.ndim - in_dims, x.ndim)), tuple(range(in_dims)))
  return dense_dot_general(x, kernel, (contract, ((), ())), **kwargs)
