"""`load_tokenizer`: reads a tokenizer saved by `Tokenizer.save`, whatever its kind;
`load_hf_tokenizer`: data.tokenizer=hf from a checkpoint's tokenizer.json or a saved one."""

from __future__ import annotations

import json
import os
import pathlib

from tx.data.errors import DataError
from tx.data.tokenizers.base import FORMAT, FORMAT_VERSION, Tokenizer, read_json_object
from tx.data.tokenizers.byte import ByteTokenizer
from tx.data.tokenizers.char import CharTokenizer
from tx.data.tokenizers.hf import HEADER_FILE, HF_FILE, HfTokenizer
from tx.data.tokenizers.subword import SentencePieceTokenizer

# data.tokenizer value -> class.
KINDS: dict[str, type[Tokenizer]] = {
    'byte': ByteTokenizer,
    'char': CharTokenizer,
    'bpe': SentencePieceTokenizer,
    'unigram': SentencePieceTokenizer,
    'hf': HfTokenizer,  # loaded from data.tokenizer_path, never trained (tokenizers/hf.py)
}


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """The tokenizer saved at `path` (its .json header, or the .model next to it)."""
  path = pathlib.Path(path)
  if path.suffix == '.model':
    path = path.with_suffix('.json')
  if not path.is_file():
    raise DataError(f'tokenizer file {path} not found; '
                    'save one with Tokenizer.save or build_tokenizer')
  try:
    header = json.loads(path.read_text(encoding='utf-8'))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise DataError(f'tokenizer file {path} is not valid JSON ({e}); '
                    'delete it to retrain') from None
  if not isinstance(header, dict) or header.get('format') != FORMAT:
    raise DataError(f'{path} is not a tx tokenizer file (no "format": "{FORMAT}"); '
                    'pass the .json written by Tokenizer.save')
  if header.get('version') != FORMAT_VERSION:
    raise DataError(f'{path} has tokenizer format version {header.get("version")}, this tx reads '
                    f'{FORMAT_VERSION}; delete it to retrain')
  kind = header.get('kind')
  if kind not in KINDS:
    raise DataError(f'{path} has unknown tokenizer kind {kind!r}; expected one of {sorted(KINDS)}')
  try:
    tokenizer = KINDS[kind].from_header(header, path)
  except DataError:
    raise
  except (KeyError, TypeError, ValueError) as e:
    raise DataError(f'tokenizer file {path} is malformed ({e!r}); delete it to retrain') from None
  if tokenizer.vocab_size != header.get('vocab_size'):
    raise DataError(f'{path} says vocab_size {header.get("vocab_size")} but the tokenizer has '
                    f'{tokenizer.vocab_size}; delete it to retrain')
  return tokenizer


def load_hf_tokenizer(path: str | os.PathLike) -> HfTokenizer:
  """data.tokenizer_path: a tx header (kind 'hf'), a tokenizer.json, or a folder with either."""
  path = pathlib.Path(path).expanduser()
  if path.is_dir():
    header = path / HEADER_FILE
    if not header.is_file() and not (path / HF_FILE).is_file():
      raise DataError(f'data.tokenizer_path: {path} holds no {HF_FILE}; put the checkpoint\'s '
                      f'{HF_FILE} there (tx reads Hugging Face fast tokenizers only)')
    path = header if header.is_file() else path / HF_FILE
  if not path.is_file():
    raise DataError(f'data.tokenizer_path: {path} not found; point it at a {HF_FILE} or the '
                    'folder holding one')
  if read_json_object(path).get('format') == FORMAT:
    tokenizer = load_tokenizer(path)
    if not isinstance(tokenizer, HfTokenizer):
      raise DataError(f'data.tokenizer_path: {path} holds a {tokenizer.kind!r} tokenizer; '
                      'data.tokenizer=hf needs a Hugging Face one')
    return tokenizer
  return HfTokenizer.from_files(path)
