"""Small helpers shared by the Linen layers: dtypes, activations, initialisers, dense layers."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config.choices import DTYPES, FFN_ACTIVATIONS  # noqa: F401 (re-exported)
from tx.ops.activations import gelu_exact
from tx.ops.matmul import dense, dense_dot_general_for

# The elementwise functions that tx.config.choices.FFN_ACTIVATIONS (and model.mlm_activation)
# name; that table says which FFN activation uses which, and whether it is gated.
ACTIVATIONS = {
    'relu': nn.relu,
    'gelu': gelu_exact,
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
    'silu': nn.silu,
}
GATED = {name: a.fn for name, a in FFN_ACTIVATIONS.items() if a.gated}  # derived, for old callers


def activation(name: str):
  """Returns (fn, gated) for an FFN activation name such as 'relu' or 'swiglu'."""
  a = FFN_ACTIVATIONS[name]
  return ACTIVATIONS[a.fn], a.gated


def dtype(name: str):
  """The jnp dtype for a config name ('float32', 'bfloat16', ...)."""
  return jnp.dtype(name)


def partitioned(init, axes: tuple[str | None, ...]):
  """Wraps an initialiser so the parameter carries logical axis names (for sharding rules)."""
  return nn.with_logical_partitioning(init, axes)


def constrain(x, axes: tuple[str | None, ...]):
  """Logical sharding constraint on an activation (a no-op without a mesh and rules)."""
  return nn.with_logical_constraint(x, axes)


default_kernel_init = nn.initializers.xavier_uniform()


def dense_layer(features: int, axes: tuple[str | None, str | None], *, use_bias: bool = True,
                dtype: str = 'float32', param_dtype: str = 'float32',
                kernel_init=default_kernel_init, name: str | None = None,
                matmul: str = 'xla') -> nn.Dense:
  """nn.Dense x [..., in] -> [..., features] with kernel axes `axes` (the bias takes the
  last) and tx's dot_general (tx/ops/matmul.py; matmul 'torch': torch's CPU GEMM); the
  bias starts at zero."""
  return nn.Dense(features, use_bias=use_bias, dtype=jnp.dtype(dtype),
                  param_dtype=jnp.dtype(param_dtype), dot_general=dense_dot_general_for(matmul),
                  kernel_init=partitioned(kernel_init, axes),
                  bias_init=partitioned(nn.initializers.zeros, axes[-1:]), name=name)


def dropout(module: nn.Module, x, rate: float, deterministic: bool):
  """Dropout that skips the RNG entirely when not needed (rate 0 or deterministic)."""
  if rate == 0.0 or deterministic:
    return x
  keep = jax.random.bernoulli(module.make_rng('dropout'), 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


class DenseGeneral(nn.Module):
  """x [..., *in] -> [..., *features] with a kernel of shape [*in, *features].

  Unlike flax's DenseGeneral the kernel is created in its final shape, so logical axis
  names (`axes`, one per kernel dimension) survive under a mesh. Xavier-uniform init
  with fan-in = prod(in) and fan-out = prod(features). matmul: 'xla', or 'torch' for
  torch's CPU GEMM (tx/ops/torch_matmul.py).
  """
  features: tuple[int, ...]
  axes: tuple[str | None, ...]
  in_dims: int = 1
  use_bias: bool = True
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  matmul: str = 'xla'

  @nn.compact
  def __call__(self, x):
    kernel, bias = _dense_weights(self, tuple(x.shape[-self.in_dims:]))
    y = dense(x.astype(dtype(self.dtype)), kernel.astype(dtype(self.dtype)), self.in_dims,
              impl=self.matmul)
    if bias is not None:
      y = y + bias.astype(y.dtype)
    return y


def _dense_weights(module: DenseGeneral, in_shape: tuple[int, ...]):
  """(kernel [*in, *features], bias [*features] or None) of a DenseGeneral, in its param
  dtype. A function, not a method: flax's method interceptors see one call per layer."""
  shape = in_shape + tuple(module.features)
  init = nn.initializers.variance_scaling(
      1.0, 'fan_avg', 'uniform', in_axis=tuple(range(module.in_dims)),
      out_axis=tuple(range(module.in_dims, len(shape))))
  kernel = module.param('kernel', partitioned(init, module.axes), shape,
                        dtype(module.param_dtype))
  bias = None
  if module.use_bias:
    bias = module.param('bias', partitioned(nn.initializers.zeros, module.axes[module.in_dims:]),
                        tuple(module.features), dtype(module.param_dtype))
  return kernel, bias


class DenseWeights(DenseGeneral):
  """DenseGeneral's parameters (the same names, shapes and init) without its product, for ops
  that take a layer's weights and compute its products themselves
  (tx/ops/torch_attention_block.py). in_shape -> (kernel [*in, *features], bias [*features]
  or None), both in `dtype`."""

  @nn.compact
  def __call__(self, in_shape: tuple[int, ...]):  # pylint: disable=arguments-renamed
    kernel, bias = _dense_weights(self, tuple(in_shape))
    cast = lambda w: None if w is None else w.astype(dtype(self.dtype))
    return cast(kernel), cast(bias)
