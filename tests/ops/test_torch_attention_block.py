"""attention_impl='torch_block': self-attention's projections and PyTorch's flash kernel in one
callback each way, against the same block computed by XLA."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx import ops
from tx.layers.attention import AttentionConfig, MultiHeadAttention

pytest.importorskip('torch')

B, L, D, H, E = 2, 6, 12, 3, 4


def _block_args(seed=0, dtype=jnp.float32, biases=True):
  rng = np.random.default_rng(seed)
  normal = lambda *shape, scale=1.0: jnp.asarray(rng.standard_normal(shape) * scale, dtype)
  x = normal(B, L, D)
  weights = (normal(D, H, E, scale=0.3), normal(D, H, E, scale=0.3), normal(D, H, E, scale=0.3),
             normal(H, E, D, scale=0.3))
  bs = (normal(H, E), normal(H, E), normal(H, E), normal(D)) if biases else None
  return x, weights, bs


def _xla_block(x, weights, biases, mask, scale, causal_blocks=1):
  wq, wk, wv, wo = weights
  bq, bk, bv, bo = biases or (0.0,) * 4
  project = lambda w, b: jnp.einsum('bld,dhe->blhe', x, w) + b
  a = ops.dot_product_attention(project(wq, bq), project(wk, bk), project(wv, bv), mask=mask,
                                scale=scale, implementation='xla', causal_blocks=causal_blocks)
  return jnp.einsum('blhe,hed->bld', a, wo) + bo


def _value_and_grads(block, x, weights, biases):
  cotangent = jnp.asarray(np.random.default_rng(9).standard_normal((B, L, D)), jnp.float32)
  loss = lambda *args: jnp.sum(block(*args).astype(jnp.float32) * cotangent)
  argnums = (0, 1, 2) if biases is not None else (0, 1)
  return jax.jit(jax.value_and_grad(loss, argnums=argnums))(x, weights, biases)


@pytest.mark.parametrize('causal', [False, True], ids=['padding', 'causal'])
def test_equals_xlas_block_forward_and_backward(causal):
  """A padding mask (causal: with the causal triangle and the kernel's causal mode) and one
  head's query row that sees no key: the loss and every gradient (x, the four weights, the
  four biases) as XLA computes the same block; without biases too."""
  mask = np.broadcast_to(ops.key_padding_mask(jnp.array([[1] * L, [1] * 4 + [0] * 2], bool)),
                         (B, H, L, L)).copy()
  if causal:
    mask &= np.tril(np.ones((L, L), bool))
  mask[1, 2, 3] = False  # one head's query row sees no key
  mask = jnp.asarray(mask)
  for biases in (True, False):
    x, weights, bs = _block_args(seed=1, biases=biases)
    torch_block = lambda x, w, b: ops.torch_attention_block(x, *w, b, mask, 0.5, causal=causal)
    xla_block = lambda x, w, b: _xla_block(x, w, b, mask, 0.5, causal_blocks=2 if causal else 1)
    loss, grads = _value_and_grads(torch_block, x, weights, bs)
    loss_xla, grads_xla = _value_and_grads(xla_block, x, weights, bs)
    np.testing.assert_allclose(loss, loss_xla, rtol=1e-5)
    for g, g_xla in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_xla)):
      assert g.shape == g_xla.shape and g.dtype == g_xla.dtype
      np.testing.assert_allclose(g, g_xla, atol=5e-5)


def test_bf16_block_close_to_float32_and_in_bf16():
  x, weights, bs = _block_args(seed=2)
  mask = ops.key_padding_mask(jnp.array([[1] * L, [1] * 3 + [0] * 3], bool))
  block = lambda x, w, b: ops.torch_attention_block(x, *w, b, mask, 0.5)
  loss32, grads32 = _value_and_grads(block, x, weights, bs)
  to16 = lambda tree: jax.tree.map(lambda a: a.astype(jnp.bfloat16), tree)
  loss16, grads16 = _value_and_grads(block, to16(x), to16(weights), to16(bs))
  assert all(g.dtype == jnp.bfloat16 for g in jax.tree.leaves(grads16))
  np.testing.assert_allclose(loss16, loss32, rtol=3e-2)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads32))
  for g16, g32 in zip(jax.tree.leaves(grads16), jax.tree.leaves(grads32)):  # dbk is ~0
    np.testing.assert_allclose(np.asarray(g16, np.float32), g32, atol=0.03 * scale)


@pytest.mark.parametrize('policy,forward_calls', [('dots_no_batch', 1), ('full', 2)])
def test_remat_policies_that_save_products_keep_the_blocks_residuals(policy, forward_calls):
  """Under remat('dots_no_batch') the backward reuses q, k, v, the kernel's output and its
  log-sum-exp: one forward callback in the gradient's jaxpr; 'full' runs it again."""
  from tx.models.stack import REMAT_POLICIES  # pylint: disable=import-outside-toplevel
  x, weights, bs = _block_args(seed=3)
  loss = lambda x, w: jnp.sum(jnp.tanh(ops.torch_attention_block(x @ jnp.eye(D), *w, bs, None,
                                                                 0.5)))
  rematted = jax.checkpoint(loss, policy=REMAT_POLICIES[policy])
  jaxpr = str(jax.make_jaxpr(jax.grad(rematted, argnums=(0, 1)))(x, weights))
  assert jaxpr.count('_forward_into') == forward_calls and jaxpr.count('_backward_into') == 1


