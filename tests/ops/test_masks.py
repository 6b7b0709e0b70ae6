"""tx.ops.masks: shapes, values and the invariants attention relies on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx import ops
from tx.ops import combine_masks, key_padding_mask

# Jitted: one compile per call signature instead of one per primitive (fast suite).
padding_mask = jax.jit(ops.padding_mask)
causal_mask = jax.jit(ops.causal_mask, static_argnames=('q_len', 'k_len'))
causal_mask_from_positions = jax.jit(ops.causal_mask_from_positions)
segment_mask = jax.jit(ops.segment_mask)
cross_attention_mask = jax.jit(ops.cross_attention_mask)
mask_to_bias = jax.jit(ops.mask_to_bias, static_argnames=('dtype',))
segment_positions = jax.jit(ops.segment_positions)


def test_padding_and_key_padding_masks():
  tokens = jnp.array([[5, 3, 0, 0], [7, 0, 2, 0]])
  valid = padding_mask(tokens)
  np.testing.assert_array_equal(valid, [[1, 1, 0, 0], [1, 0, 1, 0]])
  np.testing.assert_array_equal(padding_mask(tokens, pad_id=7), tokens != 7)
  kpm = key_padding_mask(valid)
  assert kpm.shape == (2, 1, 1, 4) and kpm.dtype == jnp.bool_
  np.testing.assert_array_equal(kpm[:, 0, 0], valid)


def test_causal_mask_shape_and_values():
  m = causal_mask(4)
  assert m.shape == (1, 1, 4, 4) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(m[0, 0], np.tril(np.ones((4, 4), bool)))
  # 2 new queries after 3 cached keys: query i sees keys j <= i + 3.
  m = causal_mask(2, 5, offset=3)
  assert m.shape == (1, 1, 2, 5)
  np.testing.assert_array_equal(m[0, 0], [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_causal_mask_from_positions_matches_causal_mask():
  pos = jnp.arange(5)[None]
  m = causal_mask_from_positions(pos, pos)
  assert m.shape == (1, 1, 5, 5)
  np.testing.assert_array_equal(m, causal_mask(5))
  m = causal_mask_from_positions(jnp.array([[3, 4]]), jnp.arange(5)[None])
  np.testing.assert_array_equal(m, causal_mask(2, 5, offset=3))


def test_segment_mask_blocks_cross_segment_and_padding():
  seg = jnp.array([[1, 1, 2, 2, 2, 0], [1, 2, 3, 0, 0, 0]])
  m = np.asarray(segment_mask(seg, seg))
  assert m.shape == (2, 1, 6, 6)
  s = np.asarray(seg)
  for b in range(2):
    for i in range(6):
      for j in range(6):
        assert m[b, 0, i, j] == (s[b, i] == s[b, j] != 0)
  assert not m[:, :, s[0] == 0].any()  # padding queries see nothing
  assert not m[0, 0, :, 5].any()        # nobody sees a padding key


def test_cross_attention_mask():
  q_valid = jnp.array([[1, 1, 0]], bool)
  k_valid = jnp.array([[1, 0, 1, 0]], bool)
  m = cross_attention_mask(q_valid, k_valid)
  assert m.shape == (1, 1, 3, 4)
  np.testing.assert_array_equal(m[0, 0], [[1, 0, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0]])


def test_combine_masks_ands_and_ignores_none():
  assert combine_masks() is None and combine_masks(None, None) is None
  causal = causal_mask(3)
  kpm = key_padding_mask(jnp.array([[1, 1, 0], [1, 1, 1]], bool))
  m = combine_masks(None, causal, kpm, None)
  assert m.shape == (2, 1, 3, 3) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(m, np.logical_and(causal, kpm))
  np.testing.assert_array_equal(combine_masks(causal, None), causal)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float16])
def test_mask_to_bias_is_zero_or_large_finite_negative(dtype):
  mask = causal_mask(3)
  bias = mask_to_bias(mask, dtype)
  assert bias.dtype == dtype and bias.shape == mask.shape
  b = np.asarray(bias, np.float32)
  assert np.isfinite(b).all()
  assert np.all(b[np.asarray(mask)] == 0)
  assert np.all(b[~np.asarray(mask)] <= -1e4)
  if dtype != jnp.float16:  # two masks added as biases stay finite
    assert np.isfinite(np.asarray(bias + bias, np.float32)).all()


def test_segment_positions_restart_per_segment():
  seg = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 2, 2, 2, 3, 3, 3]])
  pos = segment_positions(seg)
  assert pos.dtype == jnp.int32
  np.testing.assert_array_equal(pos, [[0, 1, 2, 0, 1, 0, 1], [0, 0, 1, 2, 0, 1, 2]])
  # One segment per row is plain arange.
  np.testing.assert_array_equal(segment_positions(jnp.ones((2, 5), jnp.int32)),
                                np.tile(np.arange(5), (2, 1)))


def test_wrong_rank_raises():
  with pytest.raises(ValueError, match='q_seg_BL'):
    segment_mask(jnp.ones((2, 3, 1)), jnp.ones((2, 3)))
  with pytest.raises(ValueError, match='valid_BS'):
    key_padding_mask(jnp.ones((3,), bool))
