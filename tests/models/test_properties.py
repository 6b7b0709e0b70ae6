"""Properties of the families: causality, bidirectionality, padding and packing invariance,
jit and bf16 equivalence."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.config.choices import POSITION_KINDS
from tx.layers import Embed

POSITIONS = tuple(POSITION_KINDS)  # every row of the table
ATOL = 1e-5


def _replace(tokens, t, value=None):
  """tokens with column t changed (to a different non-pad id)."""
  value = (tokens[:, t] % 37) + 1 if value is None else value
  return tokens.at[:, t].set(value)


# ------------------------------------------------------------------------- causality

@pytest.mark.parametrize('position', POSITIONS)
@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_changing_token_t_changes_no_earlier_logit(tm, family, position):
  cfg = tm.tiny(family, position=position)
  model, variables = tm.build(cfg)
  run = (lambda tgt: model.apply(variables, tgt)) if family == 'decoder' else (
      lambda tgt: model.apply(variables, tm.SOURCE, tgt))
  base = run(tm.TOKENS)
  for t in (1, 3):  # rows: [5 9 3 17 22 8] and [7 11 30 2 0 0]
    changed = run(_replace(tm.TOKENS, t))
    np.testing.assert_allclose(changed[:, :t], base[:, :t], atol=ATOL, err_msg=f't={t}')
    assert (np.abs(changed[:, t] - base[:, t]).max(-1) > 1e-4).all(), f't={t}'


def _embedding_jacobian(model, variables, tokens):
  """d (logits[0, i] · w) / d x[0, j, :] for the token embeddings x and a random w: [L, L, D]."""
  w_V = jnp.asarray(np.random.default_rng(0).standard_normal(model.cfg.vocab_size), jnp.float32)

  def logits_from_delta(delta_LD):
    def add_delta(next_fun, args_, kwargs, context):
      out = next_fun(*args_, **kwargs)
      if isinstance(context.module, Embed) and context.method_name == '__call__':
        out = out + delta_LD.astype(out.dtype)
      return out
    with nn.intercept_methods(add_delta):
      return model.apply(variables, tokens)[0] @ w_V  # [L]
  delta = jnp.zeros((tokens.shape[1], model.cfg.d_model))
  return jax.jacrev(logits_from_delta)(delta)


def test_causality_via_gradients(tm):
  """nanodo's test: d logits[i] / d embeddings[j] == 0 exactly for j > i, != 0 for j <= i."""
  cfg = tm.tiny('decoder', position='rope')
  model, variables = tm.build(cfg)
  jac_LLD = jax.jit(lambda v, x: _embedding_jacobian(model, v, x))(variables, tm.TOKENS[:1])
  norms_LL = np.abs(np.asarray(jac_LLD)).sum(-1)
  future = np.triu(np.ones_like(norms_LL, bool), k=1)
  assert (norms_LL[future] == 0).all()
  assert (norms_LL[~future] > 0).all()


# ----------------------------------------------------------------- bidirectionality

@pytest.mark.parametrize('position', POSITIONS)
@pytest.mark.parametrize('family', ['encoder', 'encoder_decoder'])
def test_encoder_sees_both_directions(tm, family, position):
  cfg = tm.tiny(family, position=position)
  model, variables = tm.build(cfg)
  if family == 'encoder':
    run = lambda src: model.apply(variables, src, head='hidden')
  else:
    run = lambda src: model.apply(variables, src, method='encode')[0]
  src = tm.TOKENS if family == 'encoder' else tm.SOURCE
  base = run(src)
  for t in (2, 3):
    changed = run(_replace(src, t))
    assert (np.abs(changed - base).max(-1)[:, :t] > 1e-4).all(), f't={t}'  # earlier positions


# ------------------------------------------------------------------- padding invariance

def _pad(tokens, n):
  return jnp.pad(tokens, ((0, 0), (0, n)))


# The short inputs are [2, 5] (row 1 ends in two pads) and their padded forms [2, 6]: the
# shapes other tests compile anyway.
@pytest.mark.parametrize('position', POSITIONS)
@pytest.mark.parametrize('family', ['decoder', 'encoder'])
def test_appended_padding_changes_no_real_logit(tm, family, position):
  cfg = tm.tiny(family, position=position)
  model, variables = tm.build(cfg)
  real = np.asarray(tm.SOURCE != 0)
  base = model.apply(variables, tm.SOURCE)
  padded = model.apply(variables, _pad(tm.SOURCE, 1))
  assert padded.shape[1] == base.shape[1] + 1
  np.testing.assert_allclose(padded[:, :5][real], base[real], atol=ATOL)


