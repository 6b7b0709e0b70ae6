"""The issue-20 knobs through whole models: they reach every layer of every family, the
parameters are named as documented, and scanned stacks equal unrolled ones."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.models import layer_configs

# Everything that applies to every family (rope also in the encoder-decoder).
COMMON = dict(position='rope', rope_interleaved=True, norm='rmsnorm', qk_norm='rmsnorm',
              sandwich_norm=True, norm_scale_offset=True, query_pre_attn_scalar=2.0,
              rope_scaling=dict(kind='yarn', factor=4.0, original_max_len=8))
KNOBS = {'decoder': dict(COMMON, parallel_block='shared_norm'),
         'encoder': dict(COMMON, parallel_block='two_norms', embed_norm=True),
         'encoder_decoder': dict(COMMON, rope_scaling=dict(kind='llama3', factor=4.0))}


def _paths(params):
  return ['/'.join(str(getattr(k, 'key', k)) for k in p)
          for p, _ in jax.tree_util.tree_flatten_with_path(nn.unbox(params))[0]]


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder'])
def test_knobs_reach_the_layer_configs_of_every_stack(tm, family):
  cfg = tm.tiny(family, **KNOBS[family])
  cross = family == 'encoder_decoder'
  for block in layer_configs.block_configs(cfg, 2, cross=cross):
    attentions = [block.attention] + ([block.cross_attention] if cross else [])
    assert block.norm.scale_offset and block.sandwich_norm
    assert block.parallel == cfg.parallel_block
    assert block.attention.rope_interleaved and block.attention.rope_scaling.kind != 'none'
    # original_max_len None resolves to model.max_len.
    assert block.attention.rope_scaling.original_max_len == (8 if family != 'encoder_decoder'
                                                             else cfg.max_len)
    for a in attentions:
      assert a.qk_norm_scale_offset and a.score_scale == 2.0 ** -0.5
  assert layer_configs.norm_config(cfg).scale_offset


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder'])
def test_every_family_runs_with_the_knobs_and_names_its_norms(tm, family):
  cfg = tm.tiny(family, **KNOBS[family])
  model, variables = tm.build(cfg)
  logits = model.apply(variables, *tm.inputs(cfg))
  assert np.isfinite(np.asarray(logits)).all()
  paths = _paths(variables['params'])
  norms = {p.split('/')[-2] for p in paths
           if p.split('/')[-3:-2] == ['layer_0'] and p.endswith('norm/scale')}  # the block's
  expected = {'decoder': {'shared_norm', 'self_attention_post_norm', 'ffn_post_norm'},
              'encoder': {'self_attention_norm', 'ffn_norm', 'self_attention_post_norm',
                          'ffn_post_norm'},
              'encoder_decoder': {f'{s}_{k}' for s in ('self_attention', 'cross_attention', 'ffn')
                                  for k in ('norm', 'post_norm')}}[family]
  assert norms == expected
  # Turning one knob off changes the output: the knob is live in the model.
  for off in (dict(rope_interleaved=False), dict(query_pre_attn_scalar=None)):
    other = tx.build_model(cfg.replace(**off)).apply(variables, *tm.inputs(cfg))
    assert float(jnp.max(jnp.abs(other - logits))) > 1e-4, off


def test_offset_norms_all_start_at_zero_in_a_real_init(tm):
  """Every norm of the model (blocks, sandwich, q/k, embed, final, MLM head) takes the offset."""
  cfg = tm.tiny('encoder', **KNOBS['encoder'])
  params = nn.unbox(tx.init_params(cfg, jax.random.key(0), batch=2, length=6))
  scales = {p: x for p, x in zip(_paths(params), jax.tree_util.tree_leaves(params))
            if p.endswith('norm/scale')}
  kinds = {p.split('/')[-2] for p in scales}
  assert {'embed_norm', 'final_norm', 'transform_norm', 'query_norm', 'key_norm', 'ffn_post_norm',
          'self_attention_norm'} <= kinds
  for path, x in scales.items():
    np.testing.assert_array_equal(x, 0.0, err_msg=path)


def _unstack(tree):
  if not isinstance(tree, dict):
    return tree
  out = {}
  for name, sub in tree.items():
    if name == 'layers':
      n = jax.tree_util.tree_leaves(sub)[0].shape[0]
      out.update({f'layer_{i}': jax.tree_util.tree_map(lambda x, i=i: x[i], sub)
                  for i in range(n)})
    else:
      out[name] = _unstack(sub)
  return out


@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_scanned_stack_with_knobs_equals_unrolled(tm, family):
  cfg = tm.tiny(family, scan_layers=True, **KNOBS[family])
  scanned, variables = tm.build(cfg)
  params = _unstack(nn.unbox(variables['params']))
  unrolled = tx.build_model(cfg.replace(scan_layers=False))
  np.testing.assert_allclose(tm.jitted(scanned)(variables, *tm.inputs(cfg)),
                             unrolled.apply({'params': params}, *tm.inputs(cfg)), atol=1e-5)
