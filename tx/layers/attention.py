"""Multi-head attention (self or cross; MHA / GQA / MQA) with RoPE, biases and a KV cache."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from tx import ops
from tx.config.base import choice, config, fail
from tx.layers.common import DenseGeneral, constrain
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
  qk_norm: str = choice('none', 'layernorm', 'rmsnorm')  # per-head q and k, before RoPE
  qk_norm_eps: float = 1e-6
  softcap: float = 0.0  # c * tanh(score / c) before the softmax; 0 = off
  rope: bool = False
  rope_theta: float = 10000.0
  rope_fraction: float = 1.0
  implementation: str = choice('auto', 'xla', 'einsum', 'cudnn')
  # > 1 (or 0 = by length) promises a causal mask: self-attention without a cache then
  # runs in query blocks that skip the hidden keys (ops.dot_product_attention).
  causal_blocks: int = 1
  dtype: str = 'float32'
  param_dtype: str = 'float32'

  def validate(self):
    if self.causal_blocks < 0:
      fail('causal_blocks', f'must be >= 0 (0 = by length, 1 = off), got {self.causal_blocks}')
    if self.num_heads % self.kv_heads:
      fail('num_kv_heads', f'{self.kv_heads} does not divide num_heads={self.num_heads}')
    if self.head_dim is None and self.d_model % self.num_heads:
      fail('d_model', f'{self.d_model} is not divisible by num_heads={self.num_heads}')

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def dim(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def score_scale(self) -> float:
    """The factor on q·kᵀ: 1/sqrt(head_dim) (or 1 when scale=False) x scale_multiplier."""
    return (self.dim ** -0.5 if self.scale else 1.0) * self.scale_multiplier


class MultiHeadAttention(nn.Module):
  """Attention of queries from `x` over keys/values from `kv` (= x for self-attention).

  x [B, L, D], kv [B, S, D]; mask bool and bias float broadcastable to [B, H, L, S];
  q_pos [B, L] / k_pos [B, S] positions for RoPE. Returns [B, L, D].

  With `decode=True` keys and values are kept in the 'cache' collection: the first call
  (at init) allocates a cache as long as its input; later calls write their L new
  keys/values at `cache_index` and attend over the whole cache, so `mask`/`bias` must
  then cover the cache length S_max (the model builds them).

  Cross-attention (`cross=True`) with `decode=True` projects the encoder output once:
  a call given `kv` stores its keys/values in the cache, a call with `kv=None` reuses
  them, so decoding steps after the first need not pass (or re-project) `encoded`.
  """
  cfg: AttentionConfig
  decode: bool = False
  cross: bool = False

  def _proj(self, x, heads, name, axes):
    cfg = self.cfg
    return DenseGeneral((heads, cfg.dim), axes, use_bias=cfg.use_bias, dtype=cfg.dtype,
                        param_dtype=cfg.param_dtype, name=name)(x)

  def _keys(self, kv_BSD):
    """Keys [B, S, K, D] of kv: projected, then normalised per head under qk_norm."""
    k_BSKD = self._proj(kv_BSD, self.cfg.kv_heads, 'key', ('embed', 'kv_heads', 'kv'))
    return self._qk_norm('key_norm', k_BSKD) if self.cfg.qk_norm != 'none' else k_BSKD

  def _qk_norm(self, name, x_BLHD):
    """Per-head LayerNorm / RMSNorm over head_dim with a learned scale (no bias), before
    RoPE and the dot product (Dehghani et al. 2023; Wortsman et al. 2023)."""
    cfg = self.cfg
    return Norm(NormConfig(kind=cfg.qk_norm, eps=cfg.qk_norm_eps, use_bias=False, axis='kv',
                           dtype=cfg.dtype, param_dtype=cfg.param_dtype), name=name)(x_BLHD)

  @nn.compact
  def __call__(self, x_BLD, kv_BSD=None, *, mask=None, bias=None, q_pos_BL=None, k_pos_BS=None,
               cache_index=None, deterministic: bool = True, return_weights: bool = False):
    cfg = self.cfg
    is_self = kv_BSD is None and not self.cross
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
      q_BLHD = ops.apply_rope(q_BLHD, q_pos_BL, cfg.rope_theta, cfg.rope_fraction)
      k_BSKD = ops.apply_rope(k_BSKD, q_pos_BL if k_pos_BS is None else k_pos_BS,
                              cfg.rope_theta, cfg.rope_fraction)

    if self.decode and is_self:
      k_BSKD, v_BSKD = self._update_cache(k_BSKD, v_BSKD, cache_index)
    if self.is_mutable_collection('diagnostics'):  # training with train.diagnostics on
      self.sow('diagnostics', 'attn_logit_max',
               ops.max_attention_logit(q_BLHD, k_BSKD, cfg.score_scale))

    dropout_rng = None
    if cfg.dropout > 0 and not deterministic:
      dropout_rng = self.make_rng('dropout')
    blocks = 1
    if is_self and not self.decode:
      blocks = _causal_blocks(cfg.causal_blocks, q_BLHD.shape[1])
    result = ops.dot_product_attention(
        q_BLHD, k_BSKD, v_BSKD, mask=mask, bias=bias,
        scale=cfg.score_scale, softcap=cfg.softcap, implementation=cfg.implementation,
        return_weights=return_weights, dropout_rate=cfg.dropout if dropout_rng is not None else 0.0,
        dropout_rng=dropout_rng, causal_blocks=blocks)
    if return_weights:
      out_BLHD, weights_BHLS = result
      self.sow('intermediates', 'attention_weights', weights_BHLS)
    else:
      out_BLHD = result
    out_BLHD = checkpoint_name(constrain(out_BLHD, ('batch', 'length', 'heads', 'kv')),
                               'attention_out')
    return DenseGeneral((cfg.d_model,), ('heads', 'kv', 'embed'), in_dims=2,
                        use_bias=cfg.use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                        name='out')(out_BLHD)

  # Caches are stored [B, K, S, D], the layout the attention dot reads: stored as
  # [B, S, K, D], XLA:CPU copied the whole cache into that layout at every decoding step
  # (~90 % of a step at batch 8; benchmarks/NOTES.md). The [B, S, K, D] views returned
  # below are transposes of transposes, which XLA folds away.
  def _update_cache(self, k_BLKD, v_BLKD, cache_index):
    """Writes the new keys/values at `cache_index`; returns the whole cache [B, S_max, K, D]."""
    initialized = self.has_variable('cache', 'cached_key')
    shape_BKLD = _heads_first(k_BLKD).shape
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, shape_BKLD, k_BLKD.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, shape_BKLD, v_BLKD.dtype)
    if not initialized:  # the allocating call at init attends over its own input only
      return k_BLKD, v_BLKD
    start = (0, 0, cache_index, 0)
    for cached, new in ((cached_k, k_BLKD), (cached_v, v_BLKD)):
      cached.value = jax.lax.dynamic_update_slice(
          cached.value, _heads_first(new).astype(cached.value.dtype), start)
    return _heads_first(cached_k.value), _heads_first(cached_v.value)

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


def _causal_blocks(blocks: int, length: int) -> int:
  """0 = by length: blocks of >= 64 queries, at most 4 (measured on CPU: shorter blocks
  cost more dispatch and slicing than their skipped scores save; benchmarks/NOTES.md)."""
  return blocks or max(1, min(4, length // 64))
