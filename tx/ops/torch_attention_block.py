"""Self-attention's whole block on the CPU in PyTorch: the q / k / v projections, the flash
kernel and the output projection in one host callback forward and one backward.

With attention's kernel and the dense products in torch separately (attention_impl='torch',
matmul_impl='torch'), a layer's attention calls into torch five times each way, every call a
hand-off between XLA's threads and a torch OpenMP team that has gone to sleep, and the kernel's
three gradients are copied into XLA's buffers only to be multiplied by the projections next.
Here the gradients go from the kernel straight into the projections' products, the biases
ride in the GEMMs (addmm) and their gradients in the same pass, and the three input gradients
are summed in place. The projections' outputs are written into XLA's buffers directly (they
are the backward's residuals); only the kernel's output is copied, as
tx/ops/torch_attention.py copies it. `tx tune` times it on the run's own step
(`model.attention_impl='torch_block'`), so it is used only where it wins.

A CPU path for float32 or bfloat16 (bf16 products accumulate in float32 and round once, the
biases taken in bf16). Under a multi-device mesh each device computes its share of the batch
and the weight gradients are summed over the devices (tx.ops.torch_host.per_device).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.buffer_callback import buffer_callback

from tx.ops import torch_attention
from tx.ops.masks import MASK_VALUE
from tx.ops.torch_host import per_device, torch_module
from tx.ops.torch_matmul import SAVE_NAME as PRODUCT_NAME

_DTYPES = (jnp.float32, jnp.bfloat16)
_F32 = jnp.float32


def torch_attention_block(x_BLD, wq_DHE, wk_DHE, wv_DHE, wo_HED, biases, mask, scale: float,
                          causal: bool = False):
  """y [B, L, D] in x's dtype: self-attention of x over itself with its four projections.

  q = x·Wq + bq, k = x·Wk + bk, v = x·Wv + bv ([B, L, H, E]); a = softmax(q·kᵀ·scale) masked,
  times v; y = a·Wo + bo. x [B, L, D]; Wq, Wk, Wv [D, H, E]; Wo [H, E, D], all in x's dtype
  (float32 or bfloat16). biases: (bq [H, E], bk, bv, bo [D]) in x's dtype, or None.
  mask: bool broadcastable to [B, H, L, L] as [B|1, H|1, L|1, L], or None; a query row that
  sees no key gets a = 0. causal: the caller promises that `mask` hides every key j > i.
  Gradients for x, the weights and the biases, in their dtypes.
  """
  operands = (x_BLD, wq_DHE, wk_DHE, wv_DHE, wo_HED) + tuple(biases or ())
  if x_BLD.dtype not in _DTYPES or any(a.dtype != x_BLD.dtype for a in operands):
    raise ValueError("attention_impl='torch_block' takes float32 or bfloat16 activations, "
                     f'weights and biases of one dtype, got {[str(a.dtype) for a in operands]}')
  torch_module()  # a missing torch is a config error at trace time, not a failed callback
  bias = torch_attention.mask_bias(mask, x_BLD.dtype, MASK_VALUE)
  return _block(x_BLD, wq_DHE, wk_DHE, wv_DHE, wo_HED, biases, bias, float(scale),
                bool(causal))


def _matrix(t):
  """A torch tensor [..., N] of XLA's buffer (DLPack, no copy) as [rows, N]."""
  return t.reshape(-1, t.shape[-1])


def _tensor(buffer):
  return torch_module().from_dlpack(buffer)


def _forward_into(unused_ctx, outs, x, wq, wk, wv, wo, *rest, has_biases, scale, causal):
  torch = torch_module()
  y_out, q_out, k_out, v_out, a_out, lse_out = outs
  biases, mask = (rest[:4], rest[4:]) if has_biases else ((None,) * 4, rest)
  mask = mask[0] if mask else None
  x2d = _matrix(_tensor(x))
  with torch.no_grad():
    for out, w, b in ((q_out, wq, biases[0]), (k_out, wk, biases[1]), (v_out, wv, biases[2])):
      _product(x2d, _tensor(w), b, _matrix(_tensor(out).flatten(2)))
    a, lse = torch_attention.flash_forward(q_out, k_out, v_out, mask, scale, causal)
    # the kernel has no out= form: one copy, the backward's residual
    torch_attention.heads_first(a_out).copy_(a)
    torch.from_dlpack(lse_out).copy_(lse)
    _product(_matrix(_tensor(a_out).flatten(2)), _tensor(wo), biases[3], _matrix(_tensor(y_out)))


def _product(x2d, w, b, out2d):
  """out = x · w (+ b), w [K, *N] flattened to [K, N]: torch's GEMM writing into XLA's buffer."""
  torch = torch_module()
  w2d = w.reshape(x2d.shape[1], -1)
  if b is None:
    torch.mm(x2d, w2d, out=out2d)
  else:
    torch.addmm(_tensor(b).reshape(-1), x2d, w2d, out=out2d)


