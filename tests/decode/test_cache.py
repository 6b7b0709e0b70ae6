"""Cached generation equals recomputing the full forward pass (also when the cache grows
in segments); the encoder and the cross-attention keys/values are computed once per batch."""

import collections

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.decode.beam import beam_search_lm, beam_search_seq2seq
from tx.decode.generate import cache_schedule, generate_lm, generate_seq2seq
from tx.decode.reference import generate_lm_uncached
from tx.decode.steps import empty_cache, prompt_positions

ATOL = 2e-5
MAX_NEW = 6
CASES = [
    dict(position='sinusoidal'),
    dict(position='learned'),
    dict(position='rope', num_heads=4, num_kv_heads=2),  # GQA
    dict(position='alibi'),
    dict(position='t5', num_layers=2, scan_layers=True, num_kv_heads=1),  # scanned, MQA
    dict(position='none'),
    dict(position='rope', qk_norm='rmsnorm', attention_softcap=2.0),  # cross keys normed too
]
_CHECKS = {}


def _teacher_forced(model, params, inputs, tokens_BT):
  """Logits [B, T, V] that predict tokens[:, t], from ONE full forward pass (no cache)
  over the whole decoded sequence: by causality, what recomputing every step gives."""
  if model.cfg.family == 'decoder':
    p = inputs.shape[1]
    seq = jnp.concatenate([inputs, tokens_BT[:, :-1]], axis=1)
    lengths = jnp.sum(inputs != 0, axis=1)
    new_pos = lengths[:, None] + jnp.arange(tokens_BT.shape[1] - 1)
    positions = jnp.concatenate([prompt_positions(inputs), new_pos], axis=1)
    return model.apply({'params': params}, seq, positions=positions)[:, p - 1:]
  bos = jnp.ones((tokens_BT.shape[0], 1), jnp.int32)
  return model.apply({'params': params}, inputs, jnp.concatenate([bos, tokens_BT[:, :-1]], 1))


def _cached_and_reference(dm, cfg, max_new=MAX_NEW, cache_segments=None):
  """jit(params, inputs) -> (tokens, cached logits, reference logits): one compile."""
  key = cfg, max_new, cache_segments
  if key not in _CHECKS:
    generate = generate_lm if cfg.family == 'decoder' else generate_seq2seq
    model = tx.build_model(cfg)

    def check(params, inputs):
      tokens, logits = generate(cfg, params, inputs, jax.random.key(0), max_new=max_new,
                                eos_id=-1, return_logits=True, cache_segments=cache_segments)
      return tokens, logits, _teacher_forced(model, params, inputs, tokens)
    _CHECKS[key] = dm.quick_jit(check)
  return _CHECKS[key]


def _check_against_reference(dm, cfg, **kw):
  tokens, logits, ref = _cached_and_reference(dm, cfg, **kw)(dm.params(cfg), dm.inputs(cfg))
  np.testing.assert_allclose(logits, ref, atol=ATOL)
  ref_tokens = jnp.argmax(ref.at[..., 0].set(-jnp.inf), axis=-1)  # PAD is never generated
  np.testing.assert_array_equal(tokens, ref_tokens)


@pytest.mark.parametrize('extra', CASES, ids=lambda d: '-'.join(f'{k}={v}' for k, v in d.items()))
@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_cached_greedy_equals_full_forward(dm, family, extra):
  """Same tokens and logits; row 0 of the prompts is left-padded, row 1 of the sources
  right-padded, so cached slots and positions of padded rows are exercised."""
  _check_against_reference(dm, dm.tiny(family, **extra))


def test_cache_schedule_splits_long_generations_only():
  assert cache_schedule(16, 256) == ((0, 80), (64, 144), (128, 208), (192, 272))
  assert cache_schedule(1, 200) == ((0, 68), (67, 134), (133, 201))
  assert cache_schedule(5, 127) == ((0, 132),)  # one segment: the full cache
  assert cache_schedule(5, 7, segments=3) == ((0, 7), (2, 10), (5, 12))
  with pytest.raises(ValueError, match='cache_segments must be between 1 and max_new'):
    cache_schedule(5, 7, segments=8)


@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_cache_grown_in_segments_decodes_like_the_full_forward(dm, family):
  """7 new tokens in 3 segments (cache lengths P+2, P+5, P+7): the padded slots, the
  scanned layer axis and the relative position bias over key positions all follow."""
  _check_against_reference(dm, dm.tiny(family, **CASES[4]), max_new=7, cache_segments=3)


@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_beam_search_in_cache_segments_equals_one_cache(dm, family):
  """Beam search reorders the cache every step; grown in 3 segments it must pick the
  same hypotheses with the same scores as with the full-length cache."""
  cfg = dm.tiny(family, **CASES[4])
  search = beam_search_lm if family == 'decoder' else beam_search_seq2seq
  kw = dict(beams=3, max_len=7, alpha=0.6, eos_id=-1)
  both = dm.quick_jit(lambda p, x: [search.__wrapped__(cfg, p, x, cache_segments=n, **kw)
                                    for n in (1, 3)])
  (tokens_one, scores_one), (tokens_grown, scores_grown) = both(dm.params(cfg), dm.inputs(cfg))
  np.testing.assert_array_equal(tokens_grown, tokens_one)
  np.testing.assert_allclose(scores_grown, scores_one, atol=ATOL)


