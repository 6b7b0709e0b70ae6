"""`SentencePieceTokenizer`: BPE or unigram subwords trained with `sentencepiece`.

Training choices (all in `TRAINER_OPTIONS`) and why:
- ids 0..4 are <pad> <s> </s> <unk> <mask>, as everywhere in tx. <mask> is a
  *control* symbol, not a user-defined one, so text that literally contains
  "<mask>" is encoded as ordinary pieces and only the MLM masker emits id 4.
- byte_fallback: characters outside the vocabulary become <0xNN> byte pieces
  (ids 5..260), so encoding never produces UNK and any text round-trips.
- No normalisation: normalization_rule_name='identity' (no NFKC),
  remove_extra_whitespaces=False and add_dummy_prefix=False, so
  `decode(encode(text)) == text` exactly and byte counts are additive. (A dummy
  prefix would also mismatch line-split training with whole-text encoding: on
  tiny shakespeare dropping it gives 6% fewer tokens; on multi30k 0.3% more.)
  Newlines are never in a training sentence; they encode as the byte piece <0x0A>.
  sentencepiece's whitespace marker U+2581 '▁', when literally in the text, is
  encoded as its three byte pieces so that it does not come back as a space.
- Determinism: fixed random seed, at most 2 threads, reservoir sampling of at
  most `max_sentences` training lines; the same texts give the same model bytes.
Training text is split into lines (sentencepiece trains on sentences); lines
longer than `_CHUNK_CHARS` are cut into chunks rather than silently skipped.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pathlib
import re
import time
from typing import Any, Iterable, Iterator

import numpy as np
import sentencepiece as spm

from tx.data.errors import DataError
from tx.data.tokenizers import specials
from tx.data.tokenizers.base import Tokenizer, as_ids, keep_text_ids, write_atomic

log = logging.getLogger(__name__)

MODEL_TYPES = ('bpe', 'unigram')
NUM_BYTE_PIECES = 256
MIN_VOCAB_SIZE = specials.NUM_SPECIALS + NUM_BYTE_PIECES + 1  # + at least one character
_CHUNK_CHARS = 4096
_MARKER = '\u2581'  # how sentencepiece writes a space inside pieces

TRAINER_OPTIONS: dict[str, Any] = dict(
    pad_id=specials.PAD_ID, bos_id=specials.BOS_ID, eos_id=specials.EOS_ID,
    unk_id=specials.UNK_ID, pad_piece='<pad>', bos_piece='<s>', eos_piece='</s>',
    unk_piece='<unk>', control_symbols=['<mask>'], unk_surface=specials.REPLACEMENT,
    byte_fallback=True, character_coverage=0.9995,
    normalization_rule_name='identity', remove_extra_whitespaces=False,
    add_dummy_prefix=False, shuffle_input_sentence=True,
    max_sentence_length=4 * _CHUNK_CHARS, minloglevel=2)


class SentencePieceTokenizer(Tokenizer):
  """A sentencepiece model ('bpe' or 'unigram') with tx's fixed special ids."""

  def __init__(self, model_proto: bytes, kind: str, *, trainer: dict[str, Any] | None = None):
    """`model_proto`: serialized sentencepiece model; `kind`: 'bpe' or 'unigram'."""
    if kind not in MODEL_TYPES:
      raise ValueError(f'kind must be one of {MODEL_TYPES}, got {kind!r}')
    self.kind = kind
    self.model_proto = bytes(model_proto)
    self.trainer = dict(trainer or {})
    self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
    pieces = tuple(self._sp.id_to_piece(i) for i in range(min(5, self.vocab_size)))
    if pieces != specials.SPECIAL_PIECES or not self._sp.is_control(specials.MASK_ID):
      raise DataError(f'sentencepiece model has ids 0..4 = {pieces}, tx needs '
                      f'{specials.SPECIAL_PIECES}; retrain it with tx build_tokenizer')

  @classmethod
  def train(cls, texts: Iterable[str], *, kind: str = 'bpe', vocab_size: int = 8000,
            max_sentences: int = 1_000_000, seed: int = 0) -> SentencePieceTokenizer:
    """Trains on the lines of `texts` (for translation: source and target together)."""
    if kind not in MODEL_TYPES:
      raise DataError(f'data.tokenizer={kind!r} is not a sentencepiece type; '
                      f'use one of {MODEL_TYPES}')
    if vocab_size < MIN_VOCAB_SIZE:
      raise DataError(f'data.vocab_size={vocab_size} is too small for {kind}: it needs '
                      f'>= {MIN_VOCAB_SIZE} ({specials.NUM_SPECIALS} specials + {NUM_BYTE_PIECES} '
                      'byte pieces + characters); set data.vocab_size=8000 or so')
    options = dict(model_type=kind, vocab_size=vocab_size, input_sentence_size=max_sentences,
                   num_threads=min(2, os.cpu_count() or 1))
    lines = _Lines(texts)
    model = io.BytesIO()
    start = time.perf_counter()
    spm.set_random_generator_seed(seed)
    try:
      spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                     **TRAINER_OPTIONS, **options)
    except RuntimeError as e:
      raise _as_data_error(e, kind, vocab_size, lines.count) from None
    log.info('trained %s tokenizer, vocab %d, on %d lines in %.1f s',
             kind, vocab_size, lines.count, time.perf_counter() - start)
    trainer = dict(vocab_size=vocab_size, max_sentences=max_sentences, seed=seed,
                   lines=lines.count, sentencepiece=spm.__version__)
    return cls(model.getvalue(), kind, trainer=trainer)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without BOS/EOS."""
    return self._encode(text)

  def sampler(self, dropout: float, seed: int):
    """`encode` drawing one of the text's segmentations (subword regularisation): BPE-dropout
    (Provilkov et al. 2020; each merge skipped with probability `dropout`) for 'bpe', sampling
    from the unigram lattice with smoothing `dropout` (Kudo 2018) for 'unigram'. Seeds
    sentencepiece's generator (process-wide) with `seed`; the same seed and sequence of texts
    give the same ids. Returns a function str -> list[int]."""
    spm.set_random_generator_seed(seed)
    return lambda text: self._encode(text, enable_sampling=True, alpha=dropout, nbest_size=-1)

  def _encode(self, text: str, **sampling) -> list[int]:
    if _MARKER not in text:
      return self._sp.encode(text, **sampling)
    marker = [self._sp.piece_to_id(f'<0x{b:02X}>') for b in _MARKER.encode('utf-8')]
    parts = [self._sp.encode(part, **sampling) for part in text.split(_MARKER)]
    ids = parts[0]
    for part in parts[1:]:
      ids += marker + part
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; PAD/BOS/EOS/MASK skipped, UNK and unknown ids give U+FFFD."""
    ids = keep_text_ids(as_ids(ids))
    ids = np.where((ids >= 0) & (ids < self.vocab_size), ids, specials.UNK_ID)
    return self._sp.decode(ids.tolist())

  def id_to_piece(self, i: int) -> str:
    """The sentencepiece piece string of id `i` (for inspection)."""
    return self._sp.id_to_piece(i)

  def _byte_table(self) -> np.ndarray:
    sp, unk = self._sp, len(specials.REPLACEMENT.encode())
    def size(i):
      if sp.is_control(i):
        return 0
      if sp.is_unknown(i):
        return unk
      if sp.is_byte(i):
        return 1
      return len(sp.id_to_piece(i).replace(_MARKER, ' ').encode('utf-8'))
    return np.array([size(i) for i in range(self.vocab_size)], np.int64)

  def _header_fields(self) -> dict[str, Any]:
    return {'model_sha256': hashlib.sha256(self.model_proto).hexdigest(), 'trainer': self.trainer}

  def save(self, path: str | os.PathLike) -> pathlib.Path:
    """Writes `<path>.model` then the JSON header `path` (last, so it marks completion)."""
    path = pathlib.Path(path)
    write_atomic(model_path(path), self.model_proto)
    return super().save(path)

  @classmethod
  def from_header(cls, header: dict[str, Any], path: pathlib.Path) -> SentencePieceTokenizer:
    """Loads the `.model` next to `path`, checking it is the one the header names."""
    mpath = model_path(path)
    if not mpath.is_file():
      raise DataError(f'tokenizer {path} needs {mpath}, which is missing; delete {path} to retrain')
    proto = mpath.read_bytes()
    if hashlib.sha256(proto).hexdigest() != header.get('model_sha256'):
      raise DataError(f'{mpath} does not match {path} (interrupted write?); delete both to retrain')
    return cls(proto, header['kind'], trainer=header.get('trainer'))


