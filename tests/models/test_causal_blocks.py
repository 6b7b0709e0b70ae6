"""model.attention_causal_blocks: decoder self-attention in query blocks that skip the
masked keys computes the same logits and gradients as the full L x L scores."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx

# Row 0 packs two sequences; row 1 ends in padding: blocks must respect both masks.
SEGMENTS = jnp.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 0, 0]], jnp.int32)


@pytest.mark.parametrize('family,position', [('decoder', 'alibi'), ('encoder_decoder', 't5')])
def test_causal_blocks_equal_one_block(tm, family, position):
  """3 blocks of 2 queries over L = 6 (ALiBi / T5 biases are sliced with the scores);
  the encoder's bidirectional attention must not be blocked."""
  cfg = tm.tiny(family, position=position, attention_causal_blocks=1)
  _, variables = tm.build(cfg)
  args = tm.inputs(cfg)
  kw = {'segment_ids': SEGMENTS} if family == 'decoder' else {'tgt_segment_ids': SEGMENTS}

  def loss_and_grads(blocks):
    model = tx.build_model(cfg.replace(attention_causal_blocks=blocks))
    loss = lambda v: jnp.sum(jnp.sin(model.apply(v, *args, **kw)))
    return jax.jit(jax.value_and_grad(loss))(variables)

  (loss_one, grads_one), (loss_blocked, grads_blocked) = loss_and_grads(1), loss_and_grads(3)
  np.testing.assert_allclose(loss_blocked, loss_one, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
                         grads_blocked, grads_one)


def test_causal_blocks_by_length_and_validation():
  from tx.layers.attention import causal_block_count  # pylint: disable=g-import-not-at-top
  assert [causal_block_count(0, n) for n in (6, 64, 128, 256, 2048)] == [1, 1, 2, 4, 4]
  assert causal_block_count(3, 6) == 3
  with pytest.raises(tx.ConfigError, match='attention_causal_blocks'):
    tx.ModelConfig(attention_causal_blocks=-1)