def test_mixed_or_other_dtypes_and_a_missing_torch_are_one_line_errors(
    missing_torch_is_a_one_line_error):
  x, weights, bs = _block_args()
  with pytest.raises(ValueError, match="'torch_block' takes float32 or bfloat16"):
    ops.torch_attention_block(x.astype(jnp.float16), *weights, bs, None, 0.5)
  with pytest.raises(ValueError, match='of one dtype'):
    ops.torch_attention_block(x.astype(jnp.bfloat16), *weights, bs, None, 0.5)
  missing_torch_is_a_one_line_error(lambda: ops.torch_attention_block(x, *weights, bs, None, 0.5))


def _layer_calls(cfg, x, **kwargs):
  """(output, the callbacks' names in the gradient's jaxpr) of a MultiHeadAttention layer."""
  layer = MultiHeadAttention(cfg, decode=kwargs.pop('decode', False))
  params = layer.init(jax.random.PRNGKey(0), x, **kwargs)['params']
  loss = lambda p, x: jnp.sum(layer.apply({'params': p}, x, **kwargs) ** 2)
  jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x))
  return layer.apply({'params': params}, x, **kwargs), params, jaxpr


def test_the_layer_runs_its_block_in_two_callbacks_with_the_same_parameters():
  """MultiHeadAttention with implementation='torch_block': the parameters of 'torch' (the
  same names, shapes and values from one seed), the same output, and two callbacks in the
  gradient (against ten: three projections, the kernel and the output projection, each
  way); where the layer does more (RoPE, grouped kv heads) it is 'torch'."""
  x = jnp.asarray(np.random.default_rng(4).standard_normal((B, L, D)), jnp.float32)
  mask = ops.key_padding_mask(jnp.array([[1] * L, [1] * 4 + [0] * 2], bool))
  config = lambda impl, **kw: AttentionConfig(d_model=D, num_heads=H, implementation=impl,
                                              matmul='torch', **kw)
  y_block, params_block, jaxpr_block = _layer_calls(config('torch_block'), x, mask=mask)
  y_torch, params_torch, jaxpr_torch = _layer_calls(config('torch'), x, mask=mask)
  assert jax.tree.structure(params_block) == jax.tree.structure(params_torch)
  for a, b in zip(jax.tree.leaves(params_block), jax.tree.leaves(params_torch)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(y_block, y_torch, atol=2e-6)
  assert jaxpr_block.count('buffer_callback') == 2 and jaxpr_torch.count('buffer_callback') == 10
  positions = jnp.broadcast_to(jnp.arange(L), (B, L))
  for kw, call in ((dict(rope=True), dict(q_pos_BL=positions)), (dict(num_kv_heads=1), {})):
    _, _, jaxpr = _layer_calls(config('torch_block', **kw), x, mask=mask, **call)
    assert '_forward_into' in jaxpr and 'torch_attention_block' not in jaxpr, kw


_MESH_CHILD = r'''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from tx import ops
assert jax.device_count() == 8
mesh = jax.make_mesh((4, 2), ('data', 'tensor'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
normal = lambda *shape: jnp.asarray(rng.standard_normal(shape) * 0.3, jnp.float32)
weights = (normal(16, 2, 8), normal(16, 2, 8), normal(16, 2, 8), normal(2, 8, 16))
biases = (normal(2, 8), normal(2, 8), normal(2, 8), normal(16))
for batch in (8, 2):  # split over the devices; too small to split: whole on each
  x = jax.device_put(normal(batch, 12, 16), NamedSharding(mesh, P('data' if batch == 8 else None)))
  valid = jnp.ones((batch, 12), bool).at[:, 9:].set(False)
  for mask in (ops.key_padding_mask(valid), ops.causal_mask(12)):
    def grads(block):
      loss = lambda x, w, b: jnp.sum(block(x, w, b) ** 2)
      with jax.set_mesh(mesh):
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, weights, biases)
    def xla(x, w, b):
      q, k, v = (jnp.einsum('bld,dhe->blhe', x, wi) + bi for wi, bi in zip(w[:3], b[:3]))
      a = ops.dot_product_attention(q, k, v, mask=mask, implementation='xla')
      return jnp.einsum('blhe,hed->bld', a, w[3]) + b[3]
    torch = lambda x, w, b: ops.torch_attention_block(x, *w, b, mask, 8 ** -0.5)
    for a, b in zip(jax.tree.leaves(grads(xla)), jax.tree.leaves(grads(torch))):
      np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5)
print('ok')
'''


def test_under_a_multi_device_mesh_each_device_computes_its_share(run_on_8_devices):
  """Under `jax.set_mesh` of 8 CPU devices each device computes its share of the batch (or
  all of it when the batch does not split) and the weight gradients are summed."""
  run_on_8_devices(_MESH_CHILD)
