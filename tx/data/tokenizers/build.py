"""`build_tokenizer`: train a tokenizer once per (kind, vocab_size) and cache it on disk.

    tok = build_tokenizer('bpe', lambda: train_texts(), cache_dir=dir, vocab_size=8000)

The cache holds `tokenizer-bpe-8000.json` + `tokenizer-bpe-8000.model` (char:
`tokenizer-char.json`; byte needs no file). `texts_fn` is called only on a miss.
The cache key does not include the data: give each dataset (and language pair)
its own `cache_dir`. Files are written atomically, the JSON header last, so an
interrupted build leaves nothing that loads; a stale or damaged entry is retrained.
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Callable, Iterable

from tx.data.errors import DataError
from tx.data.tokenizers import specials
from tx.data.tokenizers.base import Tokenizer
from tx.data.tokenizers.byte import ByteTokenizer
from tx.data.tokenizers.char import CharTokenizer
from tx.data.tokenizers.loading import KINDS, load_tokenizer
from tx.data.tokenizers.subword import SentencePieceTokenizer

log = logging.getLogger(__name__)


def check_kind(kind: str) -> None:
  """Raises DataError unless `kind` is a data.tokenizer value tx can train."""
  if kind not in KINDS:
    raise DataError(f'data.tokenizer={kind!r} is unknown; use one of {", ".join(KINDS)}')
  if kind == 'hf':
    raise DataError('data.tokenizer=hf is not trained: it is read from data.tokenizer_path '
                    '(a Hugging Face tokenizer.json; see tx.data.tokenizers.load_hf_tokenizer)')


def cache_path(kind: str, vocab_size: int, cache_dir: str | os.PathLike) -> pathlib.Path:
  """The JSON file under `cache_dir` that caches a (kind, vocab_size) tokenizer."""
  check_kind(kind)
  name = (f'tokenizer-{kind}.json' if kind in ('byte', 'char')
          else f'tokenizer-{kind}-{vocab_size}.json')
  return pathlib.Path(cache_dir) / name


def train_tokenizer(kind: str, texts: Iterable[str], *, vocab_size: int = 8000) -> Tokenizer:
  """A freshly trained tokenizer of `kind` (vocab_size is used by 'bpe'/'unigram' only)."""
  check_kind(kind)
  if kind == 'byte':
    return ByteTokenizer()
  if kind == 'char':
    return CharTokenizer.train(texts)
  return SentencePieceTokenizer.train(texts, kind=kind, vocab_size=vocab_size)


def build_tokenizer(kind: str, texts_fn: Callable[[], Iterable[str]], *,
                    cache_dir: str | os.PathLike, vocab_size: int = 8000) -> Tokenizer:
  """The cached tokenizer for (kind, vocab_size), trained on `texts_fn()` on a miss."""
  check_kind(kind)
  if kind in ('bpe', 'unigram') and vocab_size < specials.NUM_SPECIALS + 1:
    raise DataError(f'data.vocab_size={vocab_size} leaves no room beside the '
                    f'{specials.NUM_SPECIALS} special ids; set data.vocab_size=8000 or so')
  if kind == 'byte':
    return ByteTokenizer()
  path = cache_path(kind, vocab_size, cache_dir)
  if path.is_file():
    try:
      tokenizer = load_tokenizer(path)
      if tokenizer.kind == kind:
        log.info('loaded %s from %s', tokenizer, path)
        return tokenizer
      log.warning('%s holds a %s tokenizer, not %s; retraining', path, tokenizer.kind, kind)
    except DataError as e:
      log.warning('ignoring cached tokenizer (%s); retraining', e)
  tokenizer = train_tokenizer(kind, texts_fn(), vocab_size=vocab_size)
  tokenizer.save(path)
  log.info('saved %s to %s', tokenizer, path)
  return tokenizer
