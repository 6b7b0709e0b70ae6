"""matmul_impl='torch': dense products in PyTorch's CPU GEMM called from XLA, against XLA's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.ops import matmul
from tx.ops.torch_matmul import torch_matmul

pytest.importorskip('torch')


def _operands(dtype=jnp.float32, shape=(2, 6, 8), features=(3, 4)):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
  w = jnp.asarray(rng.standard_normal((shape[-1], *features), np.float32), dtype)
  return x, w


def _value_and_grads(impl, x, w):
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(
      x.shape[:-1] + w.shape[1:], np.float32))

  def loss(x, w):
    y = matmul.dense(x, w, impl=impl)
    return jnp.sum(y.astype(jnp.float32) * cotangent), y

  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, w)
  return y, grads


def test_float32_equals_xla_forward_and_backward():
  """[2, 6, 8] · [8, 3, 4]: the product and both gradients as XLA's, same shapes and dtypes."""
  x, w = _operands()
  y_xla, g_xla = _value_and_grads('xla', x, w)
  y_torch, g_torch = _value_and_grads('torch', x, w)
  assert y_torch.shape == (2, 6, 3, 4) and y_torch.dtype == jnp.float32
  np.testing.assert_allclose(y_torch, y_xla, rtol=1e-5, atol=1e-5)
  for a, b in zip(g_torch, g_xla):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bf16_returns_float32_like_the_xla_path_and_bf16_gradients():
  """bf16 operands: a float32 result (torch's bf16 rounding, widened), bf16 gradients; all
  within bf16 rounding of the XLA path."""
  x, w = _operands(jnp.bfloat16)
  y_xla, g_xla = _value_and_grads('xla', x, w)
  y_torch, g_torch = _value_and_grads('torch', x, w)
  assert y_torch.dtype == y_xla.dtype == jnp.float32
  np.testing.assert_allclose(y_torch, y_xla, rtol=2e-2, atol=2e-2)
  for a, b in zip(g_torch, g_xla):
    assert a.dtype == b.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16])
def test_torch_float32_is_the_low_precision_product_with_float32_accumulation(dtype):
  """impl='torch_float32': bf16 / f16 operands widened for torch's float32 GEMM. Their
  products are exact in float32, so the result is XLA's float32 accumulator to float32
  rounding (not torch's bf16 rounding), and the gradients are XLA's in the operands' dtype."""
  x, w = _operands(dtype, shape=(4, 6, 64))
  y_xla, g_xla = _value_and_grads('xla', x, w)
  y_f32, g_f32 = _value_and_grads('torch_float32', x, w)
  assert y_f32.dtype == jnp.float32
  np.testing.assert_allclose(y_f32, y_xla, rtol=1e-5, atol=1e-5)
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).reshape(64, -1)
  np.testing.assert_allclose(np.asarray(y_f32).reshape(exact.shape), exact, atol=1e-4)
  for a, b in zip(g_f32, g_xla):
    assert a.dtype == b.dtype == dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=1e-2, atol=1e-2)
  jaxpr = str(jax.make_jaxpr(lambda x, w: matmul.dense(x, w, impl='torch_float32'))(x, w))
  assert '_product_into' in jaxpr  # torch's GEMM ran it, not XLA's dot


def test_a_remat_policy_that_saves_products_saves_torchs_too():
  """Under remat('dots_no_batch') the backward pass reuses the forward product: one forward
  callback per product in the jaxpr of the gradient, not two."""
  from tx.models.stack import REMAT_POLICIES  # pylint: disable=import-outside-toplevel
  x, w = _operands(shape=(4, 8))
  f = jax.checkpoint(lambda x, w: jnp.sum(jnp.tanh(torch_matmul(x, w))),
                     policy=REMAT_POLICIES['dots_no_batch'])
  jaxpr = str(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, w.reshape(8, 12)))
  assert jaxpr.count('_product_into') == 1 and jaxpr.count('_gradients_into') == 1


def test_other_dtypes_and_a_missing_torch_are_one_line_errors(missing_torch_is_a_one_line_error):
  x, w = _operands(jnp.float16)
  with pytest.raises(ValueError, match="matmul_impl='torch' takes two float32 or two bfloat16"):
    matmul.dense(x, w, impl='torch')
  missing_torch_is_a_one_line_error(lambda: matmul.dense(*_operands(), impl='torch'))
  with pytest.raises(ValueError, match="'torch_float32' takes two float32, two bfloat16 or"):
    matmul.dense(*_operands(jnp.float32)[:1], _operands(jnp.bfloat16)[1], impl='torch_float32')


def test_off_the_cpu_the_products_are_xlas_with_a_warning(monkeypatch):
  """A config tuned on a CPU keeps working elsewhere (a GPU's buffers are not the host's)."""
  x, w = _operands()
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  with pytest.warns(UserWarning, match="matmul_impl='torch' is a CPU path: on gpu"):
    y = matmul.dense(x, w, impl='torch')
  with pytest.warns(UserWarning, match='CPU path'):
    jaxpr = str(jax.make_jaxpr(lambda x, w: matmul.dense(x, w, impl='torch'))(x, w))
  assert '_product_into' not in jaxpr
  np.testing.assert_allclose(y, matmul.dense(x, w), rtol=1e-6, atol=1e-6)


_MESH_CHILD = r'''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from tx.ops import matmul
assert jax.device_count() == 8
mesh = jax.make_mesh((4, 2), ('data', 'tensor'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
w = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
for rows in (16, 3):  # split over the devices; too few to split: all of them on each
  x = jax.device_put(jnp.asarray(rng.standard_normal((rows, 5, 8)), jnp.float32),
                     NamedSharding(mesh, P('data' if rows == 16 else None)))
  def grads(impl):
    loss = lambda x, w: jnp.sum(jnp.sin(matmul.dense(x, w, impl=impl)))
    with jax.set_mesh(mesh):
      return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
  (l_xla, g_xla), (l_torch, g_torch) = grads('xla'), grads('torch')
  np.testing.assert_allclose(l_torch, l_xla, rtol=1e-5)
  for a, b in zip(g_torch, g_xla):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
print('ok')
'''


def test_under_a_multi_device_mesh_each_device_multiplies_its_rows(run_on_8_devices):
  """XLA cannot partition a host callback: under `jax.set_mesh` of 8 CPU devices each
  device multiplies its rows and the weight gradient is summed over them (or, when the
  rows do not split, each computes all of them)."""
  run_on_8_devices(_MESH_CHILD)
