"""The three families: every variant builds, parameters are named, heads, the 2017 base model."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.config.choices import POSITION_KINDS
from tx.layers import Embed, EmbedConfig
from tx.models import layer_configs

FAMILIES = ('decoder', 'encoder', 'encoder_decoder')
POSITIONS = tuple(POSITION_KINDS)  # every row of the table
AXIS_NAMES = {'batch', 'length', 'embed', 'heads', 'kv_heads', 'kv', 'mlp', 'vocab', 'layers',
              'expert', None}


# ------------------------------------------------------------ every variant runs

@pytest.mark.parametrize('norm_position', ['pre', 'post'])
@pytest.mark.parametrize('position', POSITIONS)
@pytest.mark.parametrize('family', FAMILIES)
def test_every_family_position_and_norm_runs(tm, family, position, norm_position):
  cfg = tm.tiny(family, position=position, norm_position=norm_position)
  model, variables = tm.build(cfg)
  logits = model.apply(variables, *tm.inputs(cfg))
  assert logits.shape == (*tm.TOKENS.shape, tm.VOCAB)  # [B, L(_tgt), V]
  assert logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()
  # Final norm exactly when pre-norm (post-norm blocks already end in a norm).
  has_final = 'final_norm' in str(jax.tree_util.tree_structure(variables['params']))
  assert has_final == (norm_position == 'pre')


@pytest.mark.parametrize('family,extra', [
    ('encoder', dict(position='t5', type_vocab_size=2, num_classes=3, embed_norm=True)),
    ('encoder_decoder', dict(position='learned', share_embeddings=False, src_vocab_size=50,
                             tie_embeddings=False)),
])
def test_real_init_is_finite_fp32_and_runs(tm, family, extra):
  """The other model tests use random params of init's shapes; this one runs init itself
  (both towers, every kind of parameter: tables, kernels, biases, norms, heads)."""
  cfg = tm.tiny(family, **extra)
  params = nn.unbox(tx.init_params(cfg, jax.random.key(0), batch=2, length=6))
  leaves = jax.tree_util.tree_leaves_with_path(params)
  assert all(x.dtype == jnp.float32 and np.isfinite(np.asarray(x)).all() for _, x in leaves)
  for path, x in leaves:  # norms start as the identity
    name = jax.tree_util.keystr(path)
    if 'norm' in name:
      np.testing.assert_array_equal(x, 1.0 if name.endswith("['scale']") else 0.0, err_msg=name)
  if cfg.num_classes:  # init creates every head, not only the one it ran
    assert {'mlm_head', 'classifier'} <= set(params)
  shapes = jax.tree_util.tree_map(jnp.shape, nn.unbox(tm.build(cfg)[1]['params']))
  assert jax.tree_util.tree_map(jnp.shape, params) == shapes
  logits = tx.build_model(cfg).apply({'params': params}, *tm.inputs(cfg))
  assert np.isfinite(np.asarray(logits)).all()


# -------------------------------------------------------------- logical axis names

def _axis_names_ok(params, scanned):
  leaves = jax.tree_util.tree_leaves_with_path(
      params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert leaves
  for path, leaf in leaves:
    where = jax.tree_util.keystr(path)
    assert isinstance(leaf, nn.LogicallyPartitioned), f'{where} has no logical axis names'
    assert len(leaf.names) == leaf.value.ndim, f'{where}: {leaf.names} vs {leaf.value.shape}'
    assert set(leaf.names) <= AXIS_NAMES, f'{where}: {leaf.names}'
    in_scan = "['layers']" in where
    assert in_scan == (scanned and 'stack' in where and 'final_norm' not in where), where
    if in_scan:
      assert leaf.names[0] == 'layers', where
    else:
      assert 'layers' not in leaf.names, where


@pytest.mark.parametrize('scan', [False, True])
@pytest.mark.parametrize('family,extra', [
    ('decoder', dict(position='learned', ffn='swiglu', tie_embeddings=False, num_kv_heads=1)),
    ('decoder', dict(position='rope', moe=tx.MoEConfig(num_experts=2, top_k=1))),
    ('encoder', dict(position='t5', type_vocab_size=2, num_classes=3, embed_norm=True)),
    ('encoder_decoder', dict(position='t5', share_embeddings=False, src_vocab_size=50)),
])
def test_every_parameter_has_logical_axis_names(tm, family, extra, scan):
  cfg = tm.tiny(family, scan_layers=scan, **extra)
  model = tx.build_model(cfg)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), *tm.inputs(cfg)))['params']
  _axis_names_ok(params, scan)


# ------------------------------------------------------------------ encoder heads

def test_mlm_head_uses_the_tied_table(tm):
  cfg = tm.tiny('encoder', position='learned', mlm_activation='gelu')
  model, variables = tm.build(cfg)
  logits = model.apply(variables, tm.TOKENS)
  assert logits.shape == (*tm.TOKENS.shape, tm.VOCAB)
  p = nn.unbox(variables['params'])
  assert set(p['mlm_head']) == {'transform', 'transform_norm', 'bias'}  # no second table
  # By hand: LayerNorm(gelu(h W + b)) · Eᵀ + bias with E the token embedding table.
  h = model.apply(variables, tm.TOKENS, head='hidden')
  t = jax.nn.gelu(h @ p['mlm_head']['transform']['kernel'] + p['mlm_head']['transform']['bias'],
                  approximate=False)
  t = (t - t.mean(-1, keepdims=True)) / jnp.sqrt(t.var(-1, keepdims=True) + cfg.norm_eps)
  t = t * p['mlm_head']['transform_norm']['scale'] + p['mlm_head']['transform_norm']['bias']
  expected = t @ p['embed']['embedding'].T + p['mlm_head']['bias']
  np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)


def test_classify_head_shape_and_error_without_classes(tm):
  cfg = tm.tiny('encoder', num_classes=3)
  model, variables = tm.build(cfg)
  assert model.apply(variables, tm.TOKENS, head='classify').shape == (2, 3)
  assert model.apply(variables, tm.TOKENS, head='hidden').shape == (2, 6, cfg.d_model)
  no_classes = tm.tiny('encoder')
  model, variables = tm.build(no_classes)
  with pytest.raises(ValueError, match='num_classes'):
    model.apply(variables, tm.TOKENS, head='classify')


def test_token_types_change_the_output(tm):
  cfg = tm.tiny('encoder', type_vocab_size=2)
  model, variables = tm.build(cfg)
  zeros, ones = jnp.zeros_like(tm.TOKENS), jnp.ones_like(tm.TOKENS)
  default = model.apply(variables, tm.TOKENS)
  np.testing.assert_array_equal(default, model.apply(variables, tm.TOKENS, token_types=zeros))
  assert np.abs(default - model.apply(variables, tm.TOKENS, token_types=ones)).max() > 1e-3


# ------------------------------------------------------- the 2017 paper's base model

PAPER_BASE = dict(family='encoder_decoder', vocab_size=37000, d_model=512, num_heads=8,
                  d_ff=2048, num_layers=6, norm='layernorm', norm_position='post',
                  position='sinusoidal', ffn='relu', dropout=0.1, scale_embeddings=True,
                  share_embeddings=True, tie_embeddings=True, use_bias=True)


def _paper_param_count(V=37000, d=512, d_ff=2048, n_enc=6, n_dec=6):
  """Vaswani et al. 2017, base model, counted from the architecture (biases included)."""
  embedding = V * d  # one table: source, target and the pre-softmax projection share it
  attention = 4 * (d * d + d)  # W_Q, W_K, W_V, W_O with biases
  ffn = d * d_ff + d_ff + d_ff * d + d  # two linear maps with biases
  layer_norm = 2 * d  # gain and bias
  encoder_layer = attention + ffn + 2 * layer_norm
  decoder_layer = 2 * attention + ffn + 3 * layer_norm  # self + cross attention
  return embedding + n_enc * encoder_layer + n_dec * decoder_layer  # no final norm (post-LN)


def test_paper_base_model_is_expressible_exactly():
  cfg = tx.ModelConfig(**PAPER_BASE)
  model = tx.build_model(cfg)
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda s, t: model.init(jax.random.key(0), s, t), tokens, tokens)
  params = nn.unbox(shapes['params'])
  expected = _paper_param_count()
  assert expected == 63_082_496  # ≈ 63M (the paper's table 3 quotes 65M with its vocabulary)
  assert tx.count_params(params) == expected

  flat = {jax.tree_util.keystr(p): x.shape
          for p, x in jax.tree_util.tree_leaves_with_path(params)}
  tables = [k for k, shape in flat.items() if shape == (37000, 512)]
  assert tables == ["['embed']['embedding']"]  # shared by encoder, decoder and the softmax
  assert not any('final_norm' in k or 'lm_head' in k for k in flat)  # tied pre-softmax
  assert not any('position' in k for k in flat)  # sinusoids have no parameters
  assert len([k for k in flat if "['encoder']" in k and 'layer_' in k and 'kernel' in k]) == 6 * 6
  assert len([k for k in flat if "['decoder']" in k and 'cross_attention' in k
              and 'kernel' in k]) == 6 * 4
  # The paper's embedding scale, dropout on every sublayer and on the embeddings.
  assert layer_configs.embed_config(cfg, cfg.vocab_size).scale_by_sqrt_dim
  assert all(b.dropout == 0.1 for b in layer_configs.block_configs(cfg, 6, cross=True))
  assert all(b.norm_position == 'post' and b.ffn.activation == 'relu'
             for b in layer_configs.block_configs(cfg, 6))


def test_embedding_scaled_by_sqrt_d_model():
  cfg = tx.ModelConfig(**PAPER_BASE)
  embed = Embed(layer_configs.embed_config(cfg, 50).replace(d_model=512))
  tokens = jnp.array([[1, 7, 49]])
  variables = embed.init(jax.random.key(0), tokens)
  table = nn.unbox(variables['params'])['embedding']
  np.testing.assert_allclose(embed.apply(variables, tokens), table[tokens] * math.sqrt(512),
                             rtol=1e-6)
  unscaled = Embed(EmbedConfig(vocab_size=50, d_model=512))
  np.testing.assert_allclose(unscaled.apply(variables, tokens), table[tokens], rtol=1e-6)
