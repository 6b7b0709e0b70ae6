"""A dense layer's 2-D product in PyTorch's CPU GEMM (oneDNN / MKL), called from XLA.

On hosts where torch's GEMMs outrun XLA:CPU's (most of all in bf16 on hosts with AMX), a
dense layer's forward product and both gradient products can run there instead, in a host
callback inside a custom VJP.
`jax.experimental.buffer_callback` hands the callback XLA's own buffers: torch reads the
operands and writes each product into its output buffer in place (through DLPack), so
nothing is copied or allocated around the GEMM. `tx tune` times it on the run's own step
(`model.matmul_impl`), so it is used only where it wins.

`upcast=True` (`model.matmul_impl='torch_float32'`) multiplies bf16 / f16 operands in
torch's float32 GEMM instead: the product of two bf16 (or f16) values is exact in float32,
so the result is what a low-precision GEMM with float32 accumulation computes, on hosts
whose float32 GEMM outruns their bf16 one (avx512_bf16 without AMX: benchmarks/NOTES.md,
attempt 99). The operands stay in their dtype as the backward's residuals.

A CPU path: on another backend (a run tuned on a CPU, decoded on a GPU) the products are
XLA's, with a warning. Under a multi-device mesh each device multiplies its share of the rows
(`tx.ops.torch_host.per_device`) and the weight gradient is summed over the devices.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.buffer_callback import buffer_callback

from tx.ops.torch_host import per_device, torch_module

_DTYPES = (jnp.float32, jnp.bfloat16)
_UPCAST_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# remat policies that save products (tx/models/stack.py) also save outputs of this name:
# a callback is not a dot to jax.checkpoint_policies, and recomputing it would repeat the GEMM
SAVE_NAME = 'torch_matmul'


def torch_matmul(x_MK, w_KN, upcast: bool = False):
  """x [M, K] · w [K, N] -> [M, N] float32, computed by torch.mm.

  Both operands float32, or both bfloat16: torch multiplies bf16 with float32 accumulation
  and rounds the result to bf16 once; it is returned widened to float32, the form
  `tx.ops.matmul.dense_dot_general` returns for bf16. Gradients: g · wᵀ and xᵀ · g, also
  torch's (in the operands' dtype).
  upcast: bf16 / f16 operands widened to float32 for torch's float32 GEMM, which returns the
  float32 accumulator unrounded; g is rounded to the operands' dtype first, as the
  low-precision products round it, and the gradients are rounded to the operands' dtypes.
  """
  if x_MK.dtype != w_KN.dtype or x_MK.dtype not in (_UPCAST_DTYPES if upcast else _DTYPES):
    takes = ("'torch_float32' takes two float32, two bfloat16 or two float16" if upcast else
             "'torch' takes two float32 or two bfloat16")
    raise ValueError(f'matmul_impl={takes} operands, got {x_MK.dtype} and {w_KN.dtype}; use '
                     'matmul_impl=xla')
  if jax.default_backend() != 'cpu':  # the callback would get device buffers
    impl = 'torch_float32' if upcast else 'torch'
    warnings.warn(f"matmul_impl={impl!r} is a CPU path: on {jax.default_backend()} the dense "
                  "products are XLA's", stacklevel=2)
    return jax.lax.dot_general(x_MK, w_KN, (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)
  torch_module()  # a missing torch is a config error at trace time, not a failed callback
  product = _upcast_matmul if upcast and x_MK.dtype != jnp.float32 else _matmul
  return checkpoint_name(product(x_MK, w_KN), SAVE_NAME).astype(jnp.float32)


def _product_into(unused_ctx, out_MN, x_MK, w_KN):
  torch = torch_module()
  with torch.no_grad():
    torch.mm(torch.from_dlpack(x_MK), torch.from_dlpack(w_KN), out=torch.from_dlpack(out_MN))


def _gradients_into(unused_ctx, out, g_MN, x_MK, w_KN):
  torch = torch_module()
  d_x, d_w = (torch.from_dlpack(o) for o in out)
  g, x, w = (torch.from_dlpack(a) for a in (g_MN, x_MK, w_KN))
  with torch.no_grad():  # transposed views: the GEMM reads them without a copy
    torch.mm(g, w.t(), out=d_x)
    torch.mm(x.t(), g, out=d_w)


def _product(x_MK, w_KN):
  shape = jax.ShapeDtypeStruct((x_MK.shape[0], w_KN.shape[1]), x_MK.dtype)
  return (buffer_callback(_product_into, shape, vmap_method='sequential')(x_MK, w_KN),)


def _gradients(g_MN, x_MK, w_KN):
  shapes = (jax.ShapeDtypeStruct(x_MK.shape, x_MK.dtype),
            jax.ShapeDtypeStruct(w_KN.shape, w_KN.dtype))
  return buffer_callback(_gradients_into, shapes, vmap_method='sequential')(g_MN, x_MK, w_KN)


@jax.custom_vjp
def _matmul(x_MK, w_KN):
  return per_device(_product, (x_MK,), (w_KN,), 1)[0]


def _matmul_fwd(x_MK, w_KN):
  return _matmul(x_MK, w_KN), (x_MK, w_KN)


def _matmul_bwd(residuals, g_MN):
  x_MK, w_KN = residuals
  return per_device(_gradients, (g_MN.astype(x_MK.dtype), x_MK), (w_KN,), 1, 1)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


@jax.custom_vjp
def _upcast_matmul(x_MK, w_KN):
  return per_device(_product, (x_MK.astype(jnp.float32),), (w_KN.astype(jnp.float32),), 1)[0]


def _upcast_matmul_fwd(x_MK, w_KN):
  return _upcast_matmul(x_MK, w_KN), (x_MK, w_KN)


def _upcast_matmul_bwd(residuals, g_MN):
  x_MK, w_KN = residuals
  g_MN = g_MN.astype(x_MK.dtype).astype(jnp.float32)
  d_x, d_w = per_device(_gradients, (g_MN, x_MK.astype(jnp.float32)),
                        (w_KN.astype(jnp.float32),), 1, 1)
  return d_x.astype(x_MK.dtype), d_w.astype(w_KN.dtype)


_upcast_matmul.defvjp(_upcast_matmul_fwd, _upcast_matmul_bwd)
