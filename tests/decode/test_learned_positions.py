"""Learned positions past model.max_len: generate_lm slides a window of the last max_len
tokens (nanoGPT's crop), beam search refuses, other position schemes keep the cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.decode.beam import beam_search_lm
from tx.decode.generate import generate_lm
from tx.decode.learned_positions import needs_crop

WIDTH = 8  # model.max_len
MAX_NEW = 10  # prompt 5 + 10 new: the last 6 steps need the window to slide


def test_needs_window_only_past_a_learned_table(dm):
  learned = dm.tiny('decoder', position='learned', max_len=WIDTH)
  assert not needs_crop(learned, 5, 4)  # the last logits read sit at position 7
  assert needs_crop(learned, 5, 5)
  for position in ('sinusoidal', 'rope', 'alibi', 'none'):
    assert not needs_crop(learned.replace(position=position), 5, 50)


@pytest.mark.parametrize('explicit', [False, True], ids=['pad_masked', 'prompt_valid'])
def test_window_decoding_equals_cropping_and_recomputing(dm, explicit):
  """Every step's logits equal one forward pass over that row's last WIDTH tokens (its
  real prompt tokens, then what it generated), positions 0, 1, ... from the window's
  start; tokens are their argmax (PAD excluded unless pad_id=-1). Row 0 has 3 real
  prompt tokens, row 1 5. prompt_valid (GPT-2-style vocabularies, where id 0 is a real
  token): row 0's middle prompt token is a real id 0 and must stay in the window."""
  cfg = dm.tiny('decoder', position='learned', max_len=WIDTH)
  params = dm.params(cfg)
  prompt, kw = dm.PROMPT, {}
  if explicit:
    kw = dict(prompt_valid=dm.PROMPT != 0, pad_id=-1)
    prompt = dm.PROMPT.at[0, 3].set(0)  # a real token with id 0
  tokens, logits = dm.quick_jit(lambda p, x: generate_lm(
      cfg, p, x, jax.random.key(0), max_new=MAX_NEW, eos_id=-1,
      return_logits=True, **kw))(params, prompt)
  tokens, logits = np.asarray(tokens), np.asarray(logits)

  windows, last = [], []
  for row, (ids, real_ids) in enumerate(zip(np.asarray(prompt).tolist(),
                                             np.asarray(dm.PROMPT != 0).tolist())):
    seq = [t for t, r in zip(ids, real_ids) if r]
    for t in range(MAX_NEW):
      window = seq[-WIDTH:]
      windows.append(window + [0] * (WIDTH - len(window)))  # right pads: causal, unseen
      last.append(len(window) - 1)
      seq.append(int(tokens[row, t]))
  model = tx.build_model(cfg)
  batch = jnp.asarray(windows, jnp.int32)
  real = jnp.arange(WIDTH)[None] <= jnp.asarray(last)[:, None]
  segments = real.astype(jnp.int32) if explicit else None
  full = dm.quick_jit(lambda p, x, seg: model.apply(
      {'params': p}, x, positions=jnp.broadcast_to(jnp.arange(WIDTH), x.shape),
      segment_ids=seg))(params, batch, segments)
  expected = np.asarray(full)[np.arange(len(last)), last].reshape(2, MAX_NEW, -1)
  np.testing.assert_allclose(logits, expected, atol=2e-5)
  if not explicit:
    expected[..., 0] = -np.inf  # PAD is never chosen
  np.testing.assert_array_equal(tokens, np.argmax(expected, axis=-1))


def test_beam_search_past_learned_positions_is_a_config_error(dm):
  cfg = dm.tiny('decoder', position='learned', max_len=WIDTH)
  with pytest.raises(tx.ConfigError, match='lower decode.max_len'):
    beam_search_lm(cfg, dm.params(cfg), dm.PROMPT, beams=2, max_len=MAX_NEW)
