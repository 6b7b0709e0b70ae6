"""Dense-layer products as one 2-D matmul: x [..., *in] · W [*in, *out] -> [..., *out].

A dense layer applied to [B, L, D] activations is a dot_general with two free dimensions
on the left. Its weight gradient then contracts two dimensions (B and L) at once, and
XLA:CPU lowers that to transposed copies of the activations and the output gradient
followed by a matmul its YNNPACK kernels do not take (Eigen's, which spends most of its
time packing). Flattening the leading dimensions first makes every product of the layer,
forward and backward, a plain 2-D matmul (benchmarks/NOTES.md has the measurements). The
reshapes are free (bitcasts) and the result is the same product.

In bfloat16 / float16, XLA:CPU's fast low-precision matmul (YNNPACK, bf16 inputs with
float32 accumulation) takes a product only when its output is float32 and its left operand
contracts its last dimension. A plain bf16 x bf16 -> bf16 dot, and the weight gradient
xᵀ·g (left operand contracting its first dimension), are upcast to float32 matmuls instead.
`_low_precision_matmul` keeps all three products of a layer in the fast form, with xᵀ
(or gᵀ, when the output gradient g is the narrower) materialised by a transpose that XLA
cannot fold back into the dot, and returns the
float32 accumulator: what follows a dense layer (bias, activation, residual add) is
elementwise work, which XLA:CPU runs faster in float32 than in bf16, and the next product
rounds its input to bf16 anyway (benchmarks/NOTES.md, attempts 27 and 30). Layers that hand
values on in the compute dtype (attention's q/k/v, a block's output) round them there.

`impl='torch'` sends the 2-D product (forward and both gradients) to PyTorch's CPU GEMM
instead (tx/ops/torch_matmul.py), with the same float32 result for bf16 operands;
`impl='torch_float32'` multiplies bf16 / f16 operands there in float32 (exact products,
float32 accumulation: the same arithmetic, in the kernel that is faster on some hosts).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from tx.ops.torch_matmul import torch_matmul

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                      preferred_element_type=None, impl: str = 'xla', **kwargs):
  """`jax.lax.dot_general`, computed as one 2-D matmul when it is a dense layer's product.

  A dense layer's product contracts the last k dimensions of `lhs` [..., *in] with the
  first k of `rhs` [*in, *out], in order, with no batch dimensions; the result is
  [..., *out], float32 when both operands are bf16 / f16 (the accumulator; see the module
  docstring) unless `preferred_element_type` names their dtype, else as `jax.lax.dot_general`
  gives it. Any other `dimension_numbers` go to
  `jax.lax.dot_general` unchanged. Drop-in for flax's `nn.Dense(dot_general=...)`.
  impl: 'xla', 'torch' for torch's GEMM (float32 or bfloat16 operands), or
  'torch_float32' for torch's float32 GEMM (bf16 / f16 operands widened: exact products).
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
  lhs_2d = lhs.reshape(math.prod(lead), math.prod(inner))
  rhs_2d = rhs.reshape(math.prod(inner), math.prod(out))
  if impl != 'xla' and not kwargs and preferred_element_type in (None, lhs.dtype):
    y = torch_matmul(lhs_2d, rhs_2d, upcast=impl == 'torch_float32')  # float32, as below
    if preferred_element_type is not None or lhs.dtype == jnp.float32:
      y = y.astype(lhs.dtype)
  elif (lhs.dtype == rhs.dtype and lhs.dtype in _LOW_PRECISION and not kwargs
      and preferred_element_type in (None, lhs.dtype)):
    y = _low_precision_matmul(lhs_2d, rhs_2d)
    if preferred_element_type is not None:  # asked for explicitly: rounded to it
      y = y.astype(preferred_element_type)
  else:
    y = jax.lax.dot_general(lhs_2d, rhs_2d, (((1,), (0,)), ((), ())), precision=precision,
                            preferred_element_type=preferred_element_type, **kwargs)
  return y.reshape(lead + out)


def _accumulate_f32(lhs, rhs, contract):
  """lhs · rhs contracting dims `contract`, accumulated in float32, rounded to lhs.dtype."""
  return jax.lax.dot_general(lhs, rhs, (contract, ((), ())),
                             preferred_element_type=jnp.float32).astype(lhs.dtype)


def _materialized_transpose(x_MK):
  """x [M, K] -> xᵀ [K, M] as a real copy. A 2-D transpose feeding a dot is folded into
  the dot's dimension numbers (the slow form); transposing a 3-D view of x is not."""
  m, k = x_MK.shape
  block = next((b for b in (8, 4, 2) if m % b == 0), None)
  if block is None:
    return x_MK.T
  return x_MK.reshape(m // block, block, k).transpose(2, 0, 1).reshape(k, m)


@jax.custom_vjp
def _low_precision_matmul(x_MK, w_KN):
  """x [M, K] · w [K, N] -> [M, N] float32 (the accumulator), inputs in bf16 / f16."""
  return jax.lax.dot_general(x_MK, w_KN, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)


def _low_precision_matmul_fwd(x_MK, w_KN):
  return _low_precision_matmul(x_MK, w_KN), (x_MK, w_KN)


def _low_precision_matmul_bwd(residuals, g_MN):
  x_MK, w_KN = residuals
  g_MN = g_MN.astype(x_MK.dtype)
  d_x = _accumulate_f32(g_MN, w_KN, ((1,), (1,)))                          # g · wᵀ
  if g_MN.shape[1] < x_MK.shape[1]:  # transpose the narrower of x and g: fewer bytes copied
    d_w = _accumulate_f32(_materialized_transpose(g_MN), x_MK, ((1,), (0,))).T  # (gᵀ · x)ᵀ
  else:
    d_w = _accumulate_f32(_materialized_transpose(x_MK), g_MN, ((1,), (0,)))  # xᵀ · g
  return d_x, d_w.astype(w_KN.dtype)


_low_precision_matmul.defvjp(_low_precision_matmul_fwd, _low_precision_matmul_bwd)


def dense(x, kernel, in_dims: int = 1, impl: str = 'xla', **kwargs):
  """x [..., *in] · kernel [*in, *out] -> [..., *out], contracting the last `in_dims` of x;
  impl as in `dense_dot_general`."""
  contract = (tuple(range(x.ndim - in_dims, x.ndim)), tuple(range(in_dims)))
  return dense_dot_general(x, kernel, (contract, ((), ())), impl=impl, **kwargs)


def dense_dot_general_for(impl: str):
  """The `nn.Dense(dot_general=...)` that computes its products with `impl` (one of
  tx.config.choices.MATMUL_IMPLS)."""
  return dense_dot_general if impl == 'xla' else functools.partial(dense_dot_general, impl=impl)