def model_path(json_path: pathlib.Path) -> pathlib.Path:
  """Where the sentencepiece model of the header at `json_path` lives."""
  return json_path.with_suffix('.model')


class _Lines:
  """Non-empty lines of `texts`, long ones chunked; counts what it yields."""

  def __init__(self, texts: Iterable[str]):
    self.texts, self.count = texts, 0

  def __iter__(self) -> Iterator[str]:
    for text in self.texts:
      for line in text.splitlines():
        if not line.strip():
          continue
        for i in range(0, len(line), _CHUNK_CHARS):
          self.count += 1
          yield line[i:i + _CHUNK_CHARS]


def _as_data_error(e: RuntimeError, kind: str, vocab_size: int, lines: int) -> Exception:
  """Turns sentencepiece's vocabulary-size failures into one-line DataErrors."""
  msg = str(e)
  if lines == 0:
    return DataError(f'{kind} tokenizer: the training text is empty; '
                     'check data.dataset / data.files point at non-empty text')
  if m := re.search(r'smaller than required_chars\. \d+ vs (\d+)', msg):
    return DataError(f'data.vocab_size={vocab_size} is too small for {kind} on this data; '
                     f'set data.vocab_size >= {m.group(1)}')
  if m := re.search(r'too high \(\d+\)\. Please set it to a value <= (\d+)', msg):
    return DataError(f'data.vocab_size={vocab_size} is too large for {kind} on this data '
                     f'({lines} lines); set data.vocab_size <= {m.group(1)}')
  return e
