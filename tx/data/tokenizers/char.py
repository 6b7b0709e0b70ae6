"""`CharTokenizer`: one id per character seen in the training text.

Vocabulary = the 5 specials + the sorted distinct characters of the training
text (tiny shakespeare: 5 + 65 = 70). Characters not seen in training map to UNK.
"""

from __future__ import annotations

import pathlib
from typing import Any, Iterable, Sequence

import numpy as np

from tx.data.errors import DataError
from tx.data.tokenizers import specials
from tx.data.tokenizers.base import Tokenizer, as_ids, keep_text_ids


class CharTokenizer(Tokenizer):
  """Characters -> ids; id of `chars[i]` is NUM_SPECIALS + i."""

  kind = 'char'

  def __init__(self, chars: Sequence[str]):
    """`chars`: distinct single characters, in id order."""
    chars = list(chars)
    if any(len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
      raise ValueError('CharTokenizer needs distinct single characters')
    self.chars = tuple(chars)
    self._ids = {c: i + specials.NUM_SPECIALS for i, c in enumerate(chars)}
    self._table = [''] * specials.NUM_SPECIALS + list(chars)
    self._table[specials.UNK_ID] = specials.REPLACEMENT

  @classmethod
  def train(cls, texts: Iterable[str]) -> CharTokenizer:
    """A tokenizer over the sorted distinct characters of `texts`."""
    seen: set[str] = set()
    for text in texts:
      seen.update(text)
    if not seen:
      raise DataError('char tokenizer: the training text is empty; '
                      'check data.dataset / data.files point at non-empty text')
    return cls(sorted(seen))

  @property
  def vocab_size(self) -> int:
    return specials.NUM_SPECIALS + len(self.chars)

  def encode(self, text: str) -> list[int]:
    """Ids of the characters of `text` (unknown ones -> UNK), without BOS/EOS."""
    get = self._ids.get
    return [get(c, specials.UNK_ID) for c in text]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; PAD/BOS/EOS/MASK skipped, UNK and unknown ids give U+FFFD."""
    table, n = self._table, len(self._table)
    return ''.join(table[i] if 0 <= i < n else specials.REPLACEMENT
                   for i in keep_text_ids(as_ids(ids)).tolist())

  def _byte_table(self) -> np.ndarray:
    # surrogatepass: lone surrogates (from errors='surrogateescape' reads) still count.
    return np.array([len(c.encode('utf-8', 'surrogatepass')) for c in self._table], np.int64)

  def _header_fields(self) -> dict[str, Any]:
    return {'chars': list(self.chars)}

  @classmethod
  def from_header(cls, header: dict[str, Any], path: pathlib.Path) -> CharTokenizer:
    """Restores the character list saved in the header."""
    del path
    return cls(header['chars'])
