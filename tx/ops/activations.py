"""Elementwise activations computed in the form that is cheap on every XLA backend."""

from __future__ import annotations

import jax
import numpy as np


def gelu_exact(x):
  """x [...] -> x · Φ(x), Φ the standard normal CDF, computed as 0.5 · x · (1 + erf(x/√2)).

  The same function as `jax.nn.gelu(x, approximate=False)` (which goes through erfc) to
  float rounding, and the formula PyTorch's exact GELU uses. XLA:CPU expands erfc into both
  of its range branches plus exponentials: the forward of a [4096, 1536] float32 gelu takes
  ~3.6x as long through erfc as through erf (benchmarks/NOTES.md, attempt 36)."""
  sqrt_half = np.sqrt(0.5).astype(jax.numpy.result_type(x))
  return 0.5 * x * (1.0 + jax.lax.erf(x * sqrt_half))
