"""implementation='torch': PyTorch's CPU flash kernel called from XLA, against the XLA path."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.ops import causal_mask, combine_masks, dot_product_attention, key_padding_mask

pytest.importorskip('torch')

B, L, S, D = 2, 4, 5, 8


def _qkv(H, K, seed=0, length=S, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
               for shape in [(B, L, H, D), (B, length, K, D), (B, length, K, D)])


def _values_and_grads(impl, q, k, v, mask, causal_blocks=1):
  cotangent = jnp.asarray(np.random.default_rng(5).standard_normal(q.shape, np.float32))

  def loss(q, k, v):
    out = dot_product_attention(q, k, v, mask=mask, implementation=impl,
                                causal_blocks=causal_blocks)
    return jnp.sum(out.astype(jnp.float32) * cotangent), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


@pytest.mark.parametrize('H,K', [(4, 4), (4, 2), (4, 1)], ids=['mha', 'gqa', 'mqa'])
def test_equals_the_xla_path_forward_and_backward(H, K):
  """A causal-with-offset + padding mask with one query row that sees nothing (one head):
  the output and the gradients of q, k, v as the XLA path gives them, and exact zeros
  for that row."""
  q, k, v = _qkv(H, K, seed=1)
  valid_BS = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  mask = np.array(jnp.broadcast_to(
      combine_masks(causal_mask(L, S, offset=S - L), key_padding_mask(valid_BS)), (B, H, L, S)))
  mask[1, 0, 2] = False
  mask = jnp.asarray(mask)
  out_torch, grads_torch = _values_and_grads('torch', q, k, v, mask)
  out_xla, grads_xla = _values_and_grads('xla', q, k, v, mask)
  np.testing.assert_allclose(out_torch, out_xla, atol=2e-6)
  for g_torch, g_xla in zip(grads_torch, grads_xla):
    assert g_torch.shape == g_xla.shape and g_torch.dtype == g_xla.dtype
    np.testing.assert_allclose(g_torch, g_xla, atol=2e-5)
  assert np.all(np.asarray(out_torch[1, 2, 0]) == 0.0)
  assert np.all(np.asarray(grads_torch[0][1, 2, 0]) == 0.0)
  assert np.isfinite(np.asarray(grads_torch[1])).all()


def test_without_a_mask_and_with_a_padding_mask_as_given():
  """No mask, a [B, 1, 1, S] padding mask (the kernel reads it unbroadcast), and one that
  hides nothing."""
  q, k, v = _qkv(2, 2, seed=2)
  for mask in (None, key_padding_mask(jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)),
               key_padding_mask(jnp.ones((B, S), bool))):
    out_torch, grads_torch = _values_and_grads('torch', q, k, v, mask)
    out_xla, grads_xla = _values_and_grads('xla', q, k, v, mask)
    np.testing.assert_allclose(out_torch, out_xla, atol=2e-6)
    for g_torch, g_xla in zip(grads_torch, grads_xla):
      np.testing.assert_allclose(g_torch, g_xla, atol=2e-5)


def test_the_host_hands_the_kernel_only_a_mask_that_hides_something():
  """The callback reads the mask's values: one that hides no key is not passed (the kernel
  then skips its add), and the query rows that see no key are found there, for any
  broadcast shape of the mask. Under the causal promise, a square mask that hides no more
  than the causal triangle is not passed either (the kernel's causal mode does that)."""
  from tx.ops.torch_attention import host_mask  # pylint: disable=g-import-not-at-top
  bias = lambda mask: jnp.where(mask, 0.0, -1e9).astype(jnp.float32)
  assert host_mask(None) == (None, None)
  assert host_mask(bias(key_padding_mask(jnp.ones((B, S), bool)))) == (None, None)
  padded = key_padding_mask(jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool))
  attn_mask, blind = host_mask(bias(padded))
  assert tuple(attn_mask.shape) == (B, 1, 1, S) and blind is None
  one_blind = np.ones((B, 3, L, S), bool)
  one_blind[1, 2, 0] = False
  attn_mask, blind = host_mask(bias(jnp.asarray(one_blind)))
  assert tuple(blind.shape) == (B, 3, L, 1)
  assert np.argwhere(blind.numpy()[..., 0]).tolist() == [[1, 2, 0]]
  square = lambda valid: bias(combine_masks(causal_mask(S), key_padding_mask(valid)))
  assert host_mask(square(jnp.ones((B, S), bool)), causal=True) == (None, None)
  attn_mask, blind = host_mask(square(jnp.array([[1, 1, 1, 1, 0], [1] * S], bool)), causal=True)
  assert tuple(attn_mask.shape) == (B, 1, S, S) and blind is None
  assert host_mask(square(jnp.ones((B, S), bool)))[0] is not None  # no promise: kept
  q, k, v = _qkv(3, 3, seed=6)  # the same values as the XLA path, the blind row all zeros
  out_torch, grads_torch = _values_and_grads('torch', q, k, v, jnp.asarray(one_blind))
  out_xla, grads_xla = _values_and_grads('xla', q, k, v, jnp.asarray(one_blind))
  np.testing.assert_allclose(out_torch, out_xla, atol=2e-6)
  for g_torch, g_xla in zip(grads_torch, grads_xla):
    np.testing.assert_allclose(g_torch, g_xla, atol=2e-5)
  assert np.all(np.asarray(out_torch[1, 0, 2]) == 0.0)


