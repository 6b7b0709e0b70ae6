"""The lazy PyTorch import shared by the ops that call PyTorch's CPU kernels from XLA
through `jax.experimental.buffer_callback` (tx/ops/torch_attention.py,
tx/ops/torch_matmul.py): the callbacks read and write XLA's own buffers through DLPack."""

from __future__ import annotations

import functools


@functools.cache
def torch_module():
  """The torch module; a one-line ValueError naming the extra to install if it is missing."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("implementation='torch' needs PyTorch: pip install -e '.[interop]', "
                     "or use implementation='xla'") from None
  return torch
