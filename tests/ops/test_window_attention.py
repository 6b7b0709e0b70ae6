"""Sliding-window attention in tx.ops: the mask matches transformers' definition, a window
as long as the sequence is global attention, and causal query blocks that skip the keys
outside the window compute what the full masked L x L attention computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx import ops

B, L, H, K, D = 2, 12, 4, 2, 8  # grouped-query: 2 query heads per kv head


def _qkv(seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32)
             for s in ((B, L, H, D), (B, L, K, D), (B, L, K, D)))
  return q, k, v


def _positions():
  """Row 0: positions 0..L-1; row 1: two packed sequences (positions restart at 5)."""
  return jnp.stack([jnp.arange(L), jnp.concatenate([jnp.arange(5), jnp.arange(L - 5)])])


def _segments():
  return jnp.stack([jnp.ones(L, jnp.int32), jnp.array([1] * 5 + [2] * (L - 5), jnp.int32)])


def _local_causal_mask(window):
  pos, seg = _positions(), _segments()
  return ops.combine_masks(ops.segment_mask(seg, seg), ops.causal_mask(L),
                           ops.sliding_window_mask(pos, pos, window))


@pytest.mark.parametrize('window', [1, 3, 7])
def test_mask_matches_transformers(window):
  """One-sided: transformers' sliding_window_causal_mask_function(W) (Mistral, Gemma-2):
  i - W < j <= i. Bidirectional: |i - j| < W, its bidirectional function at W - 1."""
  torch = pytest.importorskip('torch')
  masking = pytest.importorskip('transformers.masking_utils')
  q_idx, kv_idx = torch.arange(L)[:, None], torch.arange(L)[None, :]
  pos = jnp.arange(L)[None]
  causal = ops.combine_masks(ops.causal_mask(L), ops.sliding_window_mask(pos, pos, window))
  hf_causal = masking.sliding_window_causal_mask_function(window)(0, 0, q_idx, kv_idx)
  np.testing.assert_array_equal(causal[0, 0], hf_causal.numpy())
  both = ops.sliding_window_mask(pos, pos, window, bidirectional=True)
  hf_both = masking.sliding_window_bidirectional_mask_function(window - 1)(0, 0, q_idx, kv_idx)
  np.testing.assert_array_equal(both[0, 0], hf_both.numpy())
  assert int(causal[0, 0, L - 1].sum()) == window  # W keys, the query's own included


def test_mask_uses_positions_not_slots():
  """A left-padded row (positions start after the pads) sees the same window as an
  unpadded one; packed rows restart their positions."""
  pos = jnp.array([[0, 0, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2]])
  mask = ops.sliding_window_mask(pos, pos, 2)
  np.testing.assert_array_equal(mask[0, 0, 5, 3:], [False, True, True])
  assert bool(mask[1, 0, 3, 2])  # position 0 of the second sequence; segment masks cut it
  with pytest.raises(ValueError, match='window must be >= 1'):
    ops.sliding_window_mask(pos, pos, 0)


def test_window_as_long_as_the_sequence_is_global_attention():
  q, k, v = _qkv()
  pos, seg = _positions(), _segments()
  causal = ops.combine_masks(ops.segment_mask(seg, seg), ops.causal_mask(L))
  full = ops.dot_product_attention(q, k, v, mask=causal, implementation='xla')
  windowed = ops.dot_product_attention(
      q, k, v, mask=ops.combine_masks(causal, ops.sliding_window_mask(pos, pos, L)),
      implementation='xla', causal_blocks=4, window=L)
  np.testing.assert_array_equal(
      ops.dot_product_attention(q, k, v, mask=_local_causal_mask(L), implementation='xla'), full)
  np.testing.assert_allclose(windowed, full, atol=1e-6)


@pytest.mark.parametrize('window,blocks', [(1, 4), (3, 4), (3, 5), (5, 3), (12, 2)])
def test_windowed_causal_blocks_equal_the_full_masked_attention(window, blocks):
  """Values and gradients (q, k, v and an ALiBi-like bias) of blocks that read keys
  [a - W + 1, b) only equal one block over all keys with the same mask."""
  q, k, v = _qkv(window)
  mask = _local_causal_mask(window)
  bias = 0.1 * jnp.arange(L, dtype=jnp.float32)[None, None, None, :] * jnp.ones((1, H, 1, 1))

  def loss(q, k, v, bias, **kw):
    out = ops.dot_product_attention(q, k, v, mask=mask, bias=bias, implementation='xla',
                                    softcap=3.0, **kw)
    return jnp.sum(jnp.sin(out)), out

  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True),
                  static_argnames=('causal_blocks', 'window'))
  (g_full, out_full) = grads(q, k, v, bias)
  (g_blocked, out_blocked) = grads(q, k, v, bias, causal_blocks=blocks, window=window)
  np.testing.assert_allclose(out_blocked, out_full, atol=1e-6)
  for a, b in zip(g_blocked, g_full):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_window_blocks_really_skip_keys():
  """Under the promise the keys before a - W + 1 are not read: garbage there changes
  nothing (it would, were they read unmasked)."""
  q, k, v = _qkv()
  window = 3
  pos = jnp.arange(L)[None]
  causal = ops.combine_masks(ops.causal_mask(L), ops.sliding_window_mask(pos, pos, window))
  ref = ops.dot_product_attention(q, k, v, mask=causal, implementation='xla', causal_blocks=4,
                                  window=window)
  no_mask = ops.dot_product_attention(q, k, v, mask=ops.causal_mask(L), implementation='xla',
                                      causal_blocks=4, window=window)
  # without the window mask, block [9, 12) still reads keys 7.. only: its rows match the
  # causal attention over keys 7..i, not 0..i
  tail = ops.dot_product_attention(q[:, 9:], k[:, 7:], v[:, 7:],
                                   mask=ops.causal_mask(3, 5, offset=2), implementation='xla')
  np.testing.assert_allclose(no_mask[:, 9:], tail, atol=1e-6)
  assert not np.allclose(ref[:, 9:], tail, atol=1e-3)


def test_window_argument_is_validated():
  q, k, v = _qkv()
  with pytest.raises(ValueError, match='window must be an int >= 0'):
    ops.dot_product_attention(q, k, v, window=-1)