@pytest.mark.parametrize('position', POSITIONS)
def test_appended_padding_encoder_decoder(tm, position):
  """Source padding and target padding, each appended on its own."""
  cfg = tm.tiny('encoder_decoder', position=position)
  model, variables = tm.build(cfg)
  src = tgt = tm.SOURCE
  real = np.asarray(tgt != 0)
  base = model.apply(variables, src, tgt)
  more_src = model.apply(variables, _pad(src, 1), tgt)
  np.testing.assert_allclose(more_src[real], base[real], atol=ATOL)
  more_tgt = model.apply(variables, src, _pad(tgt, 1))
  np.testing.assert_allclose(more_tgt[:, :5][real], base[real], atol=ATOL)


def test_padding_is_not_just_ignored_by_luck(tm):
  """Control for the invariance tests: a real token in place of the padding does matter."""
  cfg = tm.tiny('encoder', position='none')
  model, variables = tm.build(cfg)
  base = model.apply(variables, tm.TOKENS)
  filled = model.apply(variables, tm.TOKENS.at[1, 4:].set(3))
  assert np.abs(filled[1, :4] - base[1, :4]).max() > 1e-4


# ------------------------------------------------------------------------ packed rows

@pytest.mark.parametrize('position', POSITIONS)
@pytest.mark.parametrize('family', ['decoder', 'encoder'])
def test_packed_row_equals_separate_rows(tm, family, position):
  """Two segments in one row (positions restart per segment) = each segment alone."""
  cfg = tm.tiny(family, position=position)
  model, variables = tm.build(cfg)
  a, b = [5, 9], [17, 22, 8, 4]
  packed = jnp.array([a + b, b + a])  # [2, 6]
  segments = jnp.array([[1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 2, 2]])
  out = model.apply(variables, packed, segment_ids=segments)
  alone = model.apply(variables, jnp.array([a + [0] * 4, b + [0] * 2]))  # padded to [2, 6]
  np.testing.assert_allclose(out[0, :2], alone[0, :2], atol=ATOL)
  np.testing.assert_allclose(out[0, 2:], alone[1, :4], atol=ATOL)
  np.testing.assert_allclose(out[1, :4], alone[1, :4], atol=ATOL)
  np.testing.assert_allclose(out[1, 4:], alone[0, :2], atol=ATOL)


# --------------------------------------------------------------------- jit and dtypes

@pytest.mark.parametrize('family,position', [('decoder', 'rope'), ('encoder_decoder', 't5')])
def test_jit_equals_no_jit(tm, family, position):
  cfg = tm.tiny(family, position=position)
  model, variables = tm.build(cfg)
  args = tm.inputs(cfg)
  np.testing.assert_allclose(jax.jit(model.apply)(variables, *args),
                             model.apply(variables, *args), atol=ATOL, rtol=1e-5)


# bf16 keeps 8 bits of mantissa (relative error 2^-9 per rounding). Through two blocks and
# the head the logits drift by 1-2% of their largest magnitude here; 5% leaves a margin
# but still catches a wrong cast (fp16 overflow, an int, a dropped scale).
BF16_REL_TOL = 0.05


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder'])
def test_bf16_compute_close_to_fp32_with_fp32_params(tm, family):
  cfg = tm.tiny(family, position='rope', ffn='swiglu')
  model, variables = tm.build(cfg)
  model16 = tx.build_model(cfg.replace(dtype='bfloat16'))
  shapes16 = jax.eval_shape(model16.init, jax.random.key(0), *tm.inputs(cfg))['params']
  dtypes = {x.dtype for x in jax.tree_util.tree_leaves(nn.unbox(shapes16))}
  assert dtypes == {jnp.dtype(jnp.float32)}
  args = tm.inputs(cfg)
  ref = np.asarray(model.apply(variables, *args))
  out16 = tm.jitted(model16)(variables, *args)  # the fp32 params of the fp32 model
  assert out16.dtype == jnp.float32  # logits (and so losses) in float32
  hidden16 = jax.eval_shape(functools.partial(model16.apply, **(
      {'head': 'hidden'} if family == 'encoder' else {'return_hidden': True})), variables, *args)
  assert hidden16.dtype == jnp.bfloat16  # the compute really was bf16
  scale = np.abs(ref).max()
  assert np.abs(np.asarray(out16) - ref).max() <= BF16_REL_TOL * scale
