"""Packing: variable-length examples laid out in fixed-length rows with segment ids.

A split is held as a `Ragged` array (all token ids concatenated, plus offsets), built
once per dataset. Every row format of tx (a packed LM row, an MLM row, a seq2seq pair
with or without packing) is "pieces of examples placed left to right in a row":

    row   = [doc 7 ............][doc 2 .....][doc 9 ..][pad pad]
    segment_ids  1 1 1 1 1 1 1 1  2 2 2 2 2 2  3 3 3 3  0 0
    positions    0 1 2 3 4 5 6 7  0 1 2 3 4 5  0 1 2 3  0 0

`first_fit` decides which examples share a row (a `Plan`); `PackedRows.batch`
gathers the tokens of a batch of rows with vectorized numpy (no Python loop over
tokens), so a batch costs tens of microseconds. Packing is decided once per split
and seed; training reshuffles the rows every epoch, not the contents of a row.

Each feature of a row is a `Feature`: the example's tokens between a prefix and a
suffix of special ids (tx: BOS before, EOS after; a converted checkpoint's tokenizer
its own), "the full sequence", cut to the row. With `shift=True` the
feature yields `inputs = full[:-1]` and `targets = full[1:]` (teacher forcing), so
`targets` never crosses into the next document. Truncation cuts the full sequence,
so a truncated example has no EOS (the model is never taught a false end).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple, Sequence

import numpy as np

from tx.data.errors import DataError
from tx.data.tokenizers.specials import EOS_ID, PAD_ID

# How many rows stay open for first-fit; more bins pack denser but cost time.
NUM_BINS = 16


class Ragged(NamedTuple):
  """Token ids of N examples: `tokens` int32 [T] concatenated, `offsets` int64 [N+1]."""
  tokens: np.ndarray
  offsets: np.ndarray

  @classmethod
  def from_lists(cls, seqs: Sequence[Sequence[int]]) -> 'Ragged':
    """Builds from N python/numpy id sequences."""
    lengths = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(offsets[-1]))
    return cls(tokens, offsets)

  @property
  def lengths(self) -> np.ndarray:
    """int64 [N]: tokens per example (no BOS/EOS)."""
    return np.diff(self.offsets)

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def joined(self, separator: int | None = EOS_ID) -> np.ndarray:
    """int32 [T + N - 1]: all examples in order, `separator` between two (None: none)."""
    if separator is None or len(self) <= 1:
      return self.tokens
    return np.insert(self.tokens, self.offsets[1:-1], np.int32(separator))


@dataclasses.dataclass(frozen=True)
class Feature:
  """One token sequence per example: `prefix + docs[i] + suffix`, cut to `row_len`."""
  docs: Ragged
  row_len: int
  prefix: tuple[int, ...] = ()  # e.g. (BOS_ID,)
  suffix: tuple[int, ...] = ()  # e.g. (EOS_ID,)
  shift: bool = False  # yield inputs/targets = full[:-1] / full[1:]

  def full_lengths(self) -> np.ndarray:
    """int64 [N]: positions each example needs in a row (before cutting)."""
    return self.docs.lengths + len(self.prefix) + len(self.suffix) - self.shift

  def tokens_at(self, example_T: np.ndarray, k_T: np.ndarray) -> np.ndarray:
    """int32 [T]: token k of the full sequence of example e, for each (e, k)."""
    n = self.docs.lengths[example_T]
    j = k_T - len(self.prefix)
    out = np.full(len(k_T), PAD_ID, np.int32)
    before, after = j < 0, (j >= n) & (j - n < len(self.suffix))
    out[before] = np.asarray(self.prefix, np.int32)[k_T[before]]
    out[after] = np.asarray(self.suffix, np.int32)[(j - n)[after]]
    inside = (j >= 0) & (j < n)
    if self.docs.tokens.size:
      out[inside] = self.docs.tokens[self.docs.offsets[example_T[inside]] + j[inside]]
    return out


class Plan(NamedTuple):
  """Which examples share a row: row r holds `members[splits[r]:splits[r+1]]`."""
  members: np.ndarray  # int64 [N']
  splits: np.ndarray  # int64 [R+1]

  @property
  def num_rows(self) -> int:
    return len(self.splits) - 1

  def pieces(self, rows_B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pieces of a batch of rows (-1 = empty row): (slot [P] in 0..B-1, example [P])."""
    rows_B = np.asarray(rows_B, np.int64)
    ok = rows_B >= 0
    safe = np.where(ok, rows_B, 0)
    start, count = self.splits[safe], np.where(ok, self.splits[safe + 1] - self.splits[safe], 0)
    slot = np.repeat(np.arange(len(rows_B)), count)
    first = np.cumsum(count) - count
    idx = np.repeat(start - first, count) + np.arange(int(count.sum()))
    return slot, self.members[idx]


