"""Decoding with sliding-window layers: a local layer's cache is a ring of min(W, S) slots,
and cached generation far past the window (W = 4, 20 new tokens, a 5-token prompt, so
also a prefill longer than the window) gives the logits of one full forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.decode.beam import beam_search_lm
from tx.decode.generate import generate_lm, generate_seq2seq
from tx.decode.steps import empty_cache, prompt_positions

ATOL = 1e-5
MAX_NEW = 20
CASES = [
    dict(num_layers=2, position='rope'),  # every layer local
    dict(num_layers=2, position='alibi', scan_layers=True),  # local bias over ring positions
    dict(num_layers=2, position='t5', attention_pattern='local,global'),  # Gemma-2 pattern
    dict(num_layers=4, position='rope', attention_pattern='local,global', scan_layers=True,
         num_kv_heads=1),  # 2 scanned groups of (local, global), MQA
]


def _windowed(dm, family='decoder', window=4, **kw):
  return dm.tiny(family, attention_window=window, **kw)


def _reference(cfg, params, inputs, tokens_BT):
  """Logits [B, T, V] predicting tokens[:, t] from ONE forward pass without a cache."""
  model = tx.build_model(cfg)
  if cfg.family == 'decoder':
    p = inputs.shape[1]
    seq = jnp.concatenate([inputs, tokens_BT[:, :-1]], axis=1)
    lengths = jnp.sum(inputs != 0, axis=1)
    new_pos = lengths[:, None] + jnp.arange(tokens_BT.shape[1] - 1)
    positions = jnp.concatenate([prompt_positions(inputs), new_pos], axis=1)
    return model.apply({'params': params}, seq, positions=positions)[:, p - 1:]
  bos = jnp.ones((tokens_BT.shape[0], 1), jnp.int32)
  return model.apply({'params': params}, inputs, jnp.concatenate([bos, tokens_BT[:, :-1]], 1))


def _check(dm, cfg, cache_segments=None):
  generate = generate_lm if cfg.family == 'decoder' else generate_seq2seq

  def run(params, inputs):
    tokens, logits = generate(cfg, params, inputs, jax.random.key(0), max_new=MAX_NEW,
                              eos_id=-1, return_logits=True, cache_segments=cache_segments)
    return tokens, logits, _reference(cfg, params, inputs, tokens)
  tokens, logits, ref = dm.quick_jit(run)(dm.params(cfg), dm.inputs(cfg))
  np.testing.assert_allclose(logits, ref, atol=ATOL)
  np.testing.assert_array_equal(tokens, jnp.argmax(ref.at[..., 0].set(-jnp.inf), axis=-1))


@pytest.mark.parametrize('extra', CASES, ids=lambda d: '-'.join(f'{k}={v}' for k, v in d.items()))
def test_cached_decoding_past_the_window_equals_full_forward(dm, extra):
  """Row 0 of the prompts is left-padded (its positions start after the pads)."""
  _check(dm, _windowed(dm, **extra))


def test_ring_grown_in_segments_then_wrapping(dm):
  """W = 12, 4 cache segments of 10, 15, 20, 25 slots: the ring has 10 slots, is padded
  to 12 (nothing wrapped yet), then wraps; the global layer's cache grows as usual."""
  _check(dm, _windowed(dm, window=12, num_layers=2, position='rope',
                       attention_pattern='local,global'), cache_segments=4)


def test_encoder_decoder_with_local_layers(dm):
  """Local layers in both towers (the encoder's window is two-sided); cross-attention
  is never windowed."""
  _check(dm, _windowed(dm, 'encoder_decoder', window=2, num_layers=2, position='rope',
                       attention_pattern='local,global'))


def _leaf_shapes(cfg, length):
  model = tx.build_model(cfg, decode=True)
  cache = jax.eval_shape(lambda: empty_cache(model, jnp.zeros((2, length), jnp.int32)))
  return {jax.tree_util.keystr(p): s.shape
          for p, s in jax.tree_util.tree_leaves_with_path(cache)}


@pytest.mark.parametrize('length', [40, 4000])
def test_local_cache_has_window_slots_whatever_the_length(dm, length):
  """Memory O(window): a local layer's keys/values and the ring's validity/positions
  have W = 4 slots; only the global layer's grow with the decode length; a model of
  local layers only keeps nothing of the decode length at all."""
  mixed = _leaf_shapes(_windowed(dm, num_layers=2, attention_pattern='local,global'), length)
  b, k, d = 2, 2, 8  # self-attention caches are [B*K, slots, D]
  assert mixed["['decoder']['stack']['layer_0']['self_attention']['cached_key']"] == (b * k, 4, d)
  assert mixed["['decoder']['stack']['layer_1']['self_attention']['cached_key']"] == (
      b * k, length, d)
  assert mixed["['decoder']['ring_valid']"] == mixed["['decoder']['ring_positions']"] == (b, 4)
  assert mixed["['decoder']['key_valid']"] == (b, length)
  local = _leaf_shapes(_windowed(dm, num_layers=2, scan_layers=True), length)
  assert local["['decoder']['stack']['layers']['self_attention']['cached_value']"] == (
      2, b * k, 4, d)
  assert all(length not in shape for shape in local.values())
  short = _leaf_shapes(_windowed(dm, window=64, num_layers=1), 10)  # R = min(W, S)
  assert short["['decoder']['stack']['layer_0']['self_attention']['cached_key']"] == (b * k, 10, d)


def test_beam_search_with_local_layers(dm):
  """Beam 1 (no length penalty) is greedy; 3 beams reorder the ring caches (scanned
  layout too) and pick the same hypotheses whether the cache grows in segments or not."""
  cfg = _windowed(dm, num_layers=4, position='rope', attention_pattern='local,global',
                  scan_layers=True)
  kw = dict(max_len=MAX_NEW, eos_id=-1)

  def run(params, prompt):
    greedy = generate_lm(cfg, params, prompt, jax.random.key(0), max_new=MAX_NEW, eos_id=-1)
    beam1, _ = beam_search_lm.__wrapped__(cfg, params, prompt, beams=1, alpha=0.0, **kw)
    wide = [beam_search_lm.__wrapped__(cfg, params, prompt, beams=3, alpha=0.6,
                                       cache_segments=n, **kw) for n in (1, 3)]
    return greedy, beam1, wide
  greedy, beam1, ((tokens_one, scores_one), (tokens_grown, scores_grown)) = dm.quick_jit(run)(
      dm.params(cfg), dm.PROMPT)
  np.testing.assert_array_equal(beam1, greedy)
  np.testing.assert_array_equal(tokens_grown, tokens_one)
  np.testing.assert_allclose(scores_grown, scores_one, atol=ATOL)
