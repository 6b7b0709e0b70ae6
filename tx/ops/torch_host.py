"""What the ops that call PyTorch's CPU kernels from XLA through
`jax.experimental.buffer_callback` share (tx/ops/torch_attention.py, tx/ops/torch_matmul.py,
tx/ops/torch_norm.py): the lazy PyTorch import, and the split of a row-wise callback over
the devices of a mesh. The callbacks read and write XLA's own buffers through DLPack."""

from __future__ import annotations

import functools

import jax


@functools.cache
def torch_module():
  """The torch module; a one-line ValueError naming the extra to install if it is missing."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("implementation='torch' needs PyTorch: pip install -e '.[interop]', "
                     "or use implementation='xla'") from None
  return torch


def per_device(fn, rows: tuple, weights: tuple, row_outputs: int, summed_outputs: int = 0):
  """fn(*rows, *weights) -> a tuple, under a multi-device mesh (`jax.set_mesh`), where XLA
  cannot partition a host callback: each device takes its share of the rows of `rows`
  (when the devices divide them) and the whole of every weight. fn's first `row_outputs`
  results are split by rows like `rows`, the next `summed_outputs` summed over the devices.
  Without a mesh, fn itself."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return fn(*rows, *weights)
  P = jax.sharding.PartitionSpec
  axes = tuple(mesh.axis_names)
  split = rows[0].shape[0] % mesh.size == 0
  row_spec = P(axes) if split else P()

  def body(*args):
    out = fn(*args)
    summed = tuple(jax.lax.psum(o, axes) if split else o for o in out[row_outputs:])
    return tuple(out[:row_outputs]) + summed

  return jax.shard_map(body, mesh=mesh, in_specs=(row_spec,) * len(rows) + (P(),) * len(weights),
                       out_specs=(row_spec,) * row_outputs + (P(),) * summed_outputs,
                       check_vma=False)(*rows, *weights)