def one_per_row(ids: np.ndarray) -> Plan:
  """A plan with one example per row (no packing)."""
  return Plan(np.asarray(ids, np.int64), np.arange(len(ids) + 1, dtype=np.int64))


def first_fit(ids: np.ndarray, lengths_NF: np.ndarray, capacity: Sequence[int], *,
              num_bins: int = NUM_BINS) -> Plan:
  """Greedy first-fit of examples `ids` (in this order) into rows.

  Args:
    ids: int [N] example ids, in the order to pack (shuffle first for training).
    lengths_NF: int [N, F] positions example i needs in feature f (already <= capacity).
    capacity: F row lengths.
    num_bins: rows kept open; a new row beyond that closes the oldest one.
  Returns:
    A `Plan`; rows appear in the order they were opened.
  """
  cap = tuple(int(c) for c in capacity)
  lengths_NF = np.asarray(lengths_NF, np.int64).reshape(len(ids), len(cap))
  rows: list[list[int]] = []
  open_bins: list[list] = []  # [remaining capacity per feature..., row index]
  for e, need in zip(np.asarray(ids).tolist(), lengths_NF.tolist()):
    for b in open_bins:
      if all(n <= r for n, r in zip(need, b)):
        for f, n in enumerate(need):
          b[f] -= n
        rows[b[-1]].append(e)
        break
    else:
      if len(open_bins) == num_bins:
        open_bins.pop(0)
      open_bins.append([c - n for c, n in zip(cap, need)] + [len(rows)])
      rows.append([e])
  splits = np.zeros(len(rows) + 1, np.int64)
  np.cumsum([len(r) for r in rows], out=splits[1:])
  members = np.fromiter((e for r in rows for e in r), np.int64, int(splits[-1]))
  return Plan(members, splits)


def apply_length_policy(lengths_NF: np.ndarray, capacity: Sequence[int], policy: str
                        ) -> tuple[np.ndarray, dict[str, int]]:
  """Which examples survive `policy` ('truncate' keeps all, 'drop' drops over-long).

  Args:
    lengths_NF: int [N, F] positions each example needs per feature.
    capacity: F row lengths.
  Returns:
    (kept example ids int64 [K], {'examples': N, 'dropped': .., 'truncated': ..}).
  """
  lengths_NF = np.asarray(lengths_NF).reshape(len(lengths_NF), len(capacity))
  over = (lengths_NF > np.asarray(capacity)[None]).any(axis=1)
  n_over = int(over.sum())
  if policy == 'drop':
    kept = np.flatnonzero(~over)
    counts = {'dropped': n_over, 'truncated': 0}
  elif policy == 'truncate':
    kept = np.arange(len(lengths_NF))
    counts = {'dropped': 0, 'truncated': n_over}
  else:
    raise DataError(f'data.length_policy: {policy!r} is not one of truncate, drop')
  return kept.astype(np.int64), {'examples': len(lengths_NF), **counts}


class Placement(NamedTuple):
  """Where each token of a batch of pieces lands (T tokens, B rows of length L)."""
  dest: np.ndarray  # int64 [T]: flat index into [B * L]
  piece: np.ndarray  # int64 [T]: which piece
  within: np.ndarray  # int64 [T]: index inside its piece
  segment_ids: np.ndarray  # int32 [B, L]: 1, 2, ... per piece in its row; 0 = pad
  positions: np.ndarray  # int32 [B, L]: restart at 0 per piece; 0 on pad