def _backward_into(unused_ctx, outs, g, x, q, k, v, a, lse, wq, wk, wv, wo, *mask, has_biases,
                   scale, causal):
  torch = torch_module()
  d_x, d_wq, d_wk, d_wv, d_wo, *d_biases = (_tensor(o) for o in outs)
  mask = mask[0] if mask else None
  g2d, x2d = _matrix(_tensor(g)), _matrix(_tensor(x))
  a_BLHE = _tensor(a)
  a2d = _matrix(a_BLHE.flatten(2))
  wo2d = _tensor(wo).reshape(a2d.shape[1], -1)
  with torch.no_grad():
    torch.mm(a2d.t(), g2d, out=d_wo.view(wo2d.shape))
    d_a = torch.mm(g2d, wo2d.t()).view(a_BLHE.shape).transpose(1, 2)  # [B, H, L, E]
    grads = torch_attention.flash_backward(d_a, q, k, v, a, lse, mask, scale, causal)
    for i, (grad, w, d_w) in enumerate(zip(grads, (wq, wk, wv), (d_wq, d_wk, d_wv))):
      grad2d = _matrix(grad.transpose(1, 2).flatten(2))  # q's layout: a view
      w2d = _tensor(w).reshape(x2d.shape[1], -1)
      torch.mm(x2d.t(), grad2d, out=d_w.view(w2d.shape))
      if i == 0:
        torch.mm(grad2d, w2d.t(), out=_matrix(d_x))
      else:  # the three projections' input gradients summed in place
        _matrix(d_x).addmm_(grad2d, w2d.t())
      if has_biases:
        torch.sum(grad2d, 0, out=d_biases[i].view(-1))
    if has_biases:
      torch.sum(g2d, 0, out=d_biases[3])


def _shape(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _mask_operands(x, mask) -> tuple[tuple, tuple]:
  """(the mask among the rows, the mask among the weights): one of them holds it, by whether
  it has the batch's rows (each device takes its share under a mesh) or is shared."""
  if mask is None:
    return (), ()
  return ((mask,), ()) if mask.shape[0] == x.shape[0] != 1 else ((), (mask,))


def _forward_call(x, wq, wk, wv, wo, biases, mask, scale, causal):
  has_biases = biases is not None
  host = functools.partial(_forward_into, has_biases=has_biases, scale=scale, causal=causal)
  row_mask, shared_mask = _mask_operands(x, mask)
  rows, weights = (x, *row_mask), (wq, wk, wv, wo, *(biases or ()), *shared_mask)

  def call(*args):  # on each device's rows under a mesh: the shapes are its own
    x = args[0]
    b, l, _ = x.shape
    heads = wq.shape[1:]
    qkv = jax.ShapeDtypeStruct((b, l) + heads, x.dtype)
    shapes = (_shape(x), qkv, qkv, qkv, qkv, jax.ShapeDtypeStruct((b, heads[0], l), _F32))
    operands = (x,) + args[len(rows):] + args[1:len(rows)]  # x, weights, biases, mask
    return buffer_callback(host, shapes, vmap_method='sequential')(*operands)

  return per_device(call, rows, weights, 6)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _block(x, wq, wk, wv, wo, biases, mask, scale, causal):
  return _forward_call(x, wq, wk, wv, wo, biases, mask, scale, causal)[0]


def _block_fwd(x, wq, wk, wv, wo, biases, mask, scale, causal):
  y, q, k, v, a, lse = _forward_call(x, wq, wk, wv, wo, biases, mask, scale, causal)
  # remat policies that save products save these too (tx/models/stack.py): recomputing
  # them would repeat the whole block
  q, k, v, y = (checkpoint_name(t, PRODUCT_NAME) for t in (q, k, v, y))
  a, lse = (checkpoint_name(t, torch_attention.SAVE_NAME) for t in (a, lse))
  return y, (x, q, k, v, a, lse, wq, wk, wv, wo, biases, mask)


def _block_bwd(scale, causal, residuals, g):
  x, q, k, v, a, lse, wq, wk, wv, wo, biases, mask = residuals
  has_biases = biases is not None
  host = functools.partial(_backward_into, has_biases=has_biases, scale=scale, causal=causal)
  row_mask, shared_mask = _mask_operands(x, mask)
  rows = (g.astype(x.dtype), x, q, k, v, a, lse, *row_mask)
  weights = (wq, wk, wv, wo, *shared_mask)
  summed = weights[:4] + tuple(biases or ())

  def call(*args):
    n = len(rows)
    operands = args[:7] + args[n:n + 4] + args[7:n] + args[n + 4:]  # ..., weights, mask
    shapes = (_shape(args[1]),) + tuple(_shape(w) for w in summed)
    return buffer_callback(host, shapes, vmap_method='sequential')(*operands)

  d_x, *d_weights = per_device(call, rows, weights, 1, len(summed))
  d_biases = tuple(d_weights[4:]) if has_biases else None
  return (d_x, *d_weights[:4], d_biases, None if mask is None else jnp.zeros_like(mask))


_block.defvjp(_block_fwd, _block_bwd)
