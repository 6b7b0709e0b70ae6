"""tx.ops.positions: formulas, invariances and reference values."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx import ops
from tx.ops import alibi_slopes

# Jitted: one compile per call signature instead of one per primitive (fast suite).
sinusoidal_table = jax.jit(ops.sinusoidal_table, static_argnames=('length', 'dim', 'base', 'dtype'))
sinusoidal_embedding = jax.jit(ops.sinusoidal_embedding, static_argnames=('dim', 'base', 'dtype'))
apply_rope = jax.jit(ops.apply_rope, static_argnames=('theta', 'fraction'))
alibi_bias = jax.jit(ops.alibi_bias, static_argnames=('num_heads', 'causal'))
_T5_STATIC = ('bidirectional', 'num_buckets', 'max_distance')
t5_relative_position_bucket = jax.jit(ops.t5_relative_position_bucket, static_argnames=_T5_STATIC)
t5_relative_bias = jax.jit(ops.t5_relative_bias, static_argnames=_T5_STATIC)


# ----------------------------------------------------------------- sinusoidal

def test_sinusoidal_table_matches_formula():
  length, dim = 50, 16
  table = np.asarray(sinusoidal_table(length, dim))
  assert table.shape == (length, dim)
  for pos in range(length):
    for i in range(dim // 2):
      angle = pos / 10000.0 ** (2 * i / dim)
      assert abs(table[pos, 2 * i] - math.sin(angle)) < 1e-5
      assert abs(table[pos, 2 * i + 1] - math.cos(angle)) < 1e-5


def test_sinusoidal_embedding_equals_table_rows():
  table = sinusoidal_table(20, 8)
  np.testing.assert_allclose(sinusoidal_embedding(jnp.arange(20)[None], 8)[0], table, atol=1e-6)
  pos = jnp.array([[3, 4, 5], [0, 1, 0]])  # cached decoding / packed rows
  np.testing.assert_allclose(sinusoidal_embedding(pos, 8), np.asarray(table)[np.asarray(pos)],
                             atol=1e-6)
  assert sinusoidal_embedding(pos, 8, dtype=jnp.bfloat16).dtype == jnp.bfloat16


# ----------------------------------------------------------------------- RoPE

def _rand(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32))


def _scores(q, k):
  return jnp.einsum('blhd,bshd->bhls', q, k)


@pytest.mark.parametrize('fraction', [1.0, 0.5])
def test_rope_scores_depend_only_on_relative_offset(fraction):
  q, k = _rand((1, 5, 2, 8), 0), _rand((1, 5, 2, 8), 1)
  pos = jnp.arange(5)[None]
  base = _scores(apply_rope(q, pos, fraction=fraction), apply_rope(k, pos, fraction=fraction))
  shifted = _scores(apply_rope(q, pos + 37, fraction=fraction),
                    apply_rope(k, pos + 37, fraction=fraction))
  np.testing.assert_allclose(base, shifted, atol=1e-4)
  # ...but the rotation does change the scores.
  assert not np.allclose(base, _scores(q, k), atol=1e-3)


def test_rope_matches_complex_rotation_and_preserves_norm():
  x = _rand((2, 3, 2, 8))
  pos = jnp.array([[0, 1, 7], [2, 100, 5]])
  out = np.asarray(apply_rope(x, pos, theta=10000.0))
  # rotate_half pairs dim i with dim i + D/2 and rotates the pair by pos * theta^(-2i/D).
  xn = np.asarray(x, np.float64)
  z = (xn[..., :4] + 1j * xn[..., 4:]) * np.exp(
      1j * np.asarray(pos)[:, :, None, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8))
  np.testing.assert_allclose(out, np.concatenate([z.real, z.imag], -1), atol=1e-4)
  np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(xn, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(out[0, 0], xn[0, 0], atol=1e-6)  # position 0 is the identity


def test_rope_partial_leaves_tail_untouched_and_keeps_dtype():
  x = _rand((1, 4, 2, 8)).astype(jnp.bfloat16)
  out = apply_rope(x, jnp.arange(4)[None] + 3, fraction=0.5)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(out[..., 4:], x[..., 4:])
  assert not np.array_equal(out[..., :4], x[..., :4])


def test_rope_odd_rotary_dims_raise():
  pos = jnp.arange(3)[None]
  with pytest.raises(ValueError, match='fraction'):
    apply_rope(jnp.ones((1, 3, 1, 6)), pos, fraction=0.5)  # rot = 3
  with pytest.raises(ValueError, match='fraction'):
    apply_rope(jnp.ones((1, 3, 1, 5)), pos)


# ---------------------------------------------------------------------- ALiBi

def test_alibi_slopes_powers_of_two_and_reference_12_heads():
  s8 = np.asarray(alibi_slopes(8))
  assert s8.dtype == np.float32
  np.testing.assert_allclose(s8, [2.0 ** -i for i in range(1, 9)], rtol=1e-6)
  # Not a power of two: 8-head slopes, then every other slope of the 16-head sequence.
  expected12 = [2.0 ** -i for i in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5,
                                                    2.0 ** -3.5]
  np.testing.assert_allclose(alibi_slopes(12), expected12, rtol=1e-6)
  # 6 heads: 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3 from the 8-head sequence.
  np.testing.assert_allclose(alibi_slopes(6), [2.0 ** -e for e in (2, 4, 6, 8, 1, 3)], rtol=1e-6)
  with pytest.raises(ValueError, match='num_heads'):
    alibi_slopes(0)


def test_alibi_bias_causal_and_bidirectional_values():
  pos = jnp.arange(3)[None]
  slopes = np.asarray(alibi_slopes(2))  # [2^-4, 2^-8]
  rel = np.array([[0, 1, 2], [-1, 0, 1], [-2, -1, 0]], np.float32)  # k - q
  causal = alibi_bias(2, pos, pos, causal=True)
  assert causal.shape == (1, 2, 3, 3) and causal.dtype == jnp.float32
  np.testing.assert_allclose(causal[0, 0], slopes[0] * rel)
  assert causal[0, 0, 2, 0] == -2 / 16
  bidir = alibi_bias(2, pos, pos, causal=False)
  np.testing.assert_allclose(bidir[0, 1], -slopes[1] * np.abs(rel))
  np.testing.assert_allclose(bidir[0, 0], bidir[0, 0].T)  # symmetric


# ------------------------------------------------------------------------- T5

def test_t5_buckets_match_reference_vectors():
  rel = jnp.array([-1, -16, 1, 16, 500, 0])
  np.testing.assert_array_equal(t5_relative_position_bucket(rel), [1, 10, 17, 26, 31, 0])
  causal = t5_relative_position_bucket(jnp.array([-32, 0, 1, 5, 1000]), bidirectional=False)
  np.testing.assert_array_equal(causal, [21, 0, 0, 0, 0])
  assert t5_relative_position_bucket(rel).dtype == jnp.int32


def test_t5_buckets_monotone_in_distance_and_in_range():
  d = jnp.arange(0, 400)
  for bidirectional in (True, False):
    past = np.asarray(t5_relative_position_bucket(-d, bidirectional))
    assert np.all(np.diff(past) >= 0) and past.min() >= 0 and past.max() <= 31
  future = np.asarray(t5_relative_position_bucket(d, True))
  assert np.all(np.diff(future[1:]) >= 0) and future[1] == 17 and future.max() == 31


def test_t5_bucket_of_zero_has_no_log_zero():
  with warnings.catch_warnings(), jax.debug_infs(True), jax.debug_nans(True):
    warnings.simplefilter('error')
    # Eager on purpose: debug_infs then checks every intermediate, the log included.
    out = ops.t5_relative_position_bucket(jnp.zeros((2, 3), jnp.int32))
    out_causal = ops.t5_relative_position_bucket(jnp.zeros((2, 3), jnp.int32), bidirectional=False)
  np.testing.assert_array_equal(out, 0)
  np.testing.assert_array_equal(out_causal, 0)


def test_t5_relative_bias_gathers_table_heads_first():
  H = 3
  table = _rand((32, H))
  q_pos, k_pos = jnp.array([[0, 1, 2, 3]]), jnp.array([[0, 1, 2, 3, 40]])
  bias = np.asarray(t5_relative_bias(table, q_pos, k_pos))
  assert bias.shape == (1, H, 4, 5)
  buckets = np.asarray(t5_relative_position_bucket(k_pos[:, None, :] - q_pos[:, :, None]))
  for h in range(H):
    np.testing.assert_array_equal(bias[0, h], np.asarray(table)[buckets[0], h])
  with pytest.raises(ValueError, match='table_NH'):
    t5_relative_bias(_rand((16, H)), q_pos, k_pos)
