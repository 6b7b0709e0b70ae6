"""tx.layers against their formulas: Norm, FeedForward, Embed, PositionEmbedding, Block; NNX."""

import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tx import ops
from tx.config.choices import FFN_ACTIVATIONS
from tx.layers import (AttentionConfig, Block, BlockConfig, Embed, EmbedConfig, FeedForward,
                       FFNConfig, MultiHeadAttention, Norm, NormConfig, PositionConfig,
                       PositionEmbedding)

D, F = 16, 32  # the sizes of the tiny models in tests/models (shared compiled ops)
ATOL = 1e-5


def _x(shape=(2, 6, D), seed=0, shift=0.0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape) + shift, jnp.float32)


def _random_params(module, *args, seed=1):
  """Params with the shapes `init` gives but random values (so ones/zeros hide nothing)."""
  shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *args)['params'])
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype), shapes)


# -------------------------------------------------------------------------------- Norm

@pytest.mark.parametrize('eps', [1e-6, 0.5])
def test_layernorm_formula(eps):
  x = _x(shift=3.0)
  norm = Norm(NormConfig(kind='layernorm', eps=eps))
  p = _random_params(norm, x)
  assert set(p) == {'scale', 'bias'}
  x64 = np.asarray(x, np.float64)
  mean = x64.mean(-1, keepdims=True)
  var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
  expected = (x64 - mean) / np.sqrt(var + eps) * np.asarray(p['scale']) + np.asarray(p['bias'])
  np.testing.assert_allclose(norm.apply({'params': p}, x), expected, atol=ATOL)


def test_layernorm_without_bias():
  norm = Norm(NormConfig(kind='layernorm', use_bias=False))
  assert set(norm.init(jax.random.key(0), _x())['params']) == {'scale'}


@pytest.mark.parametrize('eps', [1e-6, 0.5])
def test_rmsnorm_formula_no_mean_no_bias(eps):
  x = _x(shift=3.0)
  norm = Norm(NormConfig(kind='rmsnorm', eps=eps, use_bias=True))  # use_bias is LayerNorm only
  p = _random_params(norm, x)
  assert set(p) == {'scale'}
  x64 = np.asarray(x, np.float64)
  expected = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * np.asarray(p['scale'])
  np.testing.assert_allclose(norm.apply({'params': p}, x), expected, atol=ATOL)
  # LayerNorm ignores a constant shift; RMSNorm (no mean subtraction) does not.
  layer = Norm(NormConfig(kind='layernorm', eps=eps))
  lp = _random_params(layer, x)
  np.testing.assert_allclose(layer.apply({'params': lp}, x + 5.0), layer.apply({'params': lp}, x),
                             atol=1e-4)
  assert np.abs(norm.apply({'params': p}, x + 5.0) - norm.apply({'params': p}, x)).max() > 0.1


def test_norm_computes_in_float32_and_returns_compute_dtype():
  x = _x(shift=100.0).astype(jnp.bfloat16)
  norm = Norm(NormConfig(kind='layernorm', dtype='bfloat16'))
  variables = norm.init(jax.random.key(0), x)
  assert variables['params']['scale'].value.dtype == jnp.float32
  y = norm.apply(variables, x)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y, np.float32).mean(-1), 0.0, atol=0.05)


# ------------------------------------------------------------------------- FeedForward

def _gelu(v):
  return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))


def _gelu_tanh(v):
  return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


NUMPY_ACTS = {'relu': lambda v: np.maximum(v, 0), 'gelu': _gelu, 'gelu_tanh': _gelu_tanh,
              'silu': lambda v: v / (1 + np.exp(-v))}


@pytest.mark.parametrize('activation', FFN_ACTIVATIONS)  # every row of the table
def test_feedforward_matches_hand_computation(activation):
  x = _x()
  ffn = FeedForward(FFNConfig(d_model=D, d_ff=F, activation=activation))
  p = _random_params(ffn, x)
  act, gated = NUMPY_ACTS[FFN_ACTIVATIONS[activation].fn], FFN_ACTIVATIONS[activation].gated
  assert set(p) == ({'wi_0', 'wi_1', 'wo'} if gated else {'wi', 'wo'})
  assert p['wo']['kernel'].shape == (F, D)
  y = ffn.apply({'params': p}, x)
  assert y.shape == x.shape
  P = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), p)
  x64 = np.asarray(x, np.float64)
  dense = lambda name, v: v @ P[name]['kernel'] + P[name]['bias']
  if gated:
    h = act(dense('wi_0', x64)) * dense('wi_1', x64)
  else:
    h = act(dense('wi', x64))
  np.testing.assert_allclose(y, dense('wo', h), atol=ATOL, rtol=1e-5)


def test_feedforward_without_bias_has_no_bias_params():
  ffn = FeedForward(FFNConfig(d_model=D, d_ff=F, activation='swiglu', use_bias=False))
  p = nn.unbox(jax.eval_shape(ffn.init, jax.random.key(0), _x())['params'])
  assert all(set(v) == {'kernel'} for v in p.values())


# ------------------------------------------------------------------- Embed / positions

