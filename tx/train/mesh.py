"""The device mesh (`mesh.*`) and shardings derived from logical-axis rules.

Layers name the axes of every parameter and key activation ('embed', 'heads', 'mlp',
...); `mesh.rules` maps those names onto mesh axes ('data', 'fsdp', 'tensor'). Nothing
in tx/layers knows about meshes. Defaults shard nothing but the batch, i.e. data
parallel over every device.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from tx.config.base import ConfigError
from tx.config.train import MeshConfig

AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, int, int]:
  """Resolves -1 to 'the rest of the devices'; checks the product equals the device count."""
  sizes = [cfg.data, cfg.fsdp, cfg.tensor]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f'mesh: the fixed axes multiply to {known}, which does not divide the '
                        f'{num_devices} devices; set mesh.fsdp / mesh.tensor to divisors of '
                        f'{num_devices}')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(f'mesh.data x mesh.fsdp x mesh.tensor = {math.prod(sizes)} but there are '
                      f'{num_devices} devices; set one of them to -1')
  return tuple(sizes)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh over `devices` (default: all, every process)."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(cfg, len(devices))
  return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def logical_rules(cfg: MeshConfig):
  """The rules as Flax expects them: ((logical_name, mesh_axes), ...)."""
  return tuple((name, axes) for name, axes in cfg.rules)


def _spec_for(names, shape, mesh: Mesh, rules, where: str) -> P:
  """Mesh PartitionSpec of one array; a dimension the mesh axes don't divide is an error."""
  spec = nn.logical_to_mesh_axes(names, rules)
  for dim, axes in zip(shape, spec):
    if axes is None:
      continue
    size = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
    if dim % size:
      raise ConfigError(f'mesh: {where} has a dimension of {dim} that mesh axes {axes} '
                        f'(size {size}) do not divide; change mesh.* or mesh.rules')
  return spec


def tree_shardings(boxed_tree, mesh: Mesh, rules):
  """NamedShardings for a tree of (abstract) arrays, boxed with logical names or not.

  Boxed leaves (nn.LogicallyPartitioned) are sharded by the rules; plain leaves are
  replicated. The returned tree has the structure of `nn.unbox(boxed_tree)`.
  """
  def one(path, leaf):
    if isinstance(leaf, nn.LogicallyPartitioned):
      value = leaf.value
      spec = _spec_for(leaf.names, value.shape, mesh, rules, jax.tree_util.keystr(path))
      return NamedSharding(mesh, spec)
    return NamedSharding(mesh, P())
  return jax.tree_util.tree_map_with_path(
      one, boxed_tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def follow_param_shardings(tree, params, param_shardings, mesh: Mesh):
  """Shardings for optimizer state: a leaf whose path ends with a parameter's path and
  has that parameter's shape takes its sharding (Adam's mu / nu); the rest replicate.

  tree: (abstract) optimizer state; params / param_shardings: unboxed params and theirs.
  """
  by_path = {}
  for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(params),
                                    jax.tree_util.tree_leaves(param_shardings)):
    by_path[jax.tree_util.keystr(path)] = (tuple(leaf.shape), sharding)

  def one(path, leaf):
    key = jax.tree_util.keystr(path)
    shape = tuple(getattr(leaf, 'shape', ()))
    for param_key, (param_shape, sharding) in by_path.items():
      if key.endswith(param_key) and shape == param_shape:
        return sharding
    return NamedSharding(mesh, P())
  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batch dimension split over ('data', 'fsdp'); everything else replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def batch_divisor(mesh: Mesh) -> int:
  return mesh.shape['data'] * mesh.shape['fsdp']


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's numpy rows -> global jax.Arrays sharded over the batch axes."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


def stacked_sharding(sharding: NamedSharding) -> NamedSharding:
  """`sharding` of a batch, for batches stacked behind a leading (unsplit) axis."""
  return NamedSharding(sharding.mesh, P(None, *sharding.spec))


def global_batches(local_batches: list[dict], mesh: Mesh) -> dict:
  """K of this process's batches -> global jax.Arrays [K, B, ...], each batch sharded over
  the batch axes (the batches of `tx.train.step.consecutive_steps`)."""
  sharding = stacked_sharding(batch_sharding(mesh))
  return {k: jax.make_array_from_process_local_data(
      sharding, np.stack([np.asarray(b[k]) for b in local_batches]))
          for k in local_batches[0]}