def test_a_causal_promise_lets_the_kernel_skip_and_changes_nothing():
  """causal_blocks > 1 (self-attention under a causal mask) runs torch's causal mode with
  the mask on top: the same values as the XLA path's query blocks, and as no promise."""
  q, k, v = _qkv(4, 2, seed=3, length=L)
  mask = causal_mask(L)
  out_causal, grads_causal = _values_and_grads('torch', q, k, v, mask, causal_blocks=2)
  out_plain, grads_plain = _values_and_grads('torch', q, k, v, mask)
  out_xla, grads_xla = _values_and_grads('xla', q, k, v, mask, causal_blocks=2)
  np.testing.assert_allclose(out_causal, out_plain, atol=2e-6)
  np.testing.assert_allclose(out_causal, out_xla, atol=2e-6)
  for g_causal, g_plain, g_xla in zip(grads_causal, grads_plain, grads_xla):
    np.testing.assert_allclose(g_causal, g_plain, atol=2e-5)
    np.testing.assert_allclose(g_causal, g_xla, atol=2e-5)


def test_bf16_inputs_give_bf16_output_and_gradients_close_to_f32():
  q, k, v = _qkv(4, 2, seed=4)
  mask = key_padding_mask(jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool))
  out32, grads32 = _values_and_grads('torch', q, k, v, mask)
  out16, grads16 = _values_and_grads('torch', *(x.astype(jnp.bfloat16) for x in (q, k, v)),
                                     mask)
  assert out16.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads16)
  np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=5e-2)
  for g16, g32 in zip(grads16, grads32):
    np.testing.assert_allclose(np.asarray(g16, np.float32), g32, atol=1e-1)


def test_torch_float32_widens_bf16_inputs_and_returns_their_dtype():
  """implementation='torch_float32': the kernel's float32 path on widened q, k, v, so the
  output and gradients are the float32 kernel's on the same values, rounded to bf16."""
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(4, 2, seed=4))
  mask = key_padding_mask(jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool))
  out, grads = _values_and_grads('torch_float32', q, k, v, mask)
  original = dot_product_attention
  rounded = lambda *a, **kw: original(*a, **kw).astype(jnp.bfloat16)
  with mock.patch(f'{__name__}.dot_product_attention', rounded):  # its cotangent rounded too
    out32, grads32 = _values_and_grads('torch', *(x.astype(jnp.float32) for x in (q, k, v)),
                                       mask)
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  np.testing.assert_array_equal(out, out32.astype(jnp.bfloat16))
  for g, g32 in zip(grads, grads32):
    np.testing.assert_array_equal(g, g32.astype(jnp.bfloat16))
  with pytest.raises(ValueError, match="'torch_float32' takes no bias or soft-cap"):
    dot_product_attention(q, k, v, implementation='torch_float32', softcap=30.0)


@pytest.mark.parametrize('policy,forward_calls',
                         [('dots_no_batch', 1), ('dots', 1), ('attention', 1), ('full', 2)])
