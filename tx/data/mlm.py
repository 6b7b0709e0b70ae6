"""Masked-LM rows (BERT): rows of L tokens with 15% of the ordinary tokens corrupted.

Rows are windows of L tokens of the joined stream (`data.lm_sampling=windows`) or
packed documents, each BOS + tokens + EOS (`packed`, with segment ids and
positions). Of the ordinary (non-special) tokens, `data.mlm_probability` are
selected; a selected token becomes MASK with probability `mlm_mask_fraction`, a
random ordinary token with `mlm_random_fraction`, and stays as it is otherwise.
PAD, BOS, EOS, UNK and MASK are never selected and never drawn as replacements.
`data.mlm_max_predictions` P > 0 keeps at most P selected positions a row (those with the
lowest selection draws), so the MLM head can run at P positions a row (tx.tasks.MLMTask).

A tokenizer with its own special ids (data.tokenizer=hf, e.g. a converted BERT) gives
`Masking` its MASK id and the set of its special ids ([CLS], [SEP], [PAD], [UNK], [MASK],
...): those are never selected, and replacements are drawn from the other ids. Its window
rows (`MLMWindows` with prefix/suffix) are framed as its post-processor frames a text,
BERT: [CLS] + L - 2 tokens of the stream + [SEP], then its PAD (which must be id 0, tx's
padding) after a short last window.

The random draws are a counter-based hash of (seed, row position in the data
stream, token position), not a stateful generator: a batch is a pure function of
its row positions, so iterator checkpoints need no RNG state, and a global batch
is masked identically whatever the number of processes sharing it.

Batch keys (B rows of L = data.seq_len):
  inputs [B, L] int32 (corrupted), targets [B, L] int32 (original tokens),
  weights [B, L] float32 (1 exactly on selected positions)
  packed only: segment_ids [B, L], positions [B, L]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tx.data.errors import DataError
from tx.data.lm import Windows
from tx.data.packing import Feature, Ragged
from tx.data.rows import PackedDocs
from tx.data.tokenizers.specials import BOS_ID, EOS_ID, MASK_ID, NUM_SPECIALS

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
  """splitmix64 finalizer on uint64 arrays [...] (wrapping arithmetic): a good 64-bit hash."""
  x = x ^ (x >> np.uint64(30))
  x = x * np.uint64(0xBF58476D1CE4E5B9)
  x = x ^ (x >> np.uint64(27))
  x = x * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def hash_uniforms(seed: int, keys_B: np.ndarray, length: int, count: int) -> list[np.ndarray]:
  """`count` arrays of uint64 [B, length] random bits, a pure function of (seed, key, position)."""
  with np.errstate(over='ignore'):
    seed_hash = splitmix64(np.full(1, seed % 2**64, np.uint64) + _GOLDEN)
    base = splitmix64(np.asarray(keys_B, np.uint64) + seed_hash)
    x = base[:, None] + np.arange(1, length + 1, dtype=np.uint64)[None] * _GOLDEN
    out = []
    for _ in range(count):
      x = splitmix64(x + _GOLDEN)
      out.append(x)
  return out


def _unit(bits: np.ndarray) -> np.ndarray:
  """Uniform float64 in [0, 1) from uint64 bits."""
  return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclasses.dataclass(frozen=True)
class Masking:
  """BERT corruption rates; see `mask_tokens`."""
  vocab_size: int
  seed: int = 0
  probability: float = 0.15
  mask_fraction: float = 0.8
  random_fraction: float = 0.1
  mask_id: int = MASK_ID
  special_ids: tuple[int, ...] | None = None  # None: tx's ids 0 .. NUM_SPECIALS - 1
  max_predictions: int = 0  # > 0: at most this many selected positions per row

  def __post_init__(self):
    if self.special_ids is None:
      if self.vocab_size <= NUM_SPECIALS:
        raise DataError(f'data.tokenizer: vocabulary of {self.vocab_size} has no ordinary tokens')
      return
    special = np.zeros(self.vocab_size, bool)
    special[[i for i in self.special_ids if 0 <= i < self.vocab_size]] = True
    if special.all():
      raise DataError(f'data.tokenizer: vocabulary of {self.vocab_size} has no ordinary tokens')
    object.__setattr__(self, '_special', special)
    object.__setattr__(self, '_ordinary', np.flatnonzero(~special).astype(np.int32))

  def is_ordinary(self, tokens: np.ndarray) -> np.ndarray:
    """bool, True where a token may be selected (not special, inside the vocabulary)."""
    if self.special_ids is None:
      return tokens >= NUM_SPECIALS
    inside = (tokens >= 0) & (tokens < self.vocab_size)
    return inside & ~self._special[np.clip(tokens, 0, self.vocab_size - 1)]

  def random_ids(self, bits: np.ndarray) -> np.ndarray:
    """int32 ordinary ids drawn by uint64 `bits`."""
    if self.special_ids is None:
      return (NUM_SPECIALS + bits % np.uint64(self.vocab_size - NUM_SPECIALS)).astype(np.int32)
    return self._ordinary[(bits % np.uint64(len(self._ordinary))).astype(np.int64)]


def mask_tokens(tokens_BL: np.ndarray, keys_B: np.ndarray, m: Masking) -> dict[str, np.ndarray]:
  """BERT masking of a batch.

  Args:
    tokens_BL: int32 [B, L] original tokens.
    keys_B: int [B] the rows' global positions (seed the per-row randomness).
    m: rates, vocabulary size and seed.
  Returns:
    {'inputs' int32 [B, L] corrupted, 'targets' int32 [B, L] = tokens_BL,
     'weights' float32 [B, L] = 1 on selected positions}.
  With `m.max_predictions` P > 0 a row keeps at most P selected positions: those with the
  lowest selection draws, a uniformly random P of its selected ones.
  """
  select_bits, kind_bits, id_bits = hash_uniforms(m.seed, keys_B, tokens_BL.shape[1], 3)
  draws = _unit(select_bits)
  selected = m.is_ordinary(tokens_BL) & (draws < m.probability)
  if 0 < m.max_predictions < tokens_BL.shape[1]:
    selected &= lowest_per_row(np.where(selected, draws, np.inf), m.max_predictions)
  kind = _unit(kind_bits)
  to_mask = selected & (kind < m.mask_fraction)
  to_random = selected & ~to_mask & (kind < m.mask_fraction + m.random_fraction)
  random_ids = m.random_ids(id_bits)
  inputs = np.where(to_mask, m.mask_id, np.where(to_random, random_ids, tokens_BL))
  return {'inputs': inputs.astype(np.int32), 'targets': tokens_BL.astype(np.int32),
          'weights': selected.astype(np.float32)}


def lowest_per_row(values_BL: np.ndarray, count: int) -> np.ndarray:
  """bool [B, L]: True at the `count` lowest finite values of each row of float [B, L] (ties
  by position; +inf is never picked)."""
  order = np.argsort(values_BL, axis=1, kind='stable')[:, :count]
  keep = np.zeros(values_BL.shape, bool)
  np.put_along_axis(keep, order, True, axis=1)
  return keep & np.isfinite(values_BL)


class MLMWindows:
  """MLM rows from windows of L tokens (eval: non-overlapping, last one padded).

  prefix / suffix: ids framing every row (a checkpoint tokenizer's, BERT: [CLS] / [SEP]);
  a row is then prefix + L - len(prefix) - len(suffix) stream tokens + suffix, the suffix
  right after the last real token, padding (id 0) after it; an all-padding row stays 0.
  """

  def __init__(self, stream: np.ndarray, seq_len: int, masking: Masking, *, train: bool,
               prefix: tuple[int, ...] = (), suffix: tuple[int, ...] = ()):
    self.prefix, self.suffix = tuple(prefix), tuple(suffix)
    width = seq_len - len(self.prefix) - len(self.suffix)
    if width < 1:
      raise DataError(f'data.seq_len: {seq_len} leaves no room for text between the '
                      f'tokenizer\'s {len(self.prefix)} + {len(self.suffix)} framing ids')
    self.windows = Windows(stream, width, stride=width, train=train)
    self.masking = masking
    self.num_rows, self.stats = self.windows.num_rows, self.windows.stats

  def batch(self, keys_B: np.ndarray, rows_B: np.ndarray) -> dict[str, np.ndarray]:
    """{'inputs', 'targets' int32 [B, L], 'weights' float32 [B, L]}."""
    tokens, valid = self.windows.tokens(rows_B)
    if self.prefix or self.suffix:
      tokens = self._frame(tokens, valid)
    return mask_tokens(tokens, keys_B, self.masking)

  def _frame(self, body_BW: np.ndarray, valid_BW: np.ndarray) -> np.ndarray:
    """int32 [B, L]: prefix + the valid body + suffix, then 0 (valid is a prefix per row)."""
    B, W = body_BW.shape
    P, S = len(self.prefix), len(self.suffix)
    n_B = valid_BW.sum(1)
    real_B = n_B > 0
    out = np.zeros((B, P + W + S), np.int32)
    out[:, P:P + W] = np.where(valid_BW, body_BW, 0)
    if P:
      out[:, :P] = np.where(real_B[:, None], np.asarray(self.prefix, np.int32)[None], 0)
    rows = np.flatnonzero(real_B)
    for j, s in enumerate(self.suffix):
      out[rows, P + n_B[rows] + j] = s
    return out


class MLMPacked(PackedDocs):
  """MLM rows of packed documents (prefix + tokens + suffix each, cut to L: tx's BOS ... EOS,
  a converted BERT's [CLS] ... [SEP]), with segment ids."""

  def __init__(self, docs: Ragged, seq_len: int, masking: Masking, *, policy: str,
               order: np.ndarray | None = None, prefix: tuple[int, ...] = (BOS_ID,),
               suffix: tuple[int, ...] = (EOS_ID,)):
    super().__init__('mlm', Feature(docs, seq_len, prefix, suffix), policy=policy, order=order)
    self.masking = masking

  def batch(self, keys_B: np.ndarray, rows_B: np.ndarray) -> dict[str, np.ndarray]:
    """{'inputs', 'targets', 'segment_ids', 'positions' int32 [B, L], 'weights' float32 [B, L]}."""
    d = self.docs(rows_B)
    out = mask_tokens(d['tokens'], keys_B, self.masking)
    out.update(segment_ids=d['segment_ids'], positions=d['positions'])
    return out