def test_embed_lookup_and_attend_is_x_times_table_transposed():
  embed = Embed(EmbedConfig(vocab_size=11, d_model=D))
  tokens = jnp.array([[1, 4, 10], [0, 2, 2]])
  variables = embed.init(jax.random.key(0), tokens)
  table = np.asarray(nn.unbox(variables['params'])['embedding'])
  assert table.shape == (11, D)
  np.testing.assert_array_equal(embed.apply(variables, tokens), table[np.asarray(tokens)])
  x = _x()
  logits = embed.apply(variables, x, method=Embed.attend)
  assert logits.shape == (2, 6, 11)
  np.testing.assert_allclose(logits, np.asarray(x) @ table.T, atol=ATOL, rtol=1e-5)


POSITIONS_BL = jnp.array([[0, 1, 2, 3], [5, 3, 7, 0]])


def test_sinusoidal_positions_are_rows_of_the_table():
  pe = PositionEmbedding(PositionConfig(kind='sinusoidal', max_len=16, d_model=D))
  variables = pe.init(jax.random.key(0), POSITIONS_BL)
  assert not variables.get('params')  # nothing learned
  table = np.asarray(ops.sinusoidal_table(16, D))
  np.testing.assert_allclose(pe.apply(variables, POSITIONS_BL), table[np.asarray(POSITIONS_BL)],
                             atol=1e-6)
  # The 2017 formula itself, for one entry: PE[pos, 2i] = sin(pos / 10000^(2i/D)).
  np.testing.assert_allclose(table[5, 2], math.sin(5 / 10000 ** (2 / D)), rtol=1e-5)
  np.testing.assert_allclose(table[5, 3], math.cos(5 / 10000 ** (2 / D)), rtol=1e-5)


def test_learned_positions_gather_rows():
  pe = PositionEmbedding(PositionConfig(kind='learned', max_len=16, d_model=D))
  variables = pe.init(jax.random.key(0), POSITIONS_BL)
  table = np.asarray(nn.unbox(variables['params'])['embedding'])
  assert table.shape == (16, D)
  np.testing.assert_array_equal(pe.apply(variables, POSITIONS_BL), table[np.asarray(POSITIONS_BL)])


# ------------------------------------------------------------------------------ Block

def _block_cfg(norm_position, dropout=0.0):
  return BlockConfig(attention=AttentionConfig(d_model=D, num_heads=4), norm=NormConfig(),
                     ffn=FFNConfig(d_model=D, d_ff=F, activation='relu'),
                     norm_position=norm_position, dropout=dropout)


@pytest.fixture(scope='module')
def block_params():
  return _random_params(Block(_block_cfg('pre')), _x())


def test_block_pre_and_post_match_their_compositions(block_params):
  x, p = _x(), block_params
  cfg = _block_cfg('pre')
  attn = lambda h: MultiHeadAttention(cfg.attention).apply({'params': p['self_attention']}, h)
  ffn = lambda h: FeedForward(cfg.ffn).apply({'params': p['ffn']}, h)
  norm = lambda name, h: Norm(cfg.norm).apply({'params': p[name]}, h)

  h = x + attn(norm('self_attention_norm', x))
  pre = h + ffn(norm('ffn_norm', h))
  h = norm('self_attention_norm', x + attn(x))
  post = norm('ffn_norm', h + ffn(h))

  out_pre = Block(cfg).apply({'params': p}, x)
  out_post = Block(_block_cfg('post')).apply({'params': p}, x)
  np.testing.assert_allclose(out_pre, pre, atol=ATOL)
  np.testing.assert_allclose(out_post, post, atol=ATOL)
  assert np.abs(out_pre - out_post).max() > 0.1


def test_dropout_only_when_not_deterministic(block_params):
  x, p = _x(), block_params
  no_dropout = Block(_block_cfg('pre')).apply({'params': p}, x)
  with_rate = _block_cfg('pre', dropout=0.5)
  det = Block(with_rate, deterministic=True)
  np.testing.assert_array_equal(det.apply({'params': p}, x), no_dropout)
  np.testing.assert_array_equal(det.apply({'params': p}, x), det.apply({'params': p}, x))

  train = Block(with_rate, deterministic=False)
  with pytest.raises(flax.errors.InvalidRngError, match='dropout'):
    train.apply({'params': p}, x)  # needs a 'dropout' rng
  a = train.apply({'params': p}, x, rngs={'dropout': jax.random.key(1)})
  again = train.apply({'params': p}, x, rngs={'dropout': jax.random.key(1)})
  other = train.apply({'params': p}, x, rngs={'dropout': jax.random.key(2)})
  np.testing.assert_array_equal(a, again)
  assert np.abs(a - no_dropout).max() > 1e-3
  assert np.abs(a - other).max() > 1e-3


# ----------------------------------------------------------------------- NNX interop

def test_nnx_bridge_wraps_a_tx_layer():
  """An NNX user wraps a tx module with ToNNX; same params give the same output.

  tx params carry logical axis names, which NNX turns into eager sharding annotations
  that need a mesh; without one, initialise under `nnx.use_eager_sharding(False)`.
  """
  x = _x()
  linen = FeedForward(FFNConfig(d_model=D, d_ff=F, activation='swiglu'))
  with nnx.use_eager_sharding(False):
    model = nnx.bridge.ToNNX(linen, rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(model, x)
  assert model.wi_0['kernel'].get_metadata()['out_sharding'] == ('embed', 'mlp')
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  np.testing.assert_allclose(model(x), linen.apply({'params': params}, x), atol=1e-6)
  # The NNX module is stateful: updating its param changes its output like Linen's would.
  model.wo['bias'][...] = model.wo['bias'][...] + 1.0
  np.testing.assert_allclose(model(x), linen.apply({'params': params}, x) + 1.0, atol=1e-5)
