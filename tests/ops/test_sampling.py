"""top-k, top-p (nucleus) and sampling: exact sets on crafted distributions, ties,
p on a boundary, reproducibility, and sample frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.ops import sampling
from tx.ops.sampling import NEG_INF

# Jitted (one compile per shape): op by op, sorting and sampling dispatch slowly on CPU.
sample_logits = jax.jit(sampling.sample_logits, static_argnames=('top_k', 'greedy'))
top_k_filter = jax.jit(sampling.top_k_filter, static_argnames='k')
top_p_filter = jax.jit(sampling.top_p_filter)


def _kept(filtered):
  return [np.flatnonzero(np.asarray(row) > NEG_INF / 2).tolist() for row in filtered]


def _logits(*rows):
  """Logits whose softmax is each row of probabilities (0 -> impossible)."""
  p = np.asarray(rows, np.float64)
  return jnp.asarray(np.where(p > 0, np.log(np.maximum(p, 1e-300)), -1e4), jnp.float32)


def test_top_k_keeps_exactly_k_with_ties_to_the_lower_id():
  logits = jnp.array([[1.0, 3.0, 3.0, 0.0, 3.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
  assert _kept(top_k_filter(logits, 2)) == [[1, 2], [0, 1]]
  assert _kept(top_k_filter(logits, 1)) == [[1], [0]]
  np.testing.assert_array_equal(top_k_filter(logits, 0), logits)  # 0 = off
  np.testing.assert_array_equal(top_k_filter(logits, 5), logits)
  kept = top_k_filter(logits, 2)
  np.testing.assert_array_equal(kept[0, 1:3], logits[0, 1:3])  # kept values unchanged


@pytest.mark.parametrize('p,expected', [
    (0.05, [3]),           # the most likely token always stays
    (0.5, [3]),            # 0.5 reaches 0.5 exactly: the set stops there
    (0.6, [3, 0]),         # 0.5 < 0.6 <= 0.8: the crossing token is kept
    (0.8, [3, 0]),         # 0.5 + 0.3 reaches 0.8 exactly
    (0.81, [3, 0, 1]),
    (1.0, [0, 1, 2, 3]),
])
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
  logits = _logits([0.3, 0.125, 0.075, 0.5])  # sorted: id 3 (.5), 0 (.3), 1 (.125), 2 (.075)
  assert sorted(_kept(top_p_filter(logits, p))[0]) == sorted(expected)


def test_top_p_with_ties_keeps_a_minimal_set_lower_ids_first():
  logits = _logits([0.2, 0.4, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25])
  assert _kept(top_p_filter(logits, 0.6)) == [[0, 1], [0, 1, 2]]
  assert _kept(top_p_filter(logits, 0.5)) == [[0, 1], [0, 1]]


def test_top_p_with_a_python_p_equals_a_traced_p():
  logits = _logits([0.3, 0.125, 0.075, 0.5])
  for p in (0.5, 0.6, 0.81, 1.0):
    np.testing.assert_array_equal(sampling.top_p_filter(logits, p), top_p_filter(logits, p))


def test_top_k_1_and_tiny_top_p_sample_the_argmax():
  logits = jax.random.normal(jax.random.key(0), (64, 50))
  logits = logits.at[0, 7].set(logits[0].max())  # a tie at the top: argmax takes the lower id
  greedy = sample_logits(None, logits, greedy=True)
  for seed in range(2):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(sample_logits(key, logits, top_k=1), greedy)
    np.testing.assert_array_equal(sample_logits(key, logits, top_p=1e-6), greedy)
    cold = sample_logits(key, logits, temperature=1e-4)  # a tie stays a coin flip here
    np.testing.assert_array_equal(cold[1:], greedy[1:])


def test_sampling_is_reproducible_and_seed_dependent():
  logits = jnp.zeros((256, 10))
  a = sample_logits(jax.random.key(1), logits)
  np.testing.assert_array_equal(a, sample_logits(jax.random.key(1), logits))
  assert not np.array_equal(a, sample_logits(jax.random.key(2), logits))


def test_sample_frequencies_follow_the_filtered_distribution():
  """top-k 3 over [.4, .25, .2, .1, .05] keeps [.4, .25, .2] / .85 = [.47, .29, .24]; top-p
  0.7 of that keeps the first two (.47 < .7 <= .76): renormalised [.4, .25] / .65."""
  n = 20000
  logits = jnp.broadcast_to(_logits([0.4, 0.25, 0.2, 0.1, 0.05]), (n, 5))
  draws = np.asarray(sample_logits(jax.random.key(0), logits, top_k=3, top_p=0.7))
  freq = np.bincount(draws, minlength=5) / n
  np.testing.assert_allclose(freq, [0.4 / 0.65, 0.25 / 0.65, 0, 0, 0], atol=0.015)
  hot = np.asarray(sample_logits(jax.random.key(0), logits, temperature=0.5))
  want = np.array([0.4, 0.25, 0.2, 0.1, 0.05]) ** 2
  np.testing.assert_allclose(np.bincount(hot, minlength=5) / n, want / want.sum(), atol=0.015)
