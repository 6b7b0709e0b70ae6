"""The attention soft-cap c·tanh(s/c): bounds the scores, and the XLA path's hand-written
backward equals autodiff of the explicit einsum path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.ops import dot_product_attention
from tx.ops.xla_attention import capped_scores


def qkv(seed=0, scale=4.0):
  ks = jax.random.split(jax.random.key(seed), 3)
  q = scale * jax.random.normal(ks[0], (2, 6, 4, 8))
  k = scale * jax.random.normal(ks[1], (2, 6, 2, 8))
  v = jax.random.normal(ks[2], (2, 6, 2, 8))
  return q, k, v


def test_capped_scores_are_bounded_and_close_to_raw_when_small():
  q, k, _ = qkv()
  raw = capped_scores(q, k, 0.35)
  capped = capped_scores(q, k, 0.35, softcap=5.0)
  assert float(jnp.max(jnp.abs(raw))) > 5.0  # the cap has something to do
  assert float(jnp.max(jnp.abs(capped))) <= 5.0
  small = jnp.abs(raw) < 0.5
  np.testing.assert_allclose(np.asarray(capped)[small], np.asarray(raw)[small], atol=2e-3)


@pytest.mark.parametrize('blocks', [1, 3])
def test_xla_path_with_cap_matches_einsum_values_and_gradients(blocks):
  q, k, v = qkv(1)
  mask = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  bias = 0.1 * jax.random.normal(jax.random.key(3), (1, 4, 6, 6))

  def loss(impl, q, k, v, bias):
    out = dot_product_attention(q, k, v, mask=mask, bias=bias, softcap=3.0,
                                implementation=impl, causal_blocks=blocks if impl == 'xla' else 1)
    return jnp.sum(out * jnp.cos(out))

  ref_val, ref_grads = jax.value_and_grad(lambda *a: loss('einsum', *a), argnums=(0, 1, 2, 3))(
      q, k, v, bias)
  val, grads = jax.value_and_grad(lambda *a: loss('xla', *a), argnums=(0, 1, 2, 3))(q, k, v, bias)
  assert float(val) == pytest.approx(float(ref_val), rel=1e-5)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-4, atol=2e-5)


def test_cap_changes_the_output_and_cudnn_refuses_it():
  q, k, v = qkv(2)
  capped = dot_product_attention(q, k, v, softcap=1.0, implementation='xla')
  plain = dot_product_attention(q, k, v, implementation='xla')
  assert float(jnp.max(jnp.abs(capped - plain))) > 1e-3
  with pytest.raises(ValueError, match='soft-cap'):
    dot_product_attention(q, k, v, softcap=1.0, implementation='cudnn')
  with pytest.raises(ValueError, match='softcap must be >= 0'):
    dot_product_attention(q, k, v, softcap=-1.0)
