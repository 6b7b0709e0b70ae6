"""QK-norm: queries and keys normalised per head (before RoPE and the dot product) make
attention invariant to rescaling q and k; it applies in self- and cross-attention."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.layers.attention import AttentionConfig, MultiHeadAttention


def scaled(params, names, factor):
  """params with the kernel and bias of the projections in `names` times `factor`."""
  def f(path, x):
    keys = [getattr(k, 'key', None) for k in path]
    return x * factor if any(n in keys for n in names) else x
  return jax.tree_util.tree_map_with_path(f, params)


@pytest.mark.parametrize('kind', ['layernorm', 'rmsnorm'])
@pytest.mark.parametrize('rope', [False, True])
def test_output_is_invariant_to_rescaling_q_and_k(kind, rope):
  cfg = AttentionConfig(d_model=16, num_heads=4, num_kv_heads=2, qk_norm=kind, rope=rope,
                        qk_norm_eps=1e-12)
  layer = MultiHeadAttention(cfg)
  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  kv = jax.random.normal(jax.random.key(1), (2, 7, 16))
  pos = jnp.broadcast_to(jnp.arange(5), (2, 5))
  kpos = jnp.broadcast_to(jnp.arange(7), (2, 7))
  params = nn.unbox(layer.init(jax.random.key(2), x, kv, q_pos_BL=pos, k_pos_BS=kpos))['params']
  run = lambda p: layer.apply({'params': p}, x, kv, q_pos_BL=pos, k_pos_BS=kpos)
  base = run(params)
  np.testing.assert_allclose(run(scaled(params, ['query'], 7.0)), base, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(run(scaled(params, ['key'], 0.05)), base, rtol=1e-4, atol=1e-5)
  # Without QK-norm the same rescaling changes the output: the test can fail.
  plain = AttentionConfig(d_model=16, num_heads=4, num_kv_heads=2, rope=rope)
  layer0 = MultiHeadAttention(plain)
  p0 = nn.unbox(layer0.init(jax.random.key(2), x, kv, q_pos_BL=pos, k_pos_BS=kpos))['params']
  run0 = lambda p: layer0.apply({'params': p}, x, kv, q_pos_BL=pos, k_pos_BS=kpos)
  assert float(jnp.max(jnp.abs(run0(scaled(p0, ['query'], 7.0)) - run0(p0)))) > 1e-2


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder'])
def test_every_attention_of_every_family_gets_query_and_key_norms(family):
  cfg = tx.ModelConfig(family=family, vocab_size=32, d_model=16, num_heads=2, d_ff=32,
                       num_layers=1, max_len=16, qk_norm='layernorm')
  params = tx.init_params(cfg, jax.random.key(0), batch=2, length=8)
  paths = ['/'.join(str(getattr(k, 'key', k)) for k in p)
           for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  attentions = {p.split('/')[-4] + '@' + p.split('/')[0] for p in paths if '_norm/scale' in p
                and p.split('/')[-3] in ('query_norm', 'key_norm')}
  expected = {'decoder': {'self_attention@decoder'}, 'encoder': {'self_attention@encoder'},
              'encoder_decoder': {'self_attention@encoder', 'self_attention@decoder',
                                  'cross_attention@decoder'}}[family]
  assert attentions == expected
  assert not any('_norm/bias' in p and ('query_norm' in p or 'key_norm' in p) for p in paths)


def test_bad_qk_norm_is_a_config_error_naming_the_key():
  with pytest.raises(tx.ConfigError, match=r'model\.qk_norm'):
    tx.ModelConfig(qk_norm='batchnorm')
  with pytest.raises(tx.ConfigError, match=r'model\.attention_softcap'):
    tx.ModelConfig(attention_softcap=-1.0)