@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_beam_search_scores_are_the_models_log_probs(dm, family):
  """3 beams per row over 2 rows (no length penalty, no EOS): each row's score is the
  full forward pass's log-prob of the tokens it returns, so the cache copied to the beams
  and reordered between them stays with its row and beam (2 kv heads per cache row)."""
  cfg = dm.tiny(family, **CASES[2])
  search = beam_search_lm if family == 'decoder' else beam_search_seq2seq
  model = tx.build_model(cfg)

  def run(params, inputs):
    tokens, scores = search.__wrapped__(cfg, params, inputs, beams=3, max_len=MAX_NEW,
                                        alpha=0.0, eos_id=-1)
    return tokens, scores, _teacher_forced(model, params, inputs, tokens)
  tokens, scores, logits = dm.quick_jit(run)(dm.params(cfg), dm.inputs(cfg))
  logp = jax.nn.log_softmax(logits.at[..., 0].set(-jnp.inf))  # PAD is never chosen
  want = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0].sum(-1)
  np.testing.assert_allclose(scores, want, atol=1e-4)


def test_cached_sampling_equals_uncached_loop(dm):
  """The literal baseline of the benchmark: the whole network rerun at every step."""
  cfg = dm.tiny('decoder', position='rope')
  params = dm.params(cfg)
  kw = dict(max_new=MAX_NEW, strategy='sample', top_k=5, top_p=0.9, eos_id=-1,
            return_logits=True)
  both = dm.quick_jit(lambda p, x: (generate_lm(cfg, p, x, jax.random.key(3), **kw),
                                    generate_lm_uncached(cfg, p, x, jax.random.key(3), **kw)))
  (a, la), (b, lb) = both(params, dm.PROMPT)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(la, lb, atol=ATOL)


def _trace_counts(fn, *args):
  """Calls made while tracing fn(*args) (not counting init): {'encoder': n, 'cross_kv': n}."""
  counts = collections.Counter()

  def interceptor(next_fun, args_, kwargs, context):
    module = context.module
    if not module.is_initializing():
      if type(module).__name__ == 'Encoder' and context.method_name == '__call__':
        counts['encoder'] += 1
        counts['encoder_rows'] = args_[0].shape[0]
      parent = getattr(module.parent, 'name', None)
      if module.name in ('key', 'value') and parent == 'cross_attention':
        counts['cross_kv'] += 1
    return next_fun(*args_, **kwargs)

  with nn.intercept_methods(interceptor):
    jax.make_jaxpr(fn)(*args)
  return counts


def test_encoder_and_cross_kv_run_once_per_batch(dm):
  """Traced once: the prefill. A per-step call would add calls inside the loop body."""
  cfg = dm.tiny('encoder_decoder', num_layers=2)
  params = dm.params(cfg)
  gen = lambda p, s: generate_seq2seq.__wrapped__(cfg, p, s, jax.random.key(0), max_new=4)
  counts = _trace_counts(gen, params, dm.SOURCE)
  assert counts == {'encoder': 1, 'encoder_rows': 2, 'cross_kv': 2 * 2}  # key + value per layer
  beam = lambda p, s: beam_search_seq2seq.__wrapped__(cfg, p, s, beams=3, max_len=4)
  counts = _trace_counts(beam, params, dm.SOURCE)
  assert counts == {'encoder': 1, 'encoder_rows': 2, 'cross_kv': 2 * 2}  # B rows, not B*K


def test_decode_steps_reuse_cached_cross_kv(dm):
  """After the first step the decoder needs no encoder output: None reads the cache."""
  cfg = dm.tiny('encoder_decoder')
  params = dm.params(cfg)
  model = tx.build_model(cfg, decode=True)
  encoded, valid = dm.quick_jit(lambda p, s: model.apply({'params': p}, s, method='encode'))(
      params, dm.SOURCE)
  cache = empty_cache(model, encoded, valid, jnp.zeros((2, 3), jnp.int32), method='decode_step')
  step = dm.quick_jit(lambda cache, enc, tok: model.apply(
      {'params': params, 'cache': cache}, enc, valid, tok, method='decode_step',
      mutable=['cache']))
  _, state = step(cache, encoded, jnp.ones((2, 1), jnp.int32))
  tok = jnp.array([[7], [9]], jnp.int32)
  reused, _ = step(state['cache'], None, tok)
  recomputed, _ = step(state['cache'], encoded, tok)
  np.testing.assert_allclose(reused, recomputed, atol=1e-6)
  garbage, _ = step(state['cache'], encoded + 1.0, tok)  # a new encoder output is re-projected
  assert not np.allclose(garbage, reused, atol=1e-3)
