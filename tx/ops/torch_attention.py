"""Attention on the CPU through PyTorch's fused flash-attention kernel, called from XLA.

XLA:CPU runs attention's batched products on one core, and its scores make a round trip
through memory; torch's CPU flash kernel tiles the softmax and splits the batch and heads
over every core. Its forward and backward at bert_6l's shape take ~0.57x the XLA path's time
(causal at length 512: ~0.88x, as it computes the hidden tiles too; benchmarks/NOTES.md,
attempt 47). The kernel runs in a `jax.pure_callback` on the host: q, k, v are read in
place and the results copied into XLA's buffers once.

A CPU path: on a GPU it would move every layer's q, k, v to the host and back. Under a
multi-device mesh each device calls it on its share of the batch (`_per_device`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from tx.ops.torch_host import as_array
from tx.ops.torch_host import as_tensor as _tensor
from tx.ops.torch_host import torch_module as _torch

_F32 = jnp.float32
_DTYPES = (jnp.float32, jnp.bfloat16)


def torch_attention(q_BLHD, k_BSKD, v_BSKD, mask, scale: float, mask_value: float,
                    causal: bool = False):
  """out [B, L, H, D] in q's dtype: softmax(q·kᵀ·scale) masked, times v, in torch's kernel.

  q [B, L, H, D]; k, v [B, S, K, D] with H % K == 0 (grouped kv heads are repeated).
  mask: bool broadcastable to [B, H, L, S] as [B|1, H|1, L|1, S], or None. A query row that
  sees no key outputs exactly zeros (gradients too). causal: the caller promises that `mask`
  hides every key j > i from query i, so the kernel may skip those tiles. float32 or
  bfloat16; the softmax and the log-sum-exp in float32 either way.
  """
  if q_BLHD.dtype not in _DTYPES:
    raise ValueError(f"implementation='torch' takes float32 or bfloat16, got {q_BLHD.dtype}")
  _torch()  # a missing torch is a config error at trace time, not a failed callback
  group = q_BLHD.shape[2] // k_BSKD.shape[2]
  if group > 1:
    k_BSKD, v_BSKD = (jnp.repeat(x, group, axis=2) for x in (k_BSKD, v_BSKD))
  dtype = q_BLHD.dtype
  k_BSKD, v_BSKD = k_BSKD.astype(dtype), v_BSKD.astype(dtype)
  bias = None
  if mask is not None:  # torch adds a float mask; a finite floor keeps hidden rows NaN-free
    bias = jnp.where(mask, jnp.zeros((), dtype), jnp.asarray(mask_value, dtype))
  out_BLHD = _per_device(_flash, q_BLHD, k_BSKD, v_BSKD, bias, float(scale), bool(causal))
  if mask is not None:
    seen_B1L1 = jnp.swapaxes(jnp.any(mask, axis=-1, keepdims=True), 1, 2)
    out_BLHD = jnp.where(seen_B1L1, out_BLHD, jnp.zeros((), dtype))
  return out_BLHD


def _per_device(flash, q, k, v, bias, scale, causal):
  """`flash` on each device's share of the batch under a multi-device mesh (`jax.set_mesh`):
  a host callback cannot be partitioned by XLA. The batch is split over every mesh axis when
  they divide it; otherwise each device computes the whole batch."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return flash(q, k, v, bias, scale, causal)
  P = jax.sharding.PartitionSpec
  batch = P(tuple(mesh.axis_names)) if q.shape[0] % mesh.size == 0 else P()
  bias_spec = batch if bias is not None and bias.shape[0] == q.shape[0] else P()
  return jax.shard_map(lambda q, k, v, bias: flash(q, k, v, bias, scale, causal), mesh=mesh,
                       in_specs=(batch, batch, batch, bias_spec), out_specs=batch,
                       check_vma=False)(q, k, v, bias)


def _heads_first(x_BLHD):
  """A [B, H, L, D] torch view of a [B, L, H, D] host array: the kernel reads the strides,
  and its outputs and gradients take q's, so they come back [B, L, H, D] without a copy."""
  return _tensor(x_BLHD).transpose(1, 2)


def _host_array(t_BHLD):
  """The [B, L, H, D] numpy array behind a [B, H, L, D] view `_heads_first` made."""
  return as_array(t_BHLD.transpose(1, 2).contiguous())


def _forward_on_host(q, k, v, bias, *, scale, causal):
  torch = _torch()
  with torch.no_grad():
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(  # pylint: disable=protected-access
        _heads_first(q), _heads_first(k), _heads_first(v), 0.0, causal,
        attn_mask=None if bias is None else _tensor(bias), scale=scale)
  return _host_array(out), lse.contiguous().numpy()


def _backward_on_host(d_out, q, k, v, out, lse, bias, *, scale, causal):
  torch = _torch()
  with torch.no_grad():
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(  # pylint: disable=protected-access
        *map(_heads_first, (d_out, q, k, v, out)), _tensor(lse), 0.0, causal,
        attn_mask=None if bias is None else _tensor(bias), scale=scale)
  return tuple(map(_host_array, grads))


def _host_call(host, shapes, *arrays, bias):
  """`host(*arrays, bias)` on the host; a bias of None is not passed through XLA."""
  if bias is None:
    return jax.pure_callback(lambda *a: host(*a, None), shapes, *arrays,
                             vmap_method='sequential')
  return jax.pure_callback(host, shapes, *arrays, bias, vmap_method='sequential')


def _forward_call(q, k, v, bias, scale, causal):
  b, l, h, _ = q.shape
  shapes = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, l), _F32))
  host = functools.partial(_forward_on_host, scale=scale, causal=causal)
  return _host_call(host, shapes, q, k, v, bias=bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, bias, scale, causal):
  return _forward_call(q, k, v, bias, scale, causal)[0]


def _flash_fwd(q, k, v, bias, scale, causal):
  out, lse = _forward_call(q, k, v, bias, scale, causal)
  return out, (q, k, v, bias, out, lse)


def _flash_bwd(scale, causal, residuals, d_out):
  q, k, v, bias, out, lse = residuals
  shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
  host = functools.partial(_backward_on_host, scale=scale, causal=causal)
  d_q, d_k, d_v = _host_call(host, shapes, d_out, q, k, v, out, lse, bias=bias)
  return d_q, d_k, d_v, None if bias is None else jnp.zeros_like(bias)


_flash.defvjp(_flash_fwd, _flash_bwd)
