"""Attention on the CPU through PyTorch's fused flash-attention kernel, called from XLA.

XLA:CPU runs attention's batched products on one core, and its scores make a round trip
through memory; torch's CPU flash kernel tiles the softmax and splits the batch and heads
over every core (at a causal layer it still computes the hidden tiles). The kernel runs in a
`jax.experimental.buffer_callback` on the host: q, k, v and the gradients' inputs are read
in place from XLA's buffers (DLPack), and the results, which the kernel allocates itself,
are copied into XLA's once (torch's copy, threaded); `jax.pure_callback` would also copy
every operand and result through numpy. The mask's values are read there too, so a mask
that hides nothing costs the kernel nothing. `tx tune` times it on the run's own step
(`model.attention_impl`), so it is used only where it wins (benchmarks/NOTES.md has the
measurements).

A CPU path: `dot_product_attention` takes the XLA path elsewhere, with a warning. Under a
multi-device mesh each device calls it on its share of the batch (`_per_device`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.buffer_callback import buffer_callback

from tx.ops.torch_host import torch_module as _torch

_F32 = jnp.float32
_DTYPES = (jnp.float32, jnp.bfloat16)
# remat policies that save products (tx/models/stack.py) also save the kernel's output and
# log-sum-exp under this name: a callback is not a dot to jax.checkpoint_policies, and
# without them the backward pass would run the forward kernel again
SAVE_NAME = 'torch_attention'


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
  bias = mask_bias(mask, dtype, mask_value)
  return _per_device(_flash, q_BLHD, k_BSKD, v_BSKD, bias, float(scale), bool(causal))


def mask_bias(mask, dtype, mask_value: float):
  """The kernel's additive mask in `dtype` from a bool mask (None stays None): torch adds a
  float mask, and a finite floor keeps hidden rows NaN-free."""
  if mask is None:
    return None
  return jnp.where(mask, jnp.zeros((), dtype), jnp.asarray(mask_value, dtype))


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


def heads_first(buffer_BLHD):
  """A [B, H, L, D] torch view of an XLA buffer [B, L, H, D] (through DLPack, no copy): the
  kernel reads the strides, and its outputs and gradients take q's layout."""
  return _torch().from_dlpack(buffer_BLHD).transpose(1, 2)


def host_mask(bias, causal: bool = False):
  """What the mask means for this call's values, read on the host: (the kernel's attn_mask,
  None where the mask hides no key beyond what `causal` does, so the kernel skips its add;
  the query rows that see no key, bool [B|1, H|1, L|1, 1], None where every row sees one).
  Under the causal promise a square mask sees at most the lower triangle, so a count of
  its visible keys tells whether it hides anything more."""
  if bias is None:
    return None, None
  bias = _torch().from_dlpack(bias)
  visible = bias == 0
  length = bias.shape[-1]
  if causal and bias.shape[-2] == length:
    hides_more = int(visible.sum()) < visible[..., 0, 0].numel() * length * (length + 1) // 2
  else:
    hides_more = not bool(visible.all())
  if not hides_more:
    return None, None
  blind = ~visible.any(dim=-1, keepdim=True)
  return bias, (blind if bool(blind.any()) else None)


def flash_forward(q, k, v, bias, scale: float, causal: bool):
  """On the host: torch's flash kernel on the heads-first views of XLA's q [B, L, H, D], k, v
  [B, S, H, D] buffers (and the mask's bias buffer, or None) -> (out [B, H, L, D] in q's layout,
  lse [B, H, L] float32), torch's tensors; rows that see no key are zeros."""
  torch = _torch()
  attn_mask, blind = host_mask(bias, causal)
  with torch.no_grad():
    # pylint: disable-next=protected-access
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        heads_first(q), heads_first(k), heads_first(v), 0.0, causal, attn_mask=attn_mask,
        scale=scale)
    if blind is not None:  # the kernel averages v over a row's (all hidden) keys
      out.masked_fill_(blind, 0.0)
  return out, lse


def flash_backward(d_out, q, k, v, out, lse, bias, scale: float, causal: bool):
  """On the host: the flash kernel's gradients (d_q, d_k, d_v), torch's tensors [B, H, *, D] in
  q's layout. d_out: a torch tensor [B, H, L, D]; out, lse: XLA's buffers or torch tensors as
  `flash_forward` returns them; q, k, v, bias: XLA's buffers as there."""
  torch = _torch()
  attn_mask, blind = host_mask(bias, causal)
  if blind is not None:  # a zeroed row passes no gradient back (a copy: XLA's buffer stays)
    d_out = d_out.masked_fill(blind, 0.0)
  with torch.no_grad():
    # pylint: disable-next=protected-access
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        d_out, heads_first(q), heads_first(k), heads_first(v), _as_tensor(out, heads_first),
        _as_tensor(lse, torch.from_dlpack), 0.0, causal, attn_mask=attn_mask, scale=scale)


def _as_tensor(x, view):
  return x if isinstance(x, _torch().Tensor) else view(x)


def _forward_into(unused_ctx, outs, q, k, v, bias=None, *, scale, causal):
  out_BLHD, lse_BHL = outs
  out, lse = flash_forward(q, k, v, bias, scale, causal)
  heads_first(out_BLHD).copy_(out)  # the kernel has no out= form: one copy each
  _torch().from_dlpack(lse_BHL).copy_(lse)


def _backward_into(unused_ctx, outs, d_out, q, k, v, out, lse, bias=None, *, scale, causal):
  grads = flash_backward(heads_first(d_out), q, k, v, out, lse, bias, scale, causal)
  for buffer, grad in zip(outs, grads):
    heads_first(buffer).copy_(grad)


def _host_call(host, shapes, *arrays, bias):
  """`host` on the host, handed XLA's buffers (`shapes`' outputs, then `arrays` and `bias`;
  a bias of None is not passed through XLA)."""
  operands = arrays if bias is None else (*arrays, bias)
  return buffer_callback(host, shapes, vmap_method='sequential')(*operands)


def _forward_call(q, k, v, bias, scale, causal):
  b, l, h, _ = q.shape
  shapes = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, l), _F32))
  host = functools.partial(_forward_into, scale=scale, causal=causal)
  return _host_call(host, shapes, q, k, v, bias=bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, bias, scale, causal):
  return _forward_call(q, k, v, bias, scale, causal)[0]


def _flash_fwd(q, k, v, bias, scale, causal):
  out, lse = (checkpoint_name(x, SAVE_NAME) for x in _forward_call(q, k, v, bias, scale, causal))
  return out, (q, k, v, bias, out, lse)


def _flash_bwd(scale, causal, residuals, d_out):
  q, k, v, bias, out, lse = residuals
  shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
  host = functools.partial(_backward_into, scale=scale, causal=causal)
  d_q, d_k, d_v = _host_call(host, shapes, d_out, q, k, v, out, lse, bias=bias)
  return d_q, d_k, d_v, None if bias is None else jnp.zeros_like(bias)


_flash.defvjp(_flash_fwd, _flash_bwd)
