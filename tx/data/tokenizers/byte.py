"""`ByteTokenizer`: one id per UTF-8 byte (id = byte + NUM_SPECIALS, vocab 261)."""

from __future__ import annotations

import pathlib
from typing import Any, Iterable

import numpy as np

from tx.data.tokenizers import specials
from tx.data.tokenizers.base import Tokenizer, as_ids, keep_text_ids

_REPLACEMENT_BYTES = specials.REPLACEMENT.encode('utf-8')


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes shifted past the specials; needs no training and round-trips any str.

  Invalid byte sequences (e.g. sampled by a model) decode with errors='replace'.
  """

  kind = 'byte'

  @property
  def vocab_size(self) -> int:
    return 256 + specials.NUM_SPECIALS

  def encode(self, text: str) -> list[int]:
    """Ids of the UTF-8 bytes of `text`, without BOS/EOS."""
    raw = np.frombuffer(text.encode('utf-8'), dtype=np.uint8)
    return (raw.astype(np.int64) + specials.NUM_SPECIALS).tolist()

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; PAD/BOS/EOS/MASK skipped, UNK and unknown ids give U+FFFD."""
    ids = keep_text_ids(as_ids(ids))
    is_byte = (ids >= specials.NUM_SPECIALS) & (ids < self.vocab_size)
    if is_byte.all():
      return bytes((ids - specials.NUM_SPECIALS).astype(np.uint8)).decode('utf-8', 'replace')
    out = bytearray()
    for i, b in zip(ids.tolist(), is_byte.tolist()):
      out += bytes([i - specials.NUM_SPECIALS]) if b else _REPLACEMENT_BYTES
    return out.decode('utf-8', 'replace')

  def _byte_table(self) -> np.ndarray:
    table = np.ones(self.vocab_size, np.int64)
    table[:specials.NUM_SPECIALS] = 0
    table[specials.UNK_ID] = len(_REPLACEMENT_BYTES)
    return table

  def _header_fields(self) -> dict[str, Any]:
    return {}

  @classmethod
  def from_header(cls, header: dict[str, Any], path: pathlib.Path) -> ByteTokenizer:
    """A ByteTokenizer (it has no state to restore)."""
    del header, path
    return cls()
