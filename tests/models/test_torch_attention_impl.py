"""model.attention_impl=torch: every family's logits and gradients as with 'xla'."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx

pytest.importorskip('torch')

# Row 0 packs two sequences (a block-diagonal causal mask); row 1 ends in padding.
SEGMENTS = jnp.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 0, 0]], jnp.int32)


@pytest.mark.parametrize('impl', ['torch', 'torch_block'])
@pytest.mark.parametrize('family', ['decoder', 'encoder', 'encoder_decoder'])
def test_torch_attention_equals_xla_in_every_family(tm, family, impl):
  """Self-attention (causal in query blocks, bidirectional, packed) and cross-attention
  over a padded source: the loss and every parameter's gradient agree ('torch_block': the
  self-attention blocks whole in torch, cross-attention as 'torch')."""
  cfg = tm.tiny(family, attention_causal_blocks=3)
  _, variables = tm.build(cfg)
  args = tm.inputs(cfg)
  kw = {'segment_ids': SEGMENTS} if family == 'decoder' else {}

  def loss_and_grads(impl):
    model = tx.build_model(cfg.replace(attention_impl=impl))
    loss = lambda v: jnp.sum(jnp.sin(model.apply(v, *args, **kw)))
    return jax.jit(jax.value_and_grad(loss))(variables)

  (loss_xla, grads_xla), (loss_torch, grads_torch) = loss_and_grads('xla'), loss_and_grads(impl)
  np.testing.assert_allclose(loss_torch, loss_xla, rtol=1e-5)
  # rtol: gradients of ~50 sum in another order in 'torch_block' (a few float32 ulps)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-6),
                         grads_torch, grads_xla)


@pytest.mark.parametrize('setting, says', [
    (dict(position='alibi'), 'attention bias'), (dict(position='t5'), 'attention bias'),
    (dict(attention_softcap=30.0), 'soft-cap'), (dict(attention_dropout=0.1), 'attention dropout')])
def test_what_the_kernel_cannot_do_is_a_config_error(tm, setting, says):
  """T5 / ALiBi biases, a soft-cap and attention dropout: named when the config is made."""
  for impl in ('torch', 'torch_float32', 'torch_block'):
    with pytest.raises(tx.ConfigError, match=f"model.attention_impl.*'{impl}'.*no {says}"):
      tm.tiny('decoder', attention_impl=impl, **setting)
