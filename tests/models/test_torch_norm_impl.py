"""model.norm_impl=torch: a model's LayerNorms in torch's CPU kernel, loss and gradients as
XLA's."""

import jax
import numpy as np
import pytest

import tx

pytest.importorskip('torch')


@pytest.mark.parametrize('family, settings', [
    ('encoder', dict(norm_position='post', embed_norm=True)),  # BERT: embed, block, MLM norms
    ('decoder', dict(scan_layers=True, remat='dots_no_batch')),  # pre-LN + final norm, scanned
])
def test_torch_norms_equal_xlas(tm, family, settings):
  cfg = tm.tiny(family, **settings)
  _, variables = tm.build(cfg)  # random norm scales and biases
  loss_xla, grads_xla = tm.loss_and_grads(cfg, variables, norm_impl='xla')
  loss_torch, grads_torch = tm.loss_and_grads(cfg, variables, norm_impl='torch')
  np.testing.assert_allclose(loss_torch, loss_xla, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4),
                         grads_torch, grads_xla)
  jaxpr = str(jax.make_jaxpr(tx.build_model(cfg.replace(norm_impl='torch')).apply)(
      variables, *tm.inputs(cfg)))
  assert '_layer_norm_into' in jaxpr


def test_an_rmsnorm_model_is_a_config_error(tm):
  with pytest.raises(tx.ConfigError, match="model.norm_impl.*takes model.norm=layernorm"):
    tm.tiny('decoder', norm='rmsnorm', norm_impl='torch')
