"""tx.ops.losses: cross-entropy against its definition and optax, weighting, accuracy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tx import ops

# Jitted: one compile per call signature instead of one per primitive (fast suite).
softmax_cross_entropy = jax.jit(ops.softmax_cross_entropy,
                                static_argnames=('label_smoothing', 'z_loss'))
weighted_mean = jax.jit(ops.weighted_mean)
token_accuracy = jax.jit(ops.token_accuracy)

B, L, V = 2, 3, 7


def _logits_labels(seed=0):
  rng = np.random.default_rng(seed)
  logits = jnp.asarray(rng.standard_normal((B, L, V), np.float32) * 3)
  labels = jnp.asarray(rng.integers(0, V, (B, L)), jnp.int32)
  return logits, labels


def test_cross_entropy_is_negative_log_softmax_at_label():
  logits, labels = _logits_labels()
  loss, z = softmax_cross_entropy(logits, labels)
  assert loss.shape == (B, L) and loss.dtype == jnp.float32
  x = np.asarray(logits, np.float64)
  log_p = x - np.log(np.exp(x).sum(-1, keepdims=True))
  expected = -np.take_along_axis(log_p, np.asarray(labels)[..., None], -1)[..., 0]
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_array_equal(z, 0.0)


def test_label_smoothing_matches_optax():
  logits, labels = _logits_labels(1)
  alpha = 0.1
  loss, _ = softmax_cross_entropy(logits, labels, label_smoothing=alpha)
  targets = optax.smooth_labels(jax.nn.one_hot(labels, V), alpha)
  np.testing.assert_allclose(loss, optax.softmax_cross_entropy(logits, targets), rtol=1e-5)
  plain, _ = softmax_cross_entropy(logits, labels)
  assert not np.allclose(loss, plain, rtol=1e-3)


def test_z_loss_adds_z_times_logsumexp_squared():
  logits, labels = _logits_labels(2)
  plain, _ = softmax_cross_entropy(logits, labels)
  loss, z_term = softmax_cross_entropy(logits, labels, z_loss=1e-2)
  lse = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))
  np.testing.assert_allclose(z_term, 1e-2 * lse ** 2, rtol=1e-5)
  np.testing.assert_allclose(loss - plain, z_term, rtol=1e-5, atol=1e-7)


def test_bf16_logits_give_float32_loss():
  logits, labels = _logits_labels(3)
  loss16, z16 = softmax_cross_entropy(logits.astype(jnp.bfloat16), labels, z_loss=1e-4)
  assert loss16.dtype == jnp.float32 and z16.dtype == jnp.float32
  loss32, _ = softmax_cross_entropy(logits.astype(jnp.bfloat16).astype(jnp.float32), labels,
                                    z_loss=1e-4)
  np.testing.assert_allclose(loss16, loss32, rtol=1e-6)


def test_weighted_mean_ignores_padding():
  values = jnp.array([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]])
  weights = jnp.array([[1, 1, 0], [1, 0, 1]])
  assert weighted_mean(values, weights) == pytest.approx(2.5)
  changed = values.at[0, 2].set(1e6).at[1, 1].set(-1e6)
  assert weighted_mean(changed, weights) == weighted_mean(values, weights)
  assert weighted_mean(values) == pytest.approx(float(np.mean(values)))
  empty = weighted_mean(values, jnp.zeros_like(values))
  assert empty == 0.0 and empty.dtype == jnp.float32


def test_token_accuracy_counts_weighted_hits():
  logits = jnp.zeros((1, 4, 3)).at[0, jnp.arange(4), jnp.array([0, 1, 2, 0])].set(1.0)
  labels = jnp.array([[0, 1, 0, 2]])  # hits, hit, miss, miss
  correct, total = token_accuracy(logits, labels)
  assert (float(correct), float(total)) == (2.0, 4.0)
  correct, total = token_accuracy(logits, labels, jnp.array([[1, 0, 1, 0]]))
  assert (float(correct), float(total)) == (1.0, 2.0)
  assert correct.dtype == jnp.float32 and total.dtype == jnp.float32


def test_shape_and_range_errors():
  logits, labels = _logits_labels()
  with pytest.raises(ValueError, match='labels_BL'):
    softmax_cross_entropy(logits, labels[:, :2])
  with pytest.raises(ValueError, match='label_smoothing'):
    softmax_cross_entropy(logits, labels, label_smoothing=1.0)
