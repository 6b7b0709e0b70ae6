"""What the row sources over `PackedRows` share: building the rows, refusing an empty split.

A row source (see tx.data.lm) exposes `num_rows`, `stats` and `batch(keys_B, rows_B)`;
`PackedSource` provides the first two, and `PackedDocs` the feature arrays of a batch
of rows of packed documents, which the LM and MLM sources turn into their batch keys.
"""

from __future__ import annotations

import numpy as np

from tx.data.errors import DataError
from tx.data.packing import Feature, PackedRows


class PackedSource:
  """A row source over `PackedRows` (`self.rows`), with its `num_rows` and `stats`.

  Args:
    features: the aligned features of a row, by name.
    policy, packed, order: as for `PackedRows`.
    empty: the DataError message when no example is kept.
  """

  def __init__(self, features: dict[str, Feature], *, policy: str, packed: bool,
               order: np.ndarray | None, empty: str):
    self.rows = PackedRows(features, policy=policy, packed=packed, order=order)
    self.num_rows, self.stats = self.rows.num_rows, self.rows.stats
    if self.num_rows == 0:
      raise DataError(empty)


class PackedDocs(PackedSource):
  """Documents packed several per row as the one feature `name` (its row_len = data.seq_len)."""

  def __init__(self, name: str, feature: Feature, *, policy: str, order: np.ndarray | None):
    self.name = name
    super().__init__(
        {name: feature}, policy=policy, packed=True, order=order,
        empty=f'data.length_policy: all {len(feature.docs)} documents are longer than '
        f'data.seq_len={feature.row_len}; use data.length_policy=truncate or '
        'data.lm_sampling=windows')

  def docs(self, rows_B: np.ndarray) -> dict[str, np.ndarray]:
    """The feature's {'tokens', 'segment_ids', 'positions' int32 [B, L], 'weights' float32
    [B, L]} (+ 'targets' int32 [B, L] when shifted) for row ids `rows_B` (-1 = padding)."""
    return self.rows.batch(rows_B)[self.name]
