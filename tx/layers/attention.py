"""Multi-head attention (self or cross; MHA / GQA / MQA) with RoPE, biases and a KV cache."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from tx import ops
from tx.config.base import choice, config, fail, nested
from tx.config.choices import ATTENTION_IMPLS, MATMUL_IMPLS
from tx.config.rope import RopeScalingConfig
from tx.layers.common import DenseGeneral, DenseWeights, constrain
from tx.layers.norm import Norm, NormConfig


@config
class AttentionConfig:
  d_model: int
  num_heads: int
  num_kv_heads: int | None = None  # None = num_heads
  head_dim: int | None = None  # None = d_model // num_heads
  use_bias: bool = True
  dropout: float = 0.0  # on the attention weights
  scale: bool = True  # False: no 1/sqrt(d_k) (T5 folds it into the init)
  scale_multiplier: float = 1.0  # times the score scale (muP: sqrt(base head_dim / head_dim))
  query_pre_attn_scalar: float | None = None  # score scale its ** -0.5 (Gemma 2); None = head_dim
  qk_norm: str = choice('none', 'layernorm', 'rmsnorm')  # per-head q and k, before RoPE
  qk_norm_eps: float = 1e-6
  qk_norm_scale_offset: bool = False  # q/k norm scales as (1 + scale) (NormConfig.scale_offset)
  softcap: float = 0.0  # c * tanh(score / c) before the softmax; 0 = off
  rope: bool = False
  rope_theta: float = 10000.0
  rope_fraction: float = 1.0
  rope_interleaved: bool = False  # GPT-J pairs (x0, x1), (x2, x3) ... instead of halves
  rope_scaling: RopeScalingConfig = nested(RopeScalingConfig)  # with original_max_len set
  implementation: str = choice('auto', *ATTENTION_IMPLS)
  # > 1 (or 0 = by length) promises a causal mask: self-attention without a cache then
  # runs in query blocks that skip the hidden keys (ops.dot_product_attention).
  causal_blocks: int = 1
  # > 0: a local (sliding-window) self-attention layer. The caller's mask must hide the
  # keys outside the window (tx.models builds it: ops.sliding_window_mask); the window
  # lets causal query blocks skip the keys W or more slots back, and with decode=True
  # the cache is a ring of min(W, allocated length) slots (`_update_ring`).
  window: int = 0
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  matmul: str = choice(*MATMUL_IMPLS)  # the projections' products (tx/ops/matmul.py)

  def validate(self):
    if self.causal_blocks < 0:
      fail('causal_blocks', f'must be >= 0 (0 = by length, 1 = off), got {self.causal_blocks}')
    if self.window < 0:
      fail('window', f'must be >= 0 (0 = global attention), got {self.window}')
    if self.num_heads % self.kv_heads:
      fail('num_kv_heads', f'{self.kv_heads} does not divide num_heads={self.num_heads}')
    if self.head_dim is None and self.d_model % self.num_heads:
      fail('d_model', f'{self.d_model} is not divisible by num_heads={self.num_heads}')
    if self.rope_scaling.kind != 'none' and self.rope_scaling.original_max_len is None:
      fail('rope_scaling', f'kind={self.rope_scaling.kind!r} needs original_max_len set')
    if self.query_pre_attn_scalar is not None and self.query_pre_attn_scalar <= 0:
      fail('query_pre_attn_scalar', f'must be > 0 or None, got {self.query_pre_attn_scalar}')

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def dim(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def score_scale(self) -> float:
    """The factor on q·kᵀ: 1/sqrt(query_pre_attn_scalar or head_dim) (or 1 when
    scale=False) x scale_multiplier."""
    base = self.dim if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar
    return (base ** -0.5 if self.scale else 1.0) * self.scale_multiplier


class MultiHeadAttention(nn.Module):
  """Attention of queries from `x` over keys/values from `kv` (= x for self-attention).

  x [B, L, D], kv [B, S, D]; mask bool and bias float broadcastable to [B, H, L, S];
  q_pos [B, L] / k_pos [B, S] positions for RoPE. Returns [B, L, D].

  With `decode=True` keys and values are kept in the 'cache' collection: the first call
  (at init) allocates a cache as long as its input; later calls write their L new
  keys/values at `cache_index` and attend over the whole cache, so `mask`/`bias` must
  then cover the cache length S_max (the model builds them). A local layer
  (`cfg.window` > 0) keeps a ring of min(window, S_max) slots instead and attends over
  [ring, new keys]: R + L keys, masked by the model's local mask (`_update_ring`).

  Cross-attention (`cross=True`) with `decode=True` projects the encoder output once:
  a call given `kv` stores its keys/values in the cache, a call with `kv=None` reuses
  them, so decoding steps after the first need not pass (or re-project) `encoded`.
  """
  cfg: AttentionConfig
  decode: bool = False
  cross: bool = False

  def _proj(self, x, heads, name, axes):
    """x [B, L, D] -> [B, L, heads, dim] in the compute dtype (the dots that follow, and the
    cache, take it; a bf16 projection returns its float32 accumulator)."""
    cfg = self.cfg
    return DenseGeneral((heads, cfg.dim), axes, use_bias=cfg.use_bias, dtype=cfg.dtype,
                        param_dtype=cfg.param_dtype, matmul=cfg.matmul,
                        name=name)(x).astype(jnp.dtype(cfg.dtype))

  def _keys(self, kv_BSD):
    """Keys [B, S, K, D] of kv: projected, then normalised per head under qk_norm."""
    k_BSKD = self._proj(kv_BSD, self.cfg.kv_heads, 'key', ('embed', 'kv_heads', 'kv'))
    return self._qk_norm('key_norm', k_BSKD) if self.cfg.qk_norm != 'none' else k_BSKD

  def _qk_norm(self, name, x_BLHD):
    """Per-head LayerNorm / RMSNorm over head_dim with a learned scale (no bias), before
    RoPE and the dot product (Dehghani et al. 2023; Wortsman et al. 2023)."""
    cfg = self.cfg
    return Norm(NormConfig(kind=cfg.qk_norm, eps=cfg.qk_norm_eps, use_bias=False, axis='kv',
                           scale_offset=cfg.qk_norm_scale_offset, dtype=cfg.dtype,
                           param_dtype=cfg.param_dtype), name=name)(x_BLHD)

  @nn.compact
  def __call__(self, x_BLD, kv_BSD=None, *, mask=None, bias=None, q_pos_BL=None, k_pos_BS=None,
               cache_index=None, deterministic: bool = True, return_weights: bool = False):
    cfg = self.cfg
    is_self = kv_BSD is None and not self.cross
    blocks = 1
    if is_self and not self.decode:
      blocks = causal_block_count(cfg.causal_blocks, x_BLD.shape[1], cfg.window)
    implementation = cfg.implementation
    if implementation == 'torch_block':
      if self._whole_block_in_torch(is_self, bias, deterministic, return_weights):
        return self._torch_block(x_BLD, mask, causal=blocks > 1)
      implementation = 'torch'
    q_BLHD = self._proj(x_BLD, cfg.num_heads, 'query', ('embed', 'heads', 'kv'))
    if self.cross and self.decode:
      k_BSKD, v_BSKD = self._cross_cache(kv_BSD)
    else:
      if kv_BSD is None and not is_self:
        raise ValueError('cross-attention needs kv (the encoder output) unless decode=True')
      kv_BSD = x_BLD if is_self else kv_BSD
      k_BSKD = self._keys(kv_BSD)
      v_BSKD = self._proj(kv_BSD, cfg.kv_heads, 'value', ('embed', 'kv_heads', 'kv'))
    q_BLHD = constrain(q_BLHD, ('batch', 'length', 'heads', 'kv'))
    if cfg.qk_norm != 'none':
      q_BLHD = self._qk_norm('query_norm', q_BLHD)

    if cfg.rope:
      rope = dict(scaling=cfg.rope_scaling, interleaved=cfg.rope_interleaved)
      q_BLHD = ops.apply_rope(q_BLHD, q_pos_BL, cfg.rope_theta, cfg.rope_fraction, **rope)
      k_BSKD = ops.apply_rope(k_BSKD, q_pos_BL if k_pos_BS is None else k_pos_BS,
                              cfg.rope_theta, cfg.rope_fraction, **rope)

    if self.decode and is_self:
      update = self._update_ring if cfg.window else self._update_cache
      k_BSKD, v_BSKD = update(k_BSKD, v_BSKD, cache_index)
    if self.is_mutable_collection('diagnostics'):  # training with train.diagnostics on
      self.sow('diagnostics', 'attn_logit_max',
               ops.max_attention_logit(q_BLHD, k_BSKD, cfg.score_scale))

    dropout_rng = None
    if cfg.dropout > 0 and not deterministic:
      dropout_rng = self.make_rng('dropout')
    result = ops.dot_product_attention(
        q_BLHD, k_BSKD, v_BSKD, mask=mask, bias=bias,
        scale=cfg.score_scale, softcap=cfg.softcap, implementation=implementation,
        return_weights=return_weights, dropout_rate=cfg.dropout if dropout_rng is not None else 0.0,
        dropout_rng=dropout_rng, causal_blocks=blocks, window=cfg.window if blocks > 1 else 0)
    if return_weights:
      out_BLHD, weights_BHLS = result
      self.sow('intermediates', 'attention_weights', weights_BHLS)
    else:
      out_BLHD = result
    out_BLHD = checkpoint_name(constrain(out_BLHD, ('batch', 'length', 'heads', 'kv')),
                               'attention_out')
    return DenseGeneral((cfg.d_model,), ('heads', 'kv', 'embed'), in_dims=2,
                        use_bias=cfg.use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                        matmul=cfg.matmul, name='out')(out_BLHD)

  def _whole_block_in_torch(self, is_self, bias, deterministic, return_weights) -> bool:
    """Whether implementation='torch_block' can take this call whole: self-attention without
    a cache, with nothing between the projections and the kernel, on the CPU."""
    cfg = self.cfg
    return (is_self and not self.decode and not cfg.rope and cfg.qk_norm == 'none'
            and cfg.kv_heads == cfg.num_heads and bias is None and not cfg.softcap
            and not return_weights and (cfg.dropout == 0 or deterministic)
            and cfg.dtype in ('float32', 'bfloat16') and jax.default_backend() == 'cpu'
            and not self.is_mutable_collection('diagnostics'))

  def _torch_block(self, x_BLD, mask, causal: bool):
    """The block's projections and kernel in torch (tx/ops/torch_attention_block.py), with
    the parameters `_proj` and the output projection make. x [B, L, D] -> [B, L, D], float32
    as the output projection returns it."""
    cfg = self.cfg
    d_model, heads = x_BLD.shape[-1], (cfg.num_heads, cfg.dim)
    weights = lambda name, features, axes, in_shape: DenseWeights(
        features, axes, in_dims=len(in_shape), use_bias=cfg.use_bias, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype, name=name)(in_shape)
    wq, bq = weights('query', heads, ('embed', 'heads', 'kv'), (d_model,))
    wk, bk = weights('key', heads, ('embed', 'kv_heads', 'kv'), (d_model,))
    wv, bv = weights('value', heads, ('embed', 'kv_heads', 'kv'), (d_model,))
    wo, bo = weights('out', (cfg.d_model,), ('heads', 'kv', 'embed'), heads)
    mask_BHLS = None
    if mask is not None:
      mask = jnp.asarray(mask)
      mask_BHLS = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    y_BLD = ops.torch_attention_block(
        x_BLD.astype(jnp.dtype(cfg.dtype)), wq, wk, wv, wo,
        None if bq is None else (bq, bk, bv, bo), mask_BHLS, cfg.score_scale, causal=causal)
    return y_BLD.astype(jnp.float32)

  # Self-attention caches are stored [B*K, S, D] (rows of one kv head, batch-major): the
  # operand a single query's attention dots read (tx/ops/xla_attention.py `_single_query`).
  # A cache of any other shape reaches those dots through a reshape, and XLA:CPU then
  # duplicates the in-place update into a second whole-cache copy at every decoding step
  # (benchmarks/NOTES.md attempt 34). The [B, S, K, D] views returned below are reshapes
  # and transposes that XLA folds away.
  def _update_cache(self, k_BLKD, v_BLKD, cache_index):
    """Writes the new keys/values at `cache_index`; returns the whole cache [B, S_max, K, D]."""
    initialized = self.has_variable('cache', 'cached_key')
    b, l, kv_heads, dim = k_BLKD.shape
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, (b * kv_heads, l, dim),
                             k_BLKD.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, (b * kv_heads, l, dim),
                             v_BLKD.dtype)
    if not initialized:  # the allocating call at init attends over its own input only
      return k_BLKD, v_BLKD
    for cached, new in ((cached_k, k_BLKD), (cached_v, v_BLKD)):
      cached.value = jax.lax.dynamic_update_slice(
          cached.value, _cache_rows(new).astype(cached.value.dtype), (0, cache_index, 0))
    return _cache_view(cached_k.value, b), _cache_view(cached_v.value, b)

  def _update_ring(self, k_BLKD, v_BLKD, cache_index):
    """A local layer's cache: a ring of R = min(window, S_max) slots, token t in slot t mod R.

    Returns concat(ring before this call, the new keys/values) [B, R + L, K, D] (the
    model's local mask covers that layout), then writes the last min(L, R) new
    keys/values into their slots. R does not grow with the decode length once it reaches
    the window, so the cache holds O(window) keys; while R < window nothing wraps, and
    zero-padding a grown cache (`tx.decode.steps.padded_cache`) keeps every slot.
    """
    initialized = self.has_variable('cache', 'cached_key')
    b, l, kv_heads, dim = k_BLKD.shape
    shape = (b * kv_heads, min(self.cfg.window, l), dim)  # at init, l = S_max
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, shape, k_BLKD.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, shape, v_BLKD.dtype)
    if not initialized:  # the allocating call at init attends over its own input only
      return k_BLKD, v_BLKD
    out = []
    for cached, new in ((cached_k, k_BLKD), (cached_v, v_BLKD)):
      ring = cached.value
      out.append(jnp.concatenate([_cache_view(ring, b).astype(new.dtype), new], axis=1))
      cached.value = write_ring(ring, _cache_rows(new).astype(ring.dtype), cache_index, axis=1)
    return tuple(out)

  def _cross_cache(self, kv_BSD):
    """Cross keys/values [B, S, K, D]: projected from kv and cached, or read from the cache."""
    cfg = self.cfg
    if kv_BSD is None:
      if not self.has_variable('cache', 'cross_key'):
        raise ValueError('cross-attention decoding: pass the encoder output on the first '
                         'decode call; later calls may pass None to reuse its keys/values')
      return (_heads_first(self.get_variable('cache', 'cross_key')),
              _heads_first(self.get_variable('cache', 'cross_value')))
    k_BSKD = self._keys(kv_BSD)
    v_BSKD = self._proj(kv_BSD, cfg.kv_heads, 'value', ('embed', 'kv_heads', 'kv'))
    initialized = self.has_variable('cache', 'cross_key')
    shape_BKSD = _heads_first(k_BSKD).shape
    cached_k = self.variable('cache', 'cross_key', jnp.zeros, shape_BKSD, k_BSKD.dtype)
    cached_v = self.variable('cache', 'cross_value', jnp.zeros, shape_BKSD, v_BSKD.dtype)
    if initialized:  # at init the cache stays zeros (its content is never read before a write)
      cached_k.value, cached_v.value = _heads_first(k_BSKD), _heads_first(v_BSKD)
    return k_BSKD, v_BSKD


def _heads_first(x):
  """[B, S, K, D] <-> [B, K, S, D] (its own inverse)."""
  return jnp.swapaxes(x, 1, 2)


def _cache_rows(x_BLKD):
  """[B, L, K, D] -> the cache layout [B*K, L, D] (rows of one kv head, batch-major)."""
  b, l, k, d = x_BLKD.shape
  return _heads_first(x_BLKD).reshape(b * k, l, d)


def _cache_view(rows, batch: int):
  """The cache layout [B*K, S, D] -> [B, S, K, D]."""
  n, s, d = rows.shape
  return _heads_first(rows.reshape(batch, n // batch, s, d))


def write_ring(ring, new, index, *, axis: int):
  """`ring` with the last min(L, R) entries of `new` written at slots (index + i) mod R.

  ring: R slots on `axis`; new: L entries on `axis` (other axes equal), the entries of
  tokens index, index + 1, ..., index + L - 1 (index may be traced); token t lives in
  slot t mod R, so after the write the ring holds the last R tokens written.
  """
  r, l = ring.shape[axis], new.shape[axis]
  n = min(l, r)
  new = jax.lax.slice_in_dim(new, l - n, l, axis=axis)
  first = (index + l - n) % r
  if n == 1:
    return jax.lax.dynamic_update_slice_in_dim(ring, new, first, axis)
  slots = (first + jnp.arange(n)) % r
  return ring.at[(slice(None),) * (axis % ring.ndim) + (slots,)].set(new)


def causal_block_count(blocks: int, length: int, window: int = 0) -> int:
  """0 = by length: blocks of >= 64 queries, at most 4 (measured on CPU: shorter blocks
  cost more dispatch and slicing than their skipped scores save; benchmarks/NOTES.md).
  Under a sliding window each block reads about its own length plus the window, so by
  length blocks are max(64, window) queries long, at most 8 (not measured beyond 4)."""
  if blocks:
    return blocks
  if window:
    return max(1, min(8, length // max(64, window)))
  return max(1, min(4, length // 64))
