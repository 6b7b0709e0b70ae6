"""Scaled dot-product attention: one entry point, four paths (XLA, cuDNN, einsum, torch).

`dot_product_attention` accepts multi-head (K == H), grouped-query (1 < K < H)
and multi-query (K == 1) key/value heads. Query head h reads kv head h // (H // K),
the same grouping as `jnp.repeat(k, H // K, axis=2)` and as jax.nn.

Paths:
  'xla'            tx/ops/xla_attention.py: XLA ops with a flash-style backward.
  'cudnn'          jax.nn.dot_product_attention(implementation='cudnn').
  'einsum'         the explicit path below; the only one with weights and dropout.
  'torch'          tx/ops/torch_attention.py: PyTorch's CPU flash kernel in a host
                   callback (no bias or soft-cap); chosen explicitly or by `tx tune`.
  'torch_float32'  the same kernel in float32 on widened bf16 / f16 q, k, v, for hosts
                   whose float32 kernels outrun their bf16 ones; out in q's dtype.
  'torch_block'    'torch' here; a self-attention layer given it takes its projections
                   into the same callbacks (tx/ops/torch_attention_block.py).
  'auto'           einsum if weights or dropout are requested; otherwise 'xla',
                   trying cuDNN first on GPU with bf16/fp16 inputs.

Every path computes the softmax in float32 and returns exact zeros for a query
row whose mask is all False (jax.nn alone would return the mean of v there).

Causal self-attention can skip the masked upper triangle: `causal_blocks=n` splits
the queries into n blocks and attends each over the keys up to its last query only
(the XLA path; the caller promises the mask is causal). At n blocks this computes
(n + 1) / 2n of the L x S scores (measurements: benchmarks/NOTES.md). With a sliding
window (`window=W`, the caller promising the mask hides keys W or more slots back) each
block [a, b) also skips the keys before a - W + 1.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from tx import compat
from tx.config.choices import ATTENTION_IMPLS
from tx.ops.masks import MASK_VALUE
from tx.ops.torch_attention import torch_attention
from tx.ops.xla_attention import masked_logits, weighted_values, xla_attention

_IMPLEMENTATIONS = ('auto', *ATTENTION_IMPLS)
_TORCH = ('torch', 'torch_float32')


def dot_product_attention(q_BLHD, k_BSKD, v_BSKD, *, mask=None, bias=None, scale=None,
                          implementation='auto', return_weights=False,
                          dropout_rate=0.0, dropout_rng=None, causal_blocks: int = 1,
                          softcap: float = 0.0, window: int = 0):
  """softmax(cap(q·kᵀ·scale) + bias) masked, times v.

  q [B, L, H, D]; k, v [B, S, K, D] with H % K == 0 (K < H = grouped-query /
  multi-query: each group of H//K query heads shares one kv head).
  mask: bool, broadcastable to [B, H, L, S] (True = may attend), or None.
  bias: float additive, broadcastable to [B, H, L, S], or None.
  scale: None -> 1/sqrt(D); a float otherwise (T5 passes 1.0).
  implementation: 'auto' | 'xla' | 'einsum' | 'cudnn' | 'torch' | 'torch_float32'. 'xla':
    XLA ops with a hand-written backward (tx/ops/xla_attention.py); 'torch': PyTorch's CPU
    flash kernel through a host callback (tx/ops/torch_attention.py; no bias or soft-cap;
    elsewhere than on the CPU a warning and 'xla'); 'torch_float32': the same on q, k, v
    widened to float32 (bf16 / f16 models: the softmax's probabilities meet v unrounded);
    'cudnn':
    jax.nn.dot_product_attention(implementation='cudnn'); 'einsum' is the explicit
    path; 'auto' uses 'xla' ('cudnn' first on GPU with bf16/fp16 inputs, falling back
    to 'xla' when cuDNN refuses the call: tx.compat.is_cudnn_refusal; any other error
    propagates) unless return_weights or dropout is requested: einsum.
  Returns out [B, L, H, D] in q's dtype, or (out, weights [B, H, L, S] float32)
  if return_weights. The weights are the softmax probabilities before dropout.

  Softmax always in float32 (also under bf16 inputs). A fully masked query row
  outputs exactly zeros (weights too), never NaN. Dropout on the weights (einsum
  path) when dropout_rate > 0 and dropout_rng is given.
  softcap: c > 0 replaces the scores q·kᵀ·scale by c·tanh(scores / c) before the bias
    and the mask (Gemma-2's attention soft-cap); 0 = off. cuDNN has no cap: 'auto' then
    takes the XLA path and 'cudnn' is a ValueError.
  causal_blocks: n > 1 promises that `mask` hides every key j > i from query i (self-
    attention, L == S) and runs the XLA path in n query blocks (at most L), each
    over the keys 0 .. its last query; the same result with the masked scores skipped.
    The cuDNN path then runs cuDNN's causal mode (it skips the hidden tiles; the mask
    still applies on top); the einsum path computes the full L x S.
  window: W > 0 (with causal_blocks > 1) promises in addition that `mask` hides every key
    j <= i - W from query i (a causal sliding window, `masks.sliding_window_mask`): each
    query block [a, b) then reads the keys [max(0, a - W + 1), b) only. It applies no
    mask itself; 0 = no promise. Ignored by the paths that compute the full L x S.
  """
  B, L, H, D, S = _check_qkv(q_BLHD, k_BSKD, v_BSKD)
  full_BHLS = (B, H, L, S)
  if not isinstance(causal_blocks, int) or causal_blocks < 1:
    raise ValueError(f'causal_blocks must be an int >= 1, got {causal_blocks!r}')
  if not isinstance(window, int) or window < 0:
    raise ValueError(f'window must be an int >= 0 (0 = none), got {window!r}')
  if causal_blocks > 1 and L != S:
    raise ValueError(f'causal_blocks={causal_blocks} needs self-attention (L == S), got '
                     f'L={L}, S={S}; pass causal_blocks=1')
  mask_unbroadcast = None  # torch's kernel reads a [B, 1, 1, S] padding mask as it is
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
      raise ValueError(f'mask must be bool (True = may attend), got {mask.dtype}; '
                       'pass additive masks as bias')
    mask_unbroadcast = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    mask = _as_4d(mask, full_BHLS, 'mask')
  if bias is not None:
    bias = _as_4d(jnp.asarray(bias), full_BHLS, 'bias')
  if implementation not in _IMPLEMENTATIONS:
    raise ValueError(f'implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}')
  if implementation == 'torch_block':  # the projections are the layer's to fuse
    implementation = 'torch'
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f'dropout_rate must be in [0, 1), got {dropout_rate}')
  if softcap < 0:
    raise ValueError(f'softcap must be >= 0 (0 = off), got {softcap}')
  if softcap and implementation == 'cudnn':
    raise ValueError("implementation='cudnn' has no attention soft-cap; use 'xla' or 'auto'")
  scale = 1.0 / float(np.sqrt(D)) if scale is None else scale

  use_dropout = dropout_rate > 0.0 and dropout_rng is not None
  if implementation in _TORCH and (bias is not None or softcap):
    raise ValueError(f"implementation={implementation!r} takes no bias or soft-cap (T5 / "
                     "ALiBi positions, Gemma-2); use 'xla' or 'auto'")
  if implementation in ('xla', 'cudnn', *_TORCH) and (return_weights or use_dropout):
    raise ValueError(f'implementation={implementation!r} cannot return weights or apply '
                     "dropout; use 'einsum' or 'auto'")
  if implementation == 'einsum' or (implementation == 'auto' and (return_weights or use_dropout)):
    out_BLHD, weights_BHLS = _einsum_attention(
        q_BLHD, k_BSKD, v_BSKD, mask, bias, scale,
        dropout_rate if use_dropout else 0.0, dropout_rng, softcap)
    return (out_BLHD, weights_BHLS) if return_weights else out_BLHD

  if implementation == 'auto':
    out_BLHD = None
    if _wants_cudnn(q_BLHD) and not softcap:
      try:
        out_BLHD = _cudnn_attention(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale,
                                    causal=causal_blocks > 1)
      except Exception as e:  # pylint: disable=broad-except
        if not compat.is_cudnn_refusal(e):  # only a shape/dtype/GPU cuDNN refuses falls back
          raise
        out_BLHD = None
    if out_BLHD is None:
      out_BLHD = _causal_blocks(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, causal_blocks,
                                softcap, window)
    return out_BLHD
  if implementation == 'cudnn':
    return _cudnn_attention(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, causal=causal_blocks > 1)
  if implementation in _TORCH:
    if jax.default_backend() == 'cpu':
      dtype = jnp.float32 if implementation == 'torch_float32' else q_BLHD.dtype
      out_BLHD = torch_attention(q_BLHD.astype(dtype), k_BSKD.astype(dtype),
                                 v_BSKD.astype(dtype), mask_unbroadcast, scale, MASK_VALUE,
                                 causal=causal_blocks > 1)
      return out_BLHD.astype(q_BLHD.dtype)
    # the callback would be handed device buffers; a run tuned on a CPU still runs here
    warnings.warn(f"implementation={implementation!r} is a CPU path: on "
                  f"{jax.default_backend()} attention is XLA's", stacklevel=2)
  return _causal_blocks(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, causal_blocks, softcap,
                        window)


def _check_qkv(q, k, v):
  """Validates ranks and sizes; returns (B, L, H, D, S)."""
  if q.ndim != 4:
    raise ValueError(f'q_BLHD must be 4-D [B, L, H, D], got shape {q.shape}')
  if k.ndim != 4:
    raise ValueError(f'k_BSKD must be 4-D [B, S, K, D], got shape {k.shape}')
  if v.shape != k.shape:
    raise ValueError(f'v_BSKD must have the shape of k_BSKD {k.shape}, got {v.shape}')
  B, L, H, D = q.shape
  if k.shape[0] != B or k.shape[3] != D:
    raise ValueError(f'k_BSKD batch and head dim must match q {q.shape}, got {k.shape}')
  K = k.shape[2]
  if K == 0 or H % K != 0:
    raise ValueError(f'k_BSKD kv heads ({K}) must divide the query heads ({H})')
  return B, L, H, D, k.shape[1]


def _as_4d(x, full_BHLS, name):
  """Left-pads `x` to 4-D, checks it broadcasts to [B, H, L, S], and broadcasts the
  L and S axes (cuDNN wants them full); B and H stay 1 when they were 1."""
  if x.ndim > 4:
    raise ValueError(f'{name} must be broadcastable to [B, H, L, S]={full_BHLS}, got {x.shape}')
  x = x.reshape((1,) * (4 - x.ndim) + x.shape)
  try:
    if np.broadcast_shapes(x.shape, full_BHLS) != full_BHLS:
      raise ValueError
  except ValueError:
    raise ValueError(f'{name} must be broadcastable to [B, H, L, S]={full_BHLS}, '
                     f'got {x.shape}') from None
  return jnp.broadcast_to(x, x.shape[:2] + full_BHLS[2:])


def _row_visible(mask_BHLS):
  """[B|1, H|1, L, 1] bool: does the query row see at least one key."""
  return jnp.any(mask_BHLS, axis=-1, keepdims=True)


def _einsum_attention(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, dropout_rate, dropout_rng,
                      softcap=0.0):
  logits_BHLS = masked_logits(q_BLHD, k_BSKD, mask, bias, scale, MASK_VALUE, softcap)
  weights_BHLS = jax.nn.softmax(logits_BHLS, axis=-1)
  if mask is not None:
    weights_BHLS = jnp.where(_row_visible(mask), weights_BHLS, 0.0)

  probs_BHLS = weights_BHLS
  if dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs_BHLS.shape)
    probs_BHLS = jnp.where(keep, probs_BHLS / (1.0 - dropout_rate), 0.0)
  return weighted_values(probs_BHLS, v_BSKD, q_BLHD.dtype), weights_BHLS


def _causal_blocks(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, blocks, softcap=0.0, window=0):
  """The XLA path over query blocks [a, b), each attending to keys [0, b), or to keys
  [a - window + 1, b) under a sliding window."""
  L = q_BLHD.shape[1]
  blocks = min(blocks, L)
  if blocks == 1:
    return xla_attention(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, MASK_VALUE, softcap)
  cuts = [round(L * i / blocks) for i in range(blocks + 1)]
  first = lambda a: max(0, a - window + 1) if window else 0  # the block's first key
  return xla_attention(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, MASK_VALUE, softcap,
                       blocks=[(a, b, first(a), b) for a, b in zip(cuts[:-1], cuts[1:])])


def _cudnn_attention(q_BLHD, k_BSKD, v_BSKD, mask, bias, scale, causal=False):
  """jax.nn.dot_product_attention(implementation='cudnn'); exact zeros for rows that see
  nothing. causal: the caller promised a causal mask, so cuDNN's causal mode may skip the
  hidden tiles (1.7x on an H100 at length 1024, benchmarks/NOTES.md); the mask still applies."""
  dtype = q_BLHD.dtype
  k_BSKD, v_BSKD = k_BSKD.astype(dtype), v_BSKD.astype(dtype)
  if bias is not None:
    bias = bias.astype(dtype)  # cuDNN adds the bias in the input dtype
  out_BLHD = jax.nn.dot_product_attention(
      q_BLHD, k_BSKD, v_BSKD, bias=bias, mask=mask, scale=scale, is_causal=causal,
      implementation='cudnn')
  if mask is not None:
    visible_BLH1 = jnp.transpose(_row_visible(mask), (0, 2, 1, 3))
    out_BLHD = jnp.where(visible_BLH1, out_BLHD, jnp.zeros((), dtype))
  return out_BLHD.astype(dtype)


def _wants_cudnn(q_BLHD):
  return jax.default_backend() == 'gpu' and q_BLHD.dtype in (jnp.bfloat16, jnp.float16)