def place(slot_P: np.ndarray, length_P: np.ndarray, batch: int, row_len: int) -> Placement:
  """Lays pieces (grouped by slot, in order) left to right in `batch` rows of `row_len`."""
  length_P = np.asarray(length_P, np.int64)
  num = len(slot_P)
  ends = np.cumsum(length_P)
  starts = ends - length_P
  first = np.ones(num, bool)
  first[1:] = slot_P[1:] != slot_P[:-1]
  group = np.maximum.accumulate(np.where(first, np.arange(num), 0)) if num else first.astype(int)
  col0 = starts - starts[group]
  rank = np.arange(num) - group
  piece = np.repeat(np.arange(num), length_P)
  within = np.arange(int(ends[-1]) if num else 0) - starts[piece]
  dest = slot_P[piece] * row_len + col0[piece] + within
  segment_ids = np.zeros(batch * row_len, np.int32)
  positions = np.zeros(batch * row_len, np.int32)
  segment_ids[dest] = rank[piece] + 1
  positions[dest] = within
  return Placement(dest, piece, within, segment_ids.reshape(batch, row_len),
                   positions.reshape(batch, row_len))


class PackedRows:
  """Rows of one or several aligned features (e.g. source and target of a pair).

  Example i occupies `min(full_length_f(i), row_len_f)` positions of feature f in its
  row; `packed=False` puts one example per row. `order` (a permutation of the
  example ids) is the order in which examples are packed; None = dataset order.
  """

  def __init__(self, features: dict[str, Feature], *, policy: str, packed: bool,
               order: np.ndarray | None = None, num_bins: int = NUM_BINS):
    self.features = features
    names = list(features)
    full = np.stack([features[k].full_lengths() for k in names], axis=1)
    capacity = [features[k].row_len for k in names]
    kept, self.stats = apply_length_policy(full, capacity, policy)
    if order is not None:
      rank = np.empty(len(order), np.int64)
      rank[order] = np.arange(len(order))
      kept = kept[np.argsort(rank[kept], kind='stable')]
    self.lengths = np.minimum(full, np.asarray(capacity)[None])  # [N, F], cut to rows
    if packed:
      self.plan = first_fit(kept, self.lengths[kept], capacity, num_bins=num_bins)
    else:
      self.plan = one_per_row(kept)
    used = self.lengths[kept].sum(axis=0)
    self.stats.update(
        kept=len(kept), rows=self.plan.num_rows,
        fill=float(used.sum() / max(1, self.plan.num_rows * sum(capacity))))

  @property
  def num_rows(self) -> int:
    return self.plan.num_rows

  def batch(self, rows_B: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Tokens of a batch of rows (-1 = an all-pad row).

    Returns:
      {feature: {'tokens' [B, L] (inputs when shifted), 'targets' [B, L] (shifted only),
      'weights' [B, L] float32, 'segment_ids' [B, L], 'positions' [B, L]}}, int32.
    """
    slot, example = self.plan.pieces(rows_B)
    out = {}
    for f, (name, feat) in enumerate(self.features.items()):
      row_len, size = feat.row_len, len(rows_B)
      p = place(slot, self.lengths[example, f], size, row_len)
      ex_T = example[p.piece]
      tokens = np.zeros(size * row_len, np.int32)
      tokens[p.dest] = feat.tokens_at(ex_T, p.within)
      d = {'tokens': tokens.reshape(size, row_len), 'segment_ids': p.segment_ids,
           'positions': p.positions, 'weights': (p.segment_ids > 0).astype(np.float32)}
      if feat.shift:
        targets = np.zeros(size * row_len, np.int32)
        targets[p.dest] = feat.tokens_at(ex_T, p.within + 1)
        d['targets'] = targets.reshape(size, row_len)
      out[name] = d
    return out
