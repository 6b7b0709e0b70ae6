"""Scanned layers equal unrolled layers; rematerialisation changes neither outputs nor grads."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx


def _unstack_layers(tree):
  """Scanned layout (stack/layers/... with a leading [N] axis) -> unrolled (stack/layer_i/...)."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for name, sub in tree.items():
    if name == 'layers':
      n = jax.tree_util.tree_leaves(sub)[0].shape[0]
      for i in range(n):
        out[f'layer_{i}'] = jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[i], sub)
    else:
      out[name] = _unstack_layers(sub)
  return out


@pytest.mark.parametrize('family,position', [('decoder', 'rope'), ('encoder', 't5'),
                                             ('encoder_decoder', 'alibi')])
def test_scan_equals_unrolled(tm, family, position):
  """Params in the scanned model's own layout (its init's shapes, random per layer) restacked
  into layer_i entries give the unrolled model the same outputs."""
  cfg = tm.tiny(family, position=position, scan_layers=True, ffn='swiglu')
  scanned, variables = tm.build(cfg)
  params = nn.unbox(variables['params'])
  unrolled_params = _unstack_layers(params)
  stack = (unrolled_params['decoder'] if family != 'encoder' else unrolled_params['encoder'])
  assert {k for k in stack['stack'] if k.startswith('layer')} == {'layer_0', 'layer_1'}
  unrolled = tx.build_model(cfg.replace(scan_layers=False))
  # The restacked tree is exactly the unrolled model's own layout.
  own = jax.eval_shape(unrolled.init, jax.random.key(0), *tm.inputs(cfg))['params']
  assert (jax.tree_util.tree_structure(nn.unbox(own))
          == jax.tree_util.tree_structure(unrolled_params))
  args = tm.inputs(cfg)
  np.testing.assert_allclose(tm.jitted(scanned)(variables, *args),
                             unrolled.apply({'params': unrolled_params}, *args), atol=1e-5)


def _stack_layers(tree):
  """Unrolled layout (stack/layer_i/...) -> scanned (stack/layers/... with a leading [N] axis)."""
  if not isinstance(tree, dict):
    return tree
  layers = sorted((k for k in tree if k.startswith('layer_')), key=lambda k: int(k[6:]))
  out = {k: _stack_layers(v) for k, v in tree.items() if k not in layers}
  if layers:
    out['layers'] = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[tree[k] for k in layers])
  return out


@pytest.mark.slow  # three forward+backward compiles (~3 s each on a 2-core CPU)
def test_remat_keeps_outputs_and_gradients(tm):
  """'full' and 'dots' recompute in the backward pass; logits, loss and grads stay the same.

  'full' on the unrolled stack, 'dots' on the scanned one (params restacked), both
  against the unrolled stack without remat.
  """
  base = tm.tiny('decoder', position='learned')
  _, variables = tm.build(base)
  params = nn.unbox(variables['params'])
  targets = jnp.asarray(np.roll(np.asarray(tm.TOKENS), -1, axis=1))

  def value_and_grad(cfg, p):
    model = tx.build_model(cfg)

    def loss(p):
      logits = model.apply({'params': p}, tm.TOKENS)
      nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)
      return nll.mean(), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(p)

  (ref_loss, ref_logits), ref_grads = value_and_grad(base, params)
  assert max(np.abs(g).max() for g in jax.tree_util.tree_leaves(ref_grads)) > 0
  for cfg, p, restack in [(base.replace(remat='full'), params, lambda g: g),
                          (base.replace(remat='dots', scan_layers=True), _stack_layers(params),
                           _unstack_layers)]:
    (loss, logits), grads = value_and_grad(cfg, p)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5, err_msg=cfg.remat)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, err_msg=cfg.remat)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, err_msg=cfg.remat),
        restack(grads), ref_grads)
