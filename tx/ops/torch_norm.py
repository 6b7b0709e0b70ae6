"""LayerNorm over the last axis in PyTorch's CPU kernels, called from XLA.

XLA:CPU computes a LayerNorm and its gradient as several fusions, each a pass over the
activations, with row and column reductions; torch's `native_layer_norm` and its backward
kernel make one threaded pass each (torch has no CPU kernel for its fused RMSNorm's
backward, so RMSNorm stays XLA's). The kernels run in `jax.experimental.buffer_callback`s:
they read XLA's buffers in place (DLPack) and their outputs are copied into XLA's once.
Whether that beats XLA depends on the host, so `tx tune` times it on the run's own step
(`model.norm_impl`) and it is used only where it wins (benchmarks/NOTES.md has the
measurements).

A CPU path: on another backend the norm is XLA's, with a warning (the caller computes it).
Under a multi-device mesh each device normalises its share of the rows and the scale and
bias gradients are summed over the devices.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax.experimental.buffer_callback import buffer_callback

from tx.ops.torch_host import per_device, torch_module

_F32 = jnp.float32


def on_this_backend() -> bool:
  """True where the callbacks can run (the CPU); else warns once per trace and returns False."""
  if jax.default_backend() == 'cpu':
    return True
  warnings.warn(f"norm_impl='torch' is a CPU path: on {jax.default_backend()} the norms are "
                "XLA's", stacklevel=3)
  return False


def torch_layer_norm(x_ND, scale_D, bias_D, eps: float):
  """y [N, D] in x's dtype: (x - mean) / sqrt(var + eps) * scale + bias over D, in torch.

  x float32 or bfloat16, scale and bias float32: torch normalises bf16 rows in float32 and
  rounds y to bf16 once, as tx's XLA norm does, so a bf16 model's norms read and write bf16
  without a float32 copy of the activations on either side (half the bytes a pass).
  Gradients for x (in x's dtype), scale and bias (float32), also torch's.
  """
  if (x_ND.dtype not in (_F32, jnp.bfloat16) or scale_D.dtype != _F32
      or bias_D.dtype != _F32):
    raise ValueError("norm_impl='torch' takes float32 or bfloat16 activations and a float32 "
                     f'scale and bias, got {[str(a.dtype) for a in (x_ND, scale_D, bias_D)]}')
  torch_module()  # a missing torch is a config error at trace time, not a failed callback
  return _layer_norm(x_ND, scale_D, bias_D, float(eps))


def _tensors(*buffers):
  torch = torch_module()
  return [torch.from_dlpack(b) for b in buffers]


def _call(host, shapes, *operands):
  return buffer_callback(host, shapes, vmap_method='sequential')(*operands)


def _row_stats(n: int):
  return jax.ShapeDtypeStruct((n,), _F32)


def _layer_norm_into(unused_ctx, outs, x, scale, bias, *, eps):
  torch = torch_module()
  y_out, mean_out, rstd_out = _tensors(*outs)
  x, scale, bias = _tensors(x, scale, bias)
  with torch.no_grad():
    y, mean, rstd = torch.native_layer_norm(x, (x.shape[-1],), scale, bias, eps)
    y_out.copy_(y)  # the kernel has no out= form: one copy each
    mean_out.copy_(mean.view(-1))
    rstd_out.copy_(rstd.view(-1))


def _layer_norm_grads_into(unused_ctx, outs, g, x, mean, rstd, scale, bias):
  torch = torch_module()
  g, x, mean, rstd, scale, bias = _tensors(g, x, mean, rstd, scale, bias)
  with torch.no_grad():
    grads = torch.ops.aten.native_layer_norm_backward(
        g, x, (x.shape[-1],), mean.view(-1, 1), rstd.view(-1, 1), scale, bias,
        [True, True, True])
    for out, grad in zip(_tensors(*outs), grads):
      out.copy_(grad)


def _layer_norm_call(x, scale, bias, eps):
  host = functools.partial(_layer_norm_into, eps=eps)

  def call(x, scale, bias):  # on each device's rows under a mesh: the shapes are its own
    shapes = (jax.ShapeDtypeStruct(x.shape, x.dtype), _row_stats(x.shape[0]),
              _row_stats(x.shape[0]))
    return _call(host, shapes, x, scale, bias)

  return per_device(call, (x,), (scale, bias), 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x, scale, bias, eps):
  return _layer_norm_call(x, scale, bias, eps)[0]


def _layer_norm_fwd(x, scale, bias, eps):
  y, mean, rstd = _layer_norm_call(x, scale, bias, eps)
  return y, (x, mean, rstd, scale, bias)


def _layer_norm_bwd(unused_eps, residuals, g):
  x, mean, rstd, scale, bias = residuals

  def call(g, x, mean, rstd, scale, bias):
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, scale, bias))
    return _call(_layer_norm_grads_into, shapes, g, x, mean, rstd, scale, bias)

  return per_device(call, (g, x, mean, rstd), (scale, bias), 1, 2)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
