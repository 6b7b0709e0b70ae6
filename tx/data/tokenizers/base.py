"""The `Tokenizer` interface shared by byte, char and sentencepiece tokenizers.

A tokenizer maps text to ids and back. `encode` adds no BOS/EOS (callers do);
`decode` drops PAD/BOS/EOS/MASK and does not stop at EOS. `num_bytes` counts the
UTF-8 bytes that ids stand for, for bits per byte:

    bpb = total_nats / (ln 2 * total_bytes)

`num_bytes` is a per-id table lookup, so it is additive: the bytes of a token
stream equal the sum over any split of it into windows. For ids that decode to
valid UTF-8 it equals `len(decode(ids).encode())`.

A saved tokenizer is a JSON header (`save(path)`) with a 'kind' field, plus a
sentencepiece `.model` file next to it for 'bpe'/'unigram' (a Hugging Face
`tokenizer.json` for 'hf'). No pickle.

Generation reads the special ids from the tokenizer (`bos_id`, `eos_id`, `prefix_ids`,
`suffix_ids`, `decoder_start_id`, `zero_is_token`): tx's own kinds keep the fixed ids of
`specials`; 'hf' (tx/data/tokenizers/hf.py) has the checkpoint's.
"""

from __future__ import annotations

import abc
import json
import os
import pathlib
import tempfile
from typing import Any, ClassVar, Iterable

import numpy as np

from tx.data.errors import DataError
from tx.data.tokenizers import specials

FORMAT = 'tx-tokenizer'
FORMAT_VERSION = 1


def special(tokenizer, name: str):
  """The tokenizer's `name` (bos_id, eos_id, prefix_ids, ...), or tx's default for it
  (tokenizers written for tests need not define them)."""
  return getattr(tokenizer, name, getattr(Tokenizer, name))


class Tokenizer(abc.ABC):
  """Text <-> ids with the fixed special ids of `tx.data.tokenizers.specials`."""

  kind: ClassVar[str]

  # Special ids as generation and batching use them. tx's kinds: the fixed ids of `specials`;
  # 'hf' overrides them with the checkpoint's (-1 = the tokenizer has none).
  bos_id: int = specials.BOS_ID
  eos_id: int = specials.EOS_ID  # generation stops here; separates documents in LM windows
  decoder_start_id: int = specials.BOS_ID  # encoder-decoder: decoding starts from this id
  prefix_ids: tuple[int, ...] = ()  # put before every prompt and source (LLaMA: its BOS)
  suffix_ids: tuple[int, ...] = (specials.EOS_ID,)  # put after every seq2seq source
  # True where id 0 is an ordinary token (GPT-2's "!"), not only padding: prompts and LM
  # windows then carry explicit validity / segment ids and id 0 may be generated.
  zero_is_token: bool = False
  # ids 0..4 are tx's PAD/BOS/EOS/UNK/MASK; False: the roles above say where its specials are
  uses_tx_specials: bool = True

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids, specials included; every id is in [0, vocab_size)."""

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without BOS/EOS."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; PAD/BOS/EOS/MASK are skipped, UNK and unknown ids give U+FFFD."""

  @abc.abstractmethod
  def _byte_table(self) -> np.ndarray:
    """int64[vocab_size]: UTF-8 bytes each id contributes to decoded text."""

  @abc.abstractmethod
  def _header_fields(self) -> dict[str, Any]:
    """Kind-specific JSON fields written by `save`."""

  @classmethod
  @abc.abstractmethod
  def from_header(cls, header: dict[str, Any], path: pathlib.Path) -> Tokenizer:
    """Rebuilds a tokenizer from the JSON header saved at `path`."""

  def decode_continuation(self, prompt_ids: Iterable[int], new_ids: Iterable[int]) -> str:
    """Text of `new_ids` as it continues `prompt_ids` (tx's kinds: `decode(new_ids)`)."""
    del prompt_ids
    return self.decode(new_ids)

  def byte_lengths(self) -> np.ndarray:
    """int64[vocab_size]: bytes per id (0 for PAD/BOS/EOS/MASK, 3 for UNK).

    Lets a jitted metric count bytes as `sum(byte_lengths[targets] * weights)`.
    """
    if getattr(self, '_byte_lengths', None) is None:
      self._byte_lengths = self._byte_table()
      self._byte_lengths.setflags(write=False)
    return self._byte_lengths

  def num_bytes(self, ids: Iterable[int]) -> int:
    """UTF-8 bytes `ids` stand for; ids outside the vocabulary count as U+FFFD (3)."""
    ids = as_ids(ids)
    table = self.byte_lengths()
    inside = (ids >= 0) & (ids < len(table))
    outside = len(ids) - int(inside.sum())
    return int(table[ids[inside]].sum()) + outside * len(specials.REPLACEMENT.encode())

  def header(self) -> dict[str, Any]:
    """The JSON header `save` writes; `load_tokenizer` dispatches on its 'kind'."""
    return {'format': FORMAT, 'version': FORMAT_VERSION, 'kind': self.kind,
            'vocab_size': self.vocab_size, **self._header_fields()}

  def save(self, path: str | os.PathLike) -> pathlib.Path:
    """Writes the tokenizer to `path` (a .json file) atomically; returns the path."""
    path = pathlib.Path(path)
    if path.suffix != '.json':
      raise ValueError(f'tokenizer path must end in .json, got {path}')
    text = json.dumps(self.header(), indent=1, ensure_ascii=True) + '\n'
    write_atomic(path, text.encode('utf-8'))
    return path

  def __repr__(self) -> str:
    return f'{type(self).__name__}(kind={self.kind!r}, vocab_size={self.vocab_size})'


def as_ids(ids: Iterable[int]) -> np.ndarray:
  """`ids` (list, numpy or jax array) as a 1-D int64 numpy array."""
  if not hasattr(ids, '__array__') and not isinstance(ids, (list, tuple)):
    ids = list(ids)
  arr = np.asarray(ids)
  if arr.ndim != 1:
    raise ValueError(f'expected a 1-D sequence of token ids, got shape {arr.shape}')
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f'expected integer token ids, got dtype {arr.dtype}')
  return arr.astype(np.int64, copy=False)


def keep_text_ids(ids: np.ndarray) -> np.ndarray:
  """`ids` without the ones `decode` skips (PAD/BOS/EOS/MASK)."""
  return ids[~np.isin(ids, specials.SKIPPED_IDS)]


def write_atomic(path: pathlib.Path, data: bytes) -> None:
  """Writes `data` to `path` via a temp file + os.replace: readers see old or new, never half."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def read_json_object(path: pathlib.Path) -> dict[str, Any]:
  """The JSON object in `path`, or {} when it is missing or not an object."""
  if not path.is_file():
    return {}
  try:
    data = json.loads(path.read_text(encoding='utf-8'))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise DataError(f'{path} is not valid JSON ({e}); restore it from a copy (or, for a run '
                    'made by tx convert, convert the checkpoint again into a fresh --workdir)'
                    ) from None
  return data if isinstance(data, dict) else {}
