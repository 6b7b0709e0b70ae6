"""Greedy and sampled generation: EOS and padding per sequence, reproducible sampling,
and the strategies that must reduce to greedy (top-k 1, a tiny top-p, beam size 1)."""

import jax
import jax.numpy as jnp
import numpy as np

from tx.decode.beam import beam_search_lm
from tx.decode.generate import decode_loop, generate_lm
from tx.decode.texts import output_ids, prompt_rows

EOS = 2
MAX_NEW = 6


def _cfg(dm):
  return dm.tiny('decoder', position='none')


_PROGRAM = {}


def _strategies(dm):
  """One compiled program: (greedy, top-k 1 sample, sample with top_p, beam 1 without a
  length penalty) of the prompts, for params, rng and top_p given at run time."""
  cfg = _cfg(dm)
  if cfg not in _PROGRAM:
    def run(params, rng, top_p):
      gen = lambda **kw: generate_lm(cfg, params, dm.PROMPT, rng, max_new=MAX_NEW, **kw)
      beam, _ = beam_search_lm(cfg, params, dm.PROMPT, beams=1, max_len=MAX_NEW, alpha=0.0)
      return (gen(), gen(strategy='sample', top_k=1), gen(strategy='sample', top_p=top_p), beam)
    _PROGRAM[cfg] = dm.quick_jit(run)
  return _PROGRAM[cfg]


def _check_eos_then_pad(tokens):
  for row in np.asarray(tokens).tolist():
    if EOS in row:
      assert all(t == 0 for t in row[row.index(EOS) + 1:]), row
    assert 0 not in row[:row.index(EOS) if EOS in row else len(row)], row  # PAD never chosen


def test_decode_loop_stops_each_row_at_its_eos_and_pads_after():
  """A crafted step function: row r emits EOS at step stop[r], token 5 before."""
  stop = jnp.array([1, 3, 0])
  vocab = 8

  def logits_at(t):  # t: the step whose token these logits choose
    winner = jnp.where(t == stop, EOS, 5)
    return jax.nn.one_hot(winner, vocab) * 10.0

  def step_fn(cache, tokens_B1, positions_B1):
    t = positions_B1[:, 0] - 10 + 1  # fed at position 10 + t: returns step t + 1's logits
    return logits_at(t), cache

  tokens = jax.jit(lambda: decode_loop(step_fn, (), logits_at(jnp.zeros(3, jnp.int32)),
                                       jnp.full((3,), 10), jax.random.key(0), max_new=6))()
  np.testing.assert_array_equal(tokens, [[5, EOS, 0, 0, 0, 0],
                                         [5, 5, 5, EOS, 0, 0],
                                         [EOS, 0, 0, 0, 0, 0]])


def test_decode_loop_exits_once_every_row_is_finished():
  """The loop runs as many steps as the slowest row needs, not max_new."""
  vocab = 8
  eos_logits = jax.nn.one_hot(jnp.full((2,), EOS), vocab) * 10.0
  tokens, logits = jax.jit(lambda: decode_loop(
      lambda cache, tok, pos: (eos_logits, cache), (), eos_logits, jnp.zeros(2, jnp.int32),
      jax.random.key(0), max_new=50, return_logits=True))()
  np.testing.assert_array_equal(tokens[:, 0], [EOS, EOS])
  assert not np.asarray(tokens[:, 1:]).any()
  assert not np.asarray(logits[:, 1:]).any()  # nothing decoded after step 0


def test_forced_eos_from_crafted_params(dm):
  """Final norm scale 0 and bias = 10 * E[EOS]: every position's argmax is EOS."""
  cfg = _cfg(dm)
  params = jax.tree_util.tree_map(lambda x: x, dm.params(cfg))
  table = params['embed']['embedding']
  table = table.at[EOS].set(table[EOS] / jnp.linalg.norm(table[EOS]) * 3.0)
  params['embed']['embedding'] = table
  norm = params['decoder']['stack']['final_norm']
  norm['scale'] = jnp.zeros_like(norm['scale'])
  norm['bias'] = 10.0 * table[EOS]
  outputs = _strategies(dm)(params, jax.random.key(0), 1.0)
  for tokens in outputs[:2] + outputs[3:]:  # all but the unfiltered sample
    np.testing.assert_array_equal(tokens, [[EOS] + [0] * (MAX_NEW - 1)] * 2)


def test_greedy_equals_top_k_1_tiny_top_p_and_beam_1(dm):
  params = dm.params(_cfg(dm))
  for seed in range(2):
    greedy, top_k, top_p, beam = _strategies(dm)(params, jax.random.key(seed), 1e-6)
    _check_eos_then_pad(greedy)
    np.testing.assert_array_equal(top_k, greedy)
    np.testing.assert_array_equal(top_p, greedy)
    np.testing.assert_array_equal(beam, greedy)


def test_sampling_is_reproducible_per_seed_and_differs_across_seeds(dm):
  params = dm.params(_cfg(dm))
  sample = lambda seed: np.asarray(_strategies(dm)(params, jax.random.key(seed), 1.0)[2])
  first = sample(0)
  np.testing.assert_array_equal(sample(0), first)
  others = [sample(s) for s in range(1, 4)]
  assert any(not np.array_equal(o, first) for o in others)
  for o in [first] + others:
    _check_eos_then_pad(o)


def test_prompt_rows_and_output_ids():
  class Chars:
    def encode(self, text):
      return [ord(c) - 90 for c in text]
  rows = prompt_rows(Chars(), ['ab', '', 'abcd'], start_id=EOS)
  np.testing.assert_array_equal(rows, [[0, 0, 7, 8], [0, 0, 0, EOS], [7, 8, 9, 10]])
  assert output_ids([5, 0, 6, EOS, 7, 0]) == [5, 6]
