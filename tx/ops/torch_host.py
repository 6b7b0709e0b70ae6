"""Host-side helpers for the ops that call PyTorch's CPU kernels from XLA through
`jax.pure_callback` (tx/ops/torch_attention.py, tx/ops/torch_matmul.py): the lazy import
and zero-copy views between a callback's numpy arrays and torch tensors."""

from __future__ import annotations

import functools
import warnings

import jax.numpy as jnp
import numpy as np


@functools.cache
def torch_module():
  """The torch module; a one-line ValueError naming the extra to install if it is missing."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("implementation='torch' needs PyTorch: pip install -e '.[interop]', "
                     "or use implementation='xla'") from None
  return torch


def as_tensor(x):
  """A torch view of a callback's host array (read-only: torch warns, nothing writes it)."""
  torch, x = torch_module(), np.asarray(x)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', UserWarning)
    if x.dtype == jnp.bfloat16:  # numpy knows bfloat16 only through ml_dtypes: reinterpret
      return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def as_array(t):
  """The numpy array of a contiguous torch tensor (bfloat16 through an int16 view)."""
  torch = torch_module()
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(jnp.bfloat16)
  return t.numpy()
