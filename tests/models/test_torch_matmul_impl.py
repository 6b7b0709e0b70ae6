"""model.matmul_impl=torch: every family's loss and gradients as with 'xla'."""

import jax
import numpy as np
import pytest

import tx

pytest.importorskip('torch')


@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder'])
def test_torch_matmul_equals_xla_in_every_family(tm, family):
  """Attention projections, the FFN (gated), the heads and the tied output projection, in
  a scanned and rematerialised stack: the loss and every parameter's gradient agree."""
  cfg = tm.tiny(family, ffn='swiglu', scan_layers=True, remat='dots_no_batch')
  _, variables = tm.build(cfg)
  loss_xla, grads_xla = tm.loss_and_grads(cfg, variables, matmul_impl='xla')
  loss_torch, grads_torch = tm.loss_and_grads(cfg, variables, matmul_impl='torch')
  np.testing.assert_allclose(loss_torch, loss_xla, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
                         grads_torch, grads_xla)


def test_a_dtype_torch_cannot_multiply_is_a_config_error(tm):
  with pytest.raises(tx.ConfigError, match="model.matmul_impl.*float32 or bfloat16"):
    tm.tiny('decoder', matmul_impl='torch', dtype='float16')