def test_remat_policies_that_save_products_keep_the_kernels_output(policy, forward_calls):
  """Under remat('dots_no_batch' / 'dots' / 'attention') the backward pass reuses the
  forward kernel's output and log-sum-exp: one forward callback in the gradient's jaxpr, as
  without remat; 'full' saves nothing and runs it again."""
  from tx.models.stack import REMAT_POLICIES  # pylint: disable=import-outside-toplevel
  q, k, v = _qkv(2, 2, seed=4)

  def loss(q, k, v):
    out = dot_product_attention(q @ jnp.eye(D), k, v, implementation='torch')
    return jnp.sum(jnp.tanh(out))

  rematted = jax.checkpoint(loss, policy=REMAT_POLICIES[policy])
  jaxpr = str(jax.make_jaxpr(jax.grad(rematted, argnums=(0, 1, 2)))(q, k, v))
  assert jaxpr.count('_forward_into') == forward_calls and jaxpr.count('_backward_into') == 1


@pytest.mark.parametrize('kwargs,match', [
    (dict(bias=jnp.zeros((1, 4, L, S))), 'no bias or soft-cap'),
    (dict(softcap=30.0), 'no bias or soft-cap'),
    (dict(return_weights=True), 'cannot return weights'),
])
def test_what_the_kernel_cannot_do_is_a_one_line_error(kwargs, match):
  q, k, v = _qkv(4, 4)
  with pytest.raises(ValueError, match=match):
    dot_product_attention(q, k, v, implementation='torch', **kwargs)


def test_other_dtypes_and_a_missing_torch_are_one_line_errors(missing_torch_is_a_one_line_error):
  q, k, v = _qkv(4, 4, dtype=jnp.float16)
  with pytest.raises(ValueError, match='float32 or bfloat16'):
    dot_product_attention(q, k, v, implementation='torch')
  missing_torch_is_a_one_line_error(
      lambda: dot_product_attention(*_qkv(4, 4), implementation='torch'))


def test_off_the_cpu_attention_is_xlas_with_a_warning(monkeypatch):
  """A config tuned on a CPU keeps working elsewhere (a GPU's buffers are not the host's)."""
  q, k, v = _qkv(4, 2, seed=6)
  mask = key_padding_mask(jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool))
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  with pytest.warns(UserWarning, match="implementation='torch' is a CPU path: on gpu"):
    jaxpr = str(jax.make_jaxpr(lambda q, k, v: dot_product_attention(
        q, k, v, mask=mask, implementation='torch'))(q, k, v))
  assert '_forward_into' not in jaxpr
  with pytest.warns(UserWarning, match='CPU path'):
    out = dot_product_attention(q, k, v, mask=mask, implementation='torch')
  np.testing.assert_allclose(out, dot_product_attention(q, k, v, mask=mask,
                                                        implementation='xla'), atol=1e-6)


_MESH_CHILD = r'''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from tx import ops
assert jax.device_count() == 8
mesh = jax.make_mesh((4, 2), ('data', 'tensor'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
for batch in (8, 2):  # split over the devices; too small to split: whole on each
  q, k, v = (jax.device_put(jnp.asarray(rng.standard_normal((batch, 16, 4, 8)), jnp.float32),
                            NamedSharding(mesh, P('data' if batch == 8 else None)))
             for _ in range(3))
  valid = jnp.ones((batch, 16), bool).at[:, 12:].set(False)
  for make_mask in (ops.key_padding_mask, lambda valid: ops.causal_mask(16)):
    def grads(impl):
      loss = lambda q, k, v, valid: jnp.sum(ops.dot_product_attention(
          q, k, v, mask=make_mask(valid), implementation=impl) ** 2)
      with jax.set_mesh(mesh):
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, valid)
    for a, b in zip(grads('xla'), grads('torch')):
      np.testing.assert_allclose(a, b, atol=2e-5)
print('ok')
'''


def test_under_a_multi_device_mesh_each_device_calls_the_kernel(run_on_8_devices):
  """XLA cannot partition a host callback: under `jax.set_mesh` of 8 CPU devices each
  device runs its share of the batch (or, when the batch does not split, all of it)."""
  run_on_8_devices(_MESH_CHILD)
