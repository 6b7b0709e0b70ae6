"""Beam search on crafted, model-free step functions: the length penalty, the best
penalised finished hypothesis against brute force, EOS / padding, beam reordering."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.decode.beam import gather_beams, length_penalty, search

EOS = 2
NEG = -1e9


def _lp(n, alpha):
  return ((5.0 + n) / 6.0) ** alpha


def test_length_penalty_formula():
  np.testing.assert_allclose(length_penalty(jnp.arange(1, 4), 0.6),
                             [((5 + n) / 6) ** 0.6 for n in (1, 2, 3)], rtol=1e-6)
  assert float(length_penalty(7, 0.0)) == 1.0


@functools.partial(jax.jit, static_argnames=('beams', 'max_len'))
def _table_search(table_TV, alpha, *, beams, max_len):
  """Search where the log-probs of step t are table[t] whatever the history (1 row)."""
  step_fn = lambda cache, tok, t: (jnp.broadcast_to(table_TV[t + 1], (beams, table_TV.shape[1])),
                                   cache)
  first = jnp.broadcast_to(table_TV[0], (beams, table_TV.shape[1]))
  return search(step_fn, (), first, 1, beams, max_len=max_len, alpha=alpha)


def _timed_search(logp_TV, *, beams, alpha, max_len):
  tokens, scores = _table_search(jnp.asarray(logp_TV, jnp.float32), jnp.float32(alpha),
                                 beams=beams, max_len=max_len)
  return np.asarray(tokens)[0].tolist(), float(scores[0])


def _log_table(rows, vocab=8):
  """Per-step log-probs from {token: prob} dicts (the rest gets ~0 probability)."""
  out = np.full((len(rows), vocab), -30.0)
  for t, probs in enumerate(rows):
    for tok, p in probs.items():
      out[t, tok] = np.log(p)
  return out


@pytest.mark.parametrize('alpha,expected', [(0.0, [EOS, 0, 0]), (1.0, [EOS, 0, 0]),
                                            (3.0, [3, 3, EOS])])
def test_length_penalty_picks_the_best_penalised_finished_hypothesis(alpha, expected):
  """EOS now: log .4; 'a EOS': log .6 + log .5; 'a a EOS': log .6 + log .5 + log .9.
  alpha 0 and 1 prefer the short one, alpha 3 the long one (penalised -0.552)."""
  table = _log_table([{EOS: 0.4, 3: 0.6}, {EOS: 0.5, 3: 0.5}, {EOS: 0.9, 3: 0.1}, {EOS: 1.0}])
  tokens, score = _timed_search(table, beams=2, alpha=alpha, max_len=3)
  assert tokens == expected
  n = expected.index(EOS) + 1
  np.testing.assert_allclose(score, table[np.arange(n), expected[:n]].sum() / _lp(n, alpha),
                             rtol=1e-5)


def test_no_finished_hypothesis_returns_the_best_alive_beam():
  """EOS (~e-30) never makes the 2K = 2 best candidates of the single beam."""
  table = _log_table([{3: 0.4, 4: 0.3, 5: 0.2, 6: 0.1}] * 4)
  tokens, score = _timed_search(table, beams=1, alpha=0.6, max_len=3)
  assert tokens == [3, 3, 3]
  np.testing.assert_allclose(score, 3 * np.log(0.4) / _lp(3, 0.6), rtol=1e-5)


class _HashModel:
  """A model-free LM over tokens {EOS, 3, 4} whose next-token distribution depends on the
  whole history through a hash kept in the cache (so a wrongly reordered cache changes
  the result). Rows of the batch have different tables."""
  STATES, VOCAB = 13, 17

  def __init__(self, seed, batch):
    rng = np.random.default_rng(seed)
    logits = np.full((batch, self.STATES, self.VOCAB), -40.0)
    logits[..., [EOS, 3, 4]] = rng.normal(0, 1.5, (batch, self.STATES, 3))
    logits[..., EOS] -= 1.0  # longer hypotheses win more often
    self.logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))

  def brute_force(self, row, max_len, alpha):
    """The best (sequence, penalised score) over every hypothesis ending in EOS."""
    logp = self.logp[row]
    best = (None, -np.inf)
    for n in range(1, max_len + 1):
      for prefix in itertools.product((3, 4), repeat=n - 1):
        seq, state, total = list(prefix) + [EOS], 0, 0.0
        for tok in seq:
          total += logp[state, tok]
          state = (state * 5 + tok) % self.STATES
        if total / _lp(n, alpha) > best[1]:
          best = (seq + [0] * (max_len - n), total / _lp(n, alpha))
    return best


@functools.partial(jax.jit, static_argnames=('beams', 'max_len'))
def _hash_search(logp_BSV, alpha, *, beams, max_len):
  batch = logp_BSV.shape[0]
  rows = jnp.repeat(jnp.arange(batch), beams)

  def step(state, tok_N1, t):
    state = (state * 5 + tok_N1[:, 0]) % _HashModel.STATES
    return logp_BSV[rows, state], state

  state = jnp.zeros_like(rows)
  return search(step, state, logp_BSV[rows, state], batch, beams, max_len=max_len, alpha=alpha)


@pytest.mark.parametrize('seed,alpha', [(0, 0.0), (1, 0.6), (2, 1.5), (3, 0.6)])
def test_wide_beam_finds_the_brute_force_optimum(seed, alpha):
  """8 beams keep every prefix over {3, 4} up to length 3: exhaustive for max_len 4."""
  batch, max_len = 2, 4
  model = _HashModel(seed, batch)
  tokens, scores = _hash_search(jnp.asarray(model.logp), jnp.float32(alpha), beams=8,
                                max_len=max_len)
  for r in range(batch):
    seq, score = model.brute_force(r, max_len, alpha)
    assert np.asarray(tokens[r]).tolist() == seq
    np.testing.assert_allclose(float(scores[r]), score, rtol=1e-5)


def test_too_small_vocabulary_is_a_clear_error():
  with pytest.raises(ValueError, match='decode.beam_size'):
    search(lambda c, t, s: (None, c), (), jnp.zeros((4, 6)), 1, 4, max_len=2, alpha=0.6)


def test_gather_beams_reorders_within_rows_and_respects_scanned_layout():
  batch, beams = 2, 3
  ids = jnp.arange(batch * beams)
  cache = {'index': jnp.asarray(5),
           'layer_0': {'cached_key': ids[:, None] * jnp.ones((1, 4)),
                       'cross_key': ids[:, None] * jnp.ones((1, 4))},
           'layers': {'cached_key': jnp.stack([ids, ids + 100])},  # [layers, B*K]
           'layer_1': {'cached_value': jnp.repeat(ids, 2)[:, None]}}  # 2 kv heads per row
  out = gather_beams(cache, jnp.array([[2, 2, 0], [1, 0, 0]]), batch, beams)
  want = [2, 2, 0, 4, 3, 3]
  np.testing.assert_array_equal(out['layer_1']['cached_value'][:, 0], np.repeat(want, 2))
  assert int(out['index']) == 5
  np.testing.assert_array_equal(out['layer_0']['cached_key'][:, 0], want)
  np.testing.assert_array_equal(out['layers']['cached_key'], [want, [w + 100 for w in want]])
  np.testing.assert_array_equal(out['layer_0']['cross_key'][:, 0], ids)  # shared: untouched
