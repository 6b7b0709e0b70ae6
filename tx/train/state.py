"""`TrainState` and its sharded initialisation."""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from tx.models.build import dummy_inputs
from tx.train.mesh import follow_param_shardings, tree_shardings


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training; one Orbax checkpoint item.

  rng is raw uint32 key data (`jax.random.key_data`), so it checkpoints as a plain array.
  skips counts updates dropped for non-finite loss/gradients (train.nan_policy=skip).
  """
  step: jax.Array
  params: dict
  opt_state: object = None  # any optax state pytree
  rng: jax.Array = None
  skips: jax.Array = None


def _init_boxed(model, optimizer, model_cfg, seed: int):
  """Boxed params (logical names kept) and the optimizer state of the unboxed params."""
  def init():
    rng = jax.random.key(seed)
    init_rng, train_rng = jax.random.split(rng)
    boxed = model.init(init_rng, *dummy_inputs(model_cfg))['params']
    params = nn.unbox(boxed)
    return boxed, TrainState(step=jnp.zeros((), jnp.int32), params=params,
                             opt_state=optimizer.init(params),
                             rng=jax.random.key_data(train_rng),
                             skips=jnp.zeros((), jnp.int32))
  return init


def state_shardings(model, optimizer, model_cfg, mesh, rules, seed: int = 0):
  """(abstract TrainState with shardings, sharding tree) — no memory is used."""
  boxed, abstract = jax.eval_shape(_init_boxed(model, optimizer, model_cfg, seed))
  param_shardings = tree_shardings(boxed, mesh, rules)
  opt_shardings = follow_param_shardings(abstract.opt_state, abstract.params, param_shardings,
                                         mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shardings = TrainState(step=replicated, params=param_shardings, opt_state=opt_shardings,
                         rng=replicated, skips=replicated)
  abstract = jax.tree_util.tree_map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  return abstract, shardings


def init_state(model, optimizer, model_cfg, shardings, seed: int):
  """The initial TrainState, created directly in its shardings (jit with out_shardings)."""
  init = _init_boxed(model, optimizer, model_cfg, seed)
  return jax.jit(lambda: init()[1], out_shardings=shardings)()
