"""`StackedRows`: several row sources read as one, row ids running through them in turn.

Subword regularisation uses it: each sampled segmentation of the training split is its own
row source (lm.py, mlm.py, seq2seq.py), and the union is what the pipeline shuffles, so one
pass over it meets every example once per segmentation, each time cut differently.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class StackedRows:
  """Row r of the stack is row r - start[k] of source k, where start[k] <= r < start[k + 1].

  Args:
    sources: row sources with the same batch keys and shapes (`num_rows`, `stats`,
      `batch(keys_B, rows_B)`).
  """

  def __init__(self, sources: Sequence):
    self.sources = list(sources)
    self.starts = np.cumsum([0] + [s.num_rows for s in self.sources])
    self.num_rows = int(self.starts[-1])
    self.stats = _merged([s.stats for s in self.sources])
    self.stats['segmentations'] = len(self.sources)

  def batch(self, keys_B: np.ndarray, rows_B: np.ndarray) -> dict[str, np.ndarray]:
    """The batch of stacked row ids `rows_B` int64 [B] (-1 = an all-pad row), each row
    built by its own source: {key: [B, ...]} as the sources' `batch` returns."""
    rows_B = np.asarray(rows_B)
    k_B = np.clip(np.searchsorted(self.starts, rows_B, side='right') - 1, 0, None)
    local_B = np.where(rows_B >= 0, rows_B - self.starts[k_B], -1)
    out = {}
    for k in np.unique(k_B):
      sel = k_B == k
      part = self.sources[k].batch(np.asarray(keys_B)[sel], local_B[sel])
      for name, value in part.items():
        if name not in out:
          out[name] = np.empty((len(rows_B),) + value.shape[1:], value.dtype)
        out[name][sel] = value
    return out


def _merged(stats: list[dict]) -> dict:
  """Counts summed over the sources, fractions (floats) averaged."""
  out = {}
  for key in stats[0]:
    values = [s[key] for s in stats if key in s]
    if all(isinstance(v, (int, np.integer)) for v in values):
      out[key] = int(sum(values))
    elif all(isinstance(v, (int, float, np.number)) for v in values):
      out[key] = float(np.mean(values))
    else:
      out[key] = values[0]
  return out
