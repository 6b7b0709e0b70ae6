"""norm_impl='torch': LayerNorm in PyTorch's CPU kernels called from XLA, against XLA's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.layers.norm import Norm, NormConfig
from tx.ops import torch_norm

pytest.importorskip('torch')


def _x(shape=(2, 5, 16), dtype=jnp.float32):
  rng = np.random.default_rng(0)
  return jnp.asarray(3.0 * rng.standard_normal(shape, np.float32) + 1.0, dtype)


def _value_and_grads(cfg: NormConfig, x):
  """Norm(cfg)'s output and the gradients of a weighted sum of it for x and every
  parameter, with non-trivial scale and bias (a zero bias would hide a wrong sign)."""
  norm = Norm(cfg)
  params = norm.init(jax.random.key(0), x)['params']
  params = jax.tree.map(lambda p: p + jnp.linspace(-0.5, 0.5, p.size).reshape(p.shape), params)
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(x.shape, np.float32))

  def loss(params, x):
    y = norm.apply({'params': params}, x)
    return jnp.sum(y.astype(jnp.float32) * cotangent), y

  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
  return y, grads


@pytest.mark.parametrize('settings', [
    dict(kind='layernorm'),
    dict(kind='layernorm', use_bias=False),
    dict(kind='layernorm', scale_offset=True),
], ids=lambda s: '-'.join(f'{k}={v}' for k, v in s.items()))
def test_torchs_norm_equals_xlas_forward_and_backward(settings):
  """[2, 5, 16]: the output and the gradients for x, scale and bias as XLA's Norm."""
  x = _x()
  y_xla, g_xla = _value_and_grads(NormConfig(**settings), x)
  y_torch, g_torch = _value_and_grads(NormConfig(**settings, impl='torch'), x)
  assert y_torch.shape == x.shape and y_torch.dtype == jnp.float32
  np.testing.assert_allclose(y_torch, y_xla, rtol=1e-5, atol=1e-5)
  assert jax.tree.structure(g_torch) == jax.tree.structure(g_xla)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4),
               g_torch, g_xla)


def test_bf16_activations_are_normalised_in_float32_and_returned_in_bf16():
  x = _x(dtype=jnp.bfloat16)
  cfg = dict(kind='layernorm', dtype='bfloat16')
  y_xla, g_xla = _value_and_grads(NormConfig(**cfg), x)
  y_torch, g_torch = _value_and_grads(NormConfig(**cfg, impl='torch'), x)
  assert y_torch.dtype == y_xla.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y_torch, np.float32), np.asarray(y_xla, np.float32),
                             rtol=1e-2, atol=1e-2)
  assert g_torch[1].dtype == jnp.bfloat16
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=2e-2),
               g_torch, g_xla)


def test_bf16_rows_reach_torchs_kernels_in_bf16():
  """No float32 copy of bf16 activations on either side of the callbacks: the forward's
  operand and output and the backward's x, g and dx are bf16, the statistics and the scale's
  and bias's gradients float32."""
  x, s = _x((8, 16), jnp.bfloat16), jnp.ones(16)
  f = lambda x, s, b: jnp.sum(torch_norm.torch_layer_norm(x, s, b, 1e-6).astype(jnp.float32))
  y = torch_norm.torch_layer_norm(x, s, jnp.zeros(16), 1e-6)
  assert y.dtype == jnp.bfloat16
  grads = jax.grad(f, argnums=(0, 1, 2))(x, s, jnp.zeros(16))
  assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.float32, jnp.float32]
  jaxpr = jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(x, s, jnp.zeros(16))
  calls = [e for e in jaxpr.eqns if 'callback' in str(e.primitive)]
  assert len(calls) == 2 and calls[0].invars[0].aval.dtype == jnp.bfloat16
  assert [v.aval.dtype for v in calls[1].invars[:2]] == [jnp.bfloat16, jnp.bfloat16]
  assert calls[1].outvars[0].aval.dtype == jnp.bfloat16


def test_the_kernels_run_in_callbacks():
  x = _x((8, 16))
  f = lambda x, s, b: jnp.sum(torch_norm.torch_layer_norm(x, s, b, 1e-6))
  jaxpr = str(jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(x, jnp.ones(16), jnp.zeros(16)))
  assert jaxpr.count('_layer_norm_into') == 1 and jaxpr.count('_layer_norm_grads_into') == 1


def test_bad_operands_and_a_missing_torch_are_one_line_errors(missing_torch_is_a_one_line_error):
  from tx.config.base import ConfigError  # pylint: disable=import-outside-toplevel
  x, s = _x((8, 16)), jnp.ones(16)
  with pytest.raises(ValueError, match="norm_impl='torch' takes float32 or bfloat16"):
    torch_norm.torch_layer_norm(x.astype(jnp.float16), s, s, 1e-6)
  with pytest.raises(ValueError, match='a float32 scale and bias'):
    torch_norm.torch_layer_norm(x, s.astype(jnp.bfloat16), s, 1e-6)
  with pytest.raises(ConfigError, match="impl: 'torch'.*takes kind=layernorm"):
    NormConfig(kind='rmsnorm', impl='torch')
  missing_torch_is_a_one_line_error(lambda: torch_norm.torch_layer_norm(x, s, s, 1e-6))


def test_off_the_cpu_the_norm_is_xlas_with_a_warning(monkeypatch):
  """A config tuned on a CPU keeps working elsewhere (a GPU's buffers are not the host's)."""
  x = _x()
  want, _ = _value_and_grads(NormConfig(), x)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  with pytest.warns(UserWarning, match="norm_impl='torch' is a CPU path: on gpu"):
    jaxpr = str(jax.make_jaxpr(Norm(NormConfig(impl='torch')).init)(jax.random.key(0), x))
  assert '_layer_norm_into' not in jaxpr
  variables = Norm(NormConfig()).init(jax.random.key(0), x)
  with pytest.warns(UserWarning, match='CPU path'):
    got = Norm(NormConfig(impl='torch')).apply(variables, x)
  np.testing.assert_allclose(got, Norm(NormConfig()).apply(variables, x), rtol=1e-6, atol=1e-6)
  assert want.shape == got.shape


_MESH_CHILD = r'''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from tx.layers.norm import Norm, NormConfig
assert jax.device_count() == 8
mesh = jax.make_mesh((4, 2), ('data', 'tensor'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
for rows in (16, 3):  # split over the devices; too few to split: all of them on each
  x = jax.device_put(jnp.asarray(rng.standard_normal((rows, 5, 8)), jnp.float32),
                     NamedSharding(mesh, P('data' if rows == 16 else None)))
  params = Norm(NormConfig()).init(jax.random.key(0), x)
  def grads(impl):
    norm = Norm(NormConfig(impl=impl))
    loss = lambda v, x: jnp.sum(jnp.sin(norm.apply(v, x)) * jnp.arange(8.0))
    with jax.set_mesh(mesh):
      return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
  (l_xla, g_xla), (l_torch, g_torch) = grads('xla'), grads('torch')
  np.testing.assert_allclose(l_torch, l_xla, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4),
               g_torch, g_xla)
print('ok')
'''


def test_under_a_multi_device_mesh_each_device_normalises_its_rows(run_on_8_devices):
  """Under `jax.set_mesh` of 8 CPU devices each device normalises its rows and the scale
  and bias gradients are summed over them (or each computes all rows when they do not
  split)."""
  run_on_8_devices(_MESH_CHILD)
