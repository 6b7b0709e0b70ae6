"""Block structure knobs (sandwich norms, parallel block), the query pre-attention scalar
and the (1 + scale) norm offset, each against its hand computation."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.config.base import ConfigError
from tx.config.rope import RopeScalingConfig
from tx.layers.attention import AttentionConfig, MultiHeadAttention
from tx.layers.block import Block, BlockConfig
from tx.layers.ffn import FeedForward, FFNConfig
from tx.layers.norm import Norm, NormConfig

D = 16
ATTN = AttentionConfig(d_model=D, num_heads=2, rope=True)
NORM = NormConfig(kind='rmsnorm')
FFN = FFNConfig(d_model=D, d_ff=32, activation='gelu')
X = jax.random.normal(jax.random.key(0), (2, 5, D))
ENC = jax.random.normal(jax.random.key(1), (2, 3, D))
POS = jnp.broadcast_to(jnp.arange(5), (2, 5))


def _init(cfg, *args):
  """Real params, norm scales then set to random values around 1 (so norms differ)."""
  params = nn.unbox(Block(cfg).init(jax.random.key(2), *args))['params']
  rng = np.random.default_rng(0)
  return jax.tree_util.tree_map_with_path(
      lambda p, v: jnp.asarray(1 + 0.3 * rng.standard_normal(v.shape), v.dtype)
      if jax.tree_util.keystr(p).endswith("['scale']") else v, params)


def _norm_names(params):
  return {name for name in params if name.endswith('norm')}


def _args(cross):
  return (X, None, None, POS, ENC) if cross else (X, None, None, POS)


# ------------------------------------------------------------------- sandwich

def test_sandwich_block_names_its_norms_and_is_the_identity_with_zero_output_norms():
  cfg = BlockConfig(attention=ATTN, norm=NORM, ffn=FFN, sandwich_norm=True,
                    cross_attention=AttentionConfig(d_model=D, num_heads=2))
  params = _init(cfg, *_args(True))
  assert _norm_names(params) == {f'{s}_{kind}' for s in ('self_attention', 'cross_attention', 'ffn')
                                 for kind in ('norm', 'post_norm')}
  run = lambda p: Block(cfg).apply({'params': p}, *_args(True))
  zeroed = {k: ({'scale': jnp.zeros_like(v['scale'])} if k.endswith('post_norm') else v)
            for k, v in params.items()}
  np.testing.assert_array_equal(run(zeroed), X)
  for name in ('self_attention_post_norm', 'cross_attention_post_norm', 'ffn_post_norm'):
    one_on = {**zeroed, name: params[name]}  # each output norm carries its sublayer
    assert float(jnp.max(jnp.abs(run(one_on) - X))) > 1e-2, name


def test_sandwich_branch_is_the_output_norm_of_the_sublayer():
  cfg = BlockConfig(attention=ATTN, norm=NORM, ffn=FFN, sandwich_norm=True)
  p = _init(cfg, *_args(False))
  norm = lambda name, h: Norm(NORM).apply({'params': p[name]}, h)
  attn = lambda h: MultiHeadAttention(ATTN).apply({'params': p['self_attention']}, h, q_pos_BL=POS)
  ffn = lambda h: FeedForward(FFN).apply({'params': p['ffn']}, h)
  h = X + norm('self_attention_post_norm', attn(norm('self_attention_norm', X)))
  expected = h + norm('ffn_post_norm', ffn(norm('ffn_norm', h)))
  np.testing.assert_allclose(Block(cfg).apply({'params': p}, *_args(False)), expected,
                             rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- parallel

@pytest.mark.parametrize('parallel', ['two_norms', 'shared_norm'])
def test_parallel_block_is_x_plus_attention_plus_ffn_of_the_same_x(parallel):
  cfg = BlockConfig(attention=ATTN, norm=NORM, ffn=FFN, parallel=parallel)
  p = _init(cfg, *_args(False))
  names = ({'shared_norm'} if parallel == 'shared_norm'
           else {'self_attention_norm', 'ffn_norm'})
  assert _norm_names(p) == names
  norm = lambda name: Norm(NORM).apply({'params': p[name]}, X)
  h_attn, h_ffn = ((norm('shared_norm'),) * 2 if parallel == 'shared_norm'
                   else (norm('self_attention_norm'), norm('ffn_norm')))
  attn = MultiHeadAttention(ATTN).apply({'params': p['self_attention']}, h_attn, q_pos_BL=POS)
  ffn = FeedForward(FFN).apply({'params': p['ffn']}, h_ffn)
  out = Block(cfg).apply({'params': p}, *_args(False))
  np.testing.assert_allclose(out, X + attn + ffn, rtol=1e-5, atol=1e-5)
  if parallel == 'two_norms':  # same parameter names as the sequential block, other result
    sequential = Block(cfg.replace(parallel='none')).apply({'params': p}, *_args(False))
    assert float(jnp.max(jnp.abs(sequential - out))) > 1e-2


# --------------------------------------------------------------- query scale

def test_query_pre_attn_scalar_sets_the_score_scale():
  cfg = AttentionConfig(d_model=D, num_heads=2, query_pre_attn_scalar=2.0)  # head_dim 8
  assert cfg.score_scale == 2.0 ** -0.5
  assert cfg.replace(scale_multiplier=3.0).score_scale == pytest.approx(3.0 * 2.0 ** -0.5)
  assert cfg.replace(query_pre_attn_scalar=None).score_scale == 8 ** -0.5
  layer = MultiHeadAttention(cfg)
  params = nn.unbox(layer.init(jax.random.key(3), X))['params']
  _, state = layer.apply({'params': params}, X, return_weights=True, mutable='intermediates')
  weights = state['intermediates']['attention_weights'][0]  # [B, H, L, S]
  proj = lambda name: (jnp.einsum('bld,dhk->blhk', X, params[name]['kernel'])
                       + params[name]['bias'])
  scores = jnp.einsum('blhk,bshk->bhls', proj('query'), proj('key')) * 2.0 ** -0.5
  np.testing.assert_allclose(weights, jax.nn.softmax(scores, axis=-1), rtol=1e-5, atol=1e-6)
  default = jax.nn.softmax(scores * (2.0 / 8) ** 0.5, axis=-1)  # head_dim ** -0.5
  assert not np.allclose(weights, default, atol=1e-3)


# ---------------------------------------------------------------- norm offset

@pytest.mark.parametrize('kind', ['layernorm', 'rmsnorm'])
def test_offset_norm_is_one_plus_scale(kind):
  x = 3.0 * jax.random.normal(jax.random.key(4), (2, 3, D)) + 1.0
  offset, plain = NormConfig(kind=kind, scale_offset=True), NormConfig(kind=kind)
  params = nn.unbox(Norm(offset).init(jax.random.key(5), x))['params']
  np.testing.assert_array_equal(params['scale'], 0.0)  # Gemma's init
  ones = {'scale': jnp.ones(D), **({'bias': params['bias']} if 'bias' in params else {})}
  run = lambda cfg, p, v=x: Norm(cfg).apply({'params': p}, v)
  np.testing.assert_array_equal(run(offset, params), run(plain, ones))  # weight 0 = unscaled
  w = jnp.linspace(-0.5, 0.7, D)
  np.testing.assert_allclose(run(offset, {**params, 'scale': w}),
                             run(plain, {**ones, 'scale': 1.0 + w}), rtol=1e-6, atol=1e-6)
  # Still a normalisation: invariant to rescaling its input.
  np.testing.assert_allclose(run(offset, {**params, 'scale': w}, 7.0 * x),
                             run(offset, {**params, 'scale': w}), rtol=1e-4, atol=1e-5)
  assert not np.allclose(run(offset, {**params, 'scale': w}), run(plain, {**ones, 'scale': w}))


def test_qk_norms_take_the_offset():
  cfg = AttentionConfig(d_model=D, num_heads=2, qk_norm='rmsnorm', qk_norm_scale_offset=True)
  params = nn.unbox(MultiHeadAttention(cfg).init(jax.random.key(6), X))['params']
  for name in ('query_norm', 'key_norm'):
    np.testing.assert_array_equal(params[name]['scale'], 0.0)


# ----------------------------------------------------------------- validation

@pytest.mark.parametrize('kwargs,key', [
    (dict(norm_position='post', sandwich_norm=True), 'sandwich_norm'),
    (dict(norm_position='post', parallel='two_norms'), 'parallel'),
    (dict(parallel='shared_norm', cross_attention=ATTN), 'parallel'),
    (dict(parallel='both'), 'parallel'),
])
def test_impossible_block_structures_are_config_errors(kwargs, key):
  with pytest.raises(ConfigError, match=rf'^{key}'):
    BlockConfig(attention=ATTN, norm=NORM, ffn=FFN, **kwargs)


def test_attention_config_needs_the_scaling_context_length():
  with pytest.raises(ConfigError, match=r'^rope_scaling:'):
    AttentionConfig(d_model=D, num_heads=2, rope=True,
                    rope_scaling=RopeScalingConfig(kind='linear', factor=2.0))
  with pytest.raises(ConfigError, match=r'^query_pre_attn_scalar:'):
    AttentionConfig(d_model=D, num_heads=2, query_pre_attn_scalar=-1.0)
