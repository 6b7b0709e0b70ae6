"""`HfTokenizer` (data.tokenizer=hf): a Hugging Face `tokenizer.json` with the checkpoint's ids.

    tok = load_hf_tokenizer('path/to/checkpoint')       # its tokenizer.json (+ configs)
    tok.encode('Hello!')           # ids without the specials the checkpoint adds (like
                                   # transformers' add_special_tokens=False)
    tok.prefix_ids + tok.encode('Hello!')   # a prompt as transformers builds it (LLaMA: <s> ...)

Reads `tokenizer.json` with the `tokenizers` library (the `interop` extra). The special
tokens come from `tokenizer_config.json` / `special_tokens_map.json` next to it, else from
the model's `config.json` there (`bos_token_id`, `eos_token_id`, `pad_token_id`,
`decoder_start_token_id`; real GPT-2 names its specials only there).

Special ids: a converted checkpoint keeps its own token ids (they index its embedding), so
this tokenizer does not remap them to tx's 0..4; instead it tells generation and batching
which ids play which role (`bos_id`, `eos_id`, ...; see `tx.data.tokenizers.base`):

    checkpoint   pad      bos/eos           id 0          prefix / suffix (post-processor)
    GPT-2        none     50256 / 50256     "!" (a token) -     / -
    LLaMA        none     1 / 2             <unk>         <s>   / -
    BERT         [PAD] 0  - / - (cls/sep)   [PAD]         [CLS] / [SEP]
    T5           <pad> 0  - / 1             <pad>         -     / </s>   decoding starts at 0

MLM batches (`tx eval` of a converted BERT) mask with `special_ids['mask']`, never select
nor draw any of `all_special_ids`, frame rows with prefix / suffix ([CLS] ... [SEP]) and pad
with id 0, so they need a mask token and pad id 0 (else a one-line DataError). Packed LM
rows frame each document with `bos_id` / `eos_id` (MLM: prefix / suffix), seq2seq rows
as transformers frames a T5 batch: prefix + source + suffix, `decoder_start_id` + target +
`eos_id` (see tx/data/seq2seq.py), with segment ids since the start may be id 0.

tx's models treat id 0 as padding (`tokens != 0`) unless given segment ids. Where id 0 is
a special token (pad, unk) that is harmless; where it is an ordinary token (GPT-2's "!"),
`zero_is_token` is True and tx passes explicit validity instead: prompts are masked by
their lengths, generated tokens are always real, id 0 may be generated, and LM windows
carry segment ids. `decode` follows transformers' `decode(ids, skip_special_tokens=True)`
(every special token is dropped) and renders ids outside the vocabulary as U+FFFD.

Saved form (`save(path)`): the tx JSON header at `path` (kind 'hf', vocab_size, the
special ids, prefix/suffix ids, the sha256 of the tokenizer file) and the Hugging Face
file, byte for byte, as `tokenizer.json` in the same folder (one hf tokenizer per folder,
as in a checkpoint, so transformers' `AutoTokenizer.from_pretrained(folder)` reads it too).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import re
from typing import Any, Iterable

import numpy as np

from tx.data.errors import DataError
from tx.data.tokenizers import specials
from tx.data.tokenizers.base import Tokenizer, as_ids, read_json_object, write_atomic

HF_FILE = 'tokenizer.json'
HEADER_FILE = 'tx_tokenizer.json'  # what `tx convert` writes next to the copied tokenizer.json
CONFIG_FILES = ('tokenizer_config.json', 'special_tokens_map.json')
ROLES = ('pad', 'bos', 'eos', 'unk', 'mask', 'cls', 'sep', 'decoder_start')
INSTALL = 'pip install -e ".[interop]"'
_BYTE_PIECE = re.compile(r'^<0x([0-9A-Fa-f]{2})>$')


def _library():
  """The `tokenizers` module, or a one-line DataError saying how to install it."""
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top  (optional (the interop extra))
  except ImportError:
    raise DataError(f'data.tokenizer=hf needs the `tokenizers` package; install it with '
                    f'{INSTALL}') from None
  return tokenizers


class HfTokenizer(Tokenizer):
  """A Hugging Face fast tokenizer (`tokenizer.json`) with the checkpoint's own special ids."""

  kind = 'hf'
  uses_tx_specials = False

  def __init__(self, data: bytes, special_ids: dict[str, int | None] | None = None, *,
               source: str = ''):
    """`data`: the bytes of a tokenizer.json; `special_ids`: role -> id (see ROLES)."""
    self.data = bytes(data)
    self.source = source
    try:
      self._tok = _library().Tokenizer.from_str(self.data.decode('utf-8'))
    except DataError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f'{source or HF_FILE} is not a Hugging Face tokenizer.json '
                      f'({str(e).splitlines()[0] if str(e) else type(e).__name__}); restore '
                      'the checkpoint\'s tokenizer.json') from None
    self._tok.no_truncation()  # a tokenizer.json may carry truncation / padding settings
    self._tok.no_padding()
    self._vocab_size = 1 + max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1)
    self.set_special_ids(special_ids or {})

  def set_special_ids(self, special_ids: dict[str, int | None]) -> None:
    """Sets the roles of special ids (role -> id, see ROLES; missing roles: none)."""
    ids = {role: None for role in ROLES}
    for role, i in special_ids.items():
      if role not in ROLES:
        raise ValueError(f'unknown special role {role!r}; expected one of {ROLES}')
      if i is not None and not 0 <= int(i) < self._vocab_size:
        raise DataError(f'{self.source or HF_FILE}: {role} id {i} is outside the vocabulary '
                        f'of {self._vocab_size}')
      ids[role] = None if i is None else int(i)
    self.special_ids = ids
    self.bos_id = -1 if ids['bos'] is None else ids['bos']
    self.eos_id = -1 if ids['eos'] is None else ids['eos']
    start = next((ids[r] for r in ('decoder_start', 'bos', 'pad') if ids[r] is not None), 0)
    self.decoder_start_id = start
    self.prefix_ids, self.suffix_ids = self._template()
    added = self._tok.get_added_tokens_decoder()
    self._special = {i for i, t in added.items() if t.special}
    self._special |= {i for i in ids.values() if i is not None}
    self.zero_is_token = self._vocab_size > 0 and 0 not in self._special
    self._byte_lengths = None

  # --- construction from files ---------------------------------------------------------

  @classmethod
  def from_files(cls, path: str | os.PathLike) -> HfTokenizer:
    """A tokenizer.json (or a folder holding one) with the specials named beside it."""
    path = pathlib.Path(path).expanduser()
    file = path / HF_FILE if path.is_dir() else path
    if not file.is_file():
      raise DataError(f'{file}: not found; put the checkpoint\'s {HF_FILE} there (tx reads '
                      'Hugging Face fast tokenizers only)')
    tok = cls(file.read_bytes(), source=str(file))
    tok.set_special_ids(tok.find_special_ids(file.parent))
    return tok

  def find_special_ids(self, folder: pathlib.Path) -> dict[str, int | None]:
    """role -> id from folder's tokenizer_config.json / special_tokens_map.json / config.json."""
    found: dict[str, int | None] = {}
    for name in CONFIG_FILES:
      for role, token in read_json_object(folder / name).items():
        if not role.endswith('_token') or role[:-len('_token')] not in ROLES:
          continue
        if isinstance(token, dict):
          token = token.get('content')
        if isinstance(token, str) and found.get(role[:-len('_token')]) is None:
          found[role[:-len('_token')]] = self._tok.token_to_id(token)
    model = read_json_object(folder / 'config.json')
    for role in ('pad', 'bos', 'eos', 'decoder_start'):
      value = model.get(f'{role}_token_id')
      if isinstance(value, list):  # several EOS ids (LLaMA 3): tx stops at the first
        value = value[0] if value else None
      if found.get(role) is None and isinstance(value, int) and 0 <= value < self._vocab_size:
        found[role] = value
    return found

  def _template(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ids the post-processor puts before, after) a single sequence."""
    probe = 'a b'
    plain = self._tok.encode(probe, add_special_tokens=False).ids
    full = self._tok.encode(probe, add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
      if full[start:start + len(plain)] == plain:
        return tuple(full[:start]), tuple(full[start + len(plain):])
    return (), ()

  @property
  def all_special_ids(self) -> tuple[int, ...]:
    """Every special id, sorted: the roles' ids and the added tokens marked special (MLM
    never masks them nor draws them as replacements)."""
    return tuple(sorted(self._special))

  # --- the Tokenizer interface ------------------------------------------------------------

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def encode(self, text: str) -> list[int]:
    """Ids of `text` without the specials the checkpoint's post-processor adds."""
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` as transformers decodes it with skip_special_tokens=True; ids outside
    the vocabulary give U+FFFD."""
    ids = as_ids(ids).tolist()
    if all(0 <= i < self._vocab_size for i in ids):
      return self._tok.decode(ids, skip_special_tokens=True)
    parts, run = [], []
    for i in ids + [-1]:
      if 0 <= i < self._vocab_size:
        run.append(i)
        continue
      if run:
        parts.append(self._tok.decode(run, skip_special_tokens=True))
        run = []
      parts.append(specials.REPLACEMENT)
    return ''.join(parts[:-1])

  def decode_continuation(self, prompt_ids: Iterable[int], new_ids: Iterable[int]) -> str:
    """Text of `new_ids` after `prompt_ids`: decode(prompt + new) minus decode(prompt).

    Decoders such as sentencepiece's drop the leading space of a text, so `new_ids` alone
    would lose the space that separates them from the prompt.
    """
    prompt_ids, new_ids = as_ids(prompt_ids).tolist(), as_ids(new_ids).tolist()
    head = self.decode(prompt_ids)
    both = self.decode(prompt_ids + new_ids)
    return both[len(head):] if both.startswith(head) else self.decode(new_ids)

  def token(self, i: int) -> str | None:
    """The vocabulary string of id `i` (for inspection)."""
    return self._tok.id_to_token(i)

  def _byte_table(self) -> np.ndarray:
    """Bytes per id: exact for byte-level BPE (GPT-2) and byte pieces; sentencepiece-style
    pieces count their '▁' as a space (one byte too many where a decoder strips it)."""
    decoder = json.loads(self.data).get('decoder') or {}
    byte_level = 'ByteLevel' in json.dumps(decoder)
    unicode_bytes = _unicode_to_bytes()
    table = np.zeros(self._vocab_size, np.int64)
    for i in range(self._vocab_size):
      piece = self._tok.id_to_token(i)
      if piece is None:
        table[i] = len(specials.REPLACEMENT.encode())
      elif i in self._special:
        table[i] = 0
      elif byte_level and all(c in unicode_bytes for c in piece):
        table[i] = len(piece)
      elif _BYTE_PIECE.match(piece):
        table[i] = 1
      else:
        table[i] = len(piece.replace('\u2581', ' ').removeprefix('##').encode('utf-8'))
    return table

  def _header_fields(self) -> dict[str, Any]:
    return {'file': HF_FILE, 'sha256': hashlib.sha256(self.data).hexdigest(),
            'special_ids': dict(self.special_ids), 'prefix_ids': list(self.prefix_ids),
            'suffix_ids': list(self.suffix_ids), 'zero_is_token': self.zero_is_token}

  def save(self, path: str | os.PathLike) -> pathlib.Path:
    """Writes the tokenizer.json next to `path` (unless it is already there), then the header."""
    path = pathlib.Path(path)
    if path.name == HF_FILE:
      raise ValueError(f'the tx header cannot be named {HF_FILE} (that is the Hugging Face '
                       f'file beside it); use e.g. {HEADER_FILE}')
    file = path.parent / HF_FILE
    if not (file.is_file() and file.read_bytes() == self.data):
      write_atomic(file, self.data)
    return super().save(path)

  @classmethod
  def from_header(cls, header: dict[str, Any], path: pathlib.Path) -> HfTokenizer:
    """Loads the tokenizer.json next to `path`, checking it is the one the header names."""
    file = path.parent / header.get('file', HF_FILE)
    if not file.is_file():
      raise DataError(f'tokenizer {path} needs {file}, which is missing; copy the '
                      f'checkpoint\'s {HF_FILE} there (or run tx convert again)')
    data = file.read_bytes()
    if hashlib.sha256(data).hexdigest() != header.get('sha256'):
      raise DataError(f'{file} is not the tokenizer {path} was saved with (sha256 differs); '
                      f'restore it or delete {path} and point data.tokenizer_path at {file}')
    return cls(data, header['special_ids'], source=str(file))


@functools.cache
def _unicode_to_bytes() -> dict[str, int]:
  """GPT-2's byte-level alphabet: the printable character standing for each byte."""
  keep = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1),
          *range(ord('®'), ord('ÿ') + 1)]
  chars, n = {}, 0
  for b in range(256):
    if b in keep:
      chars[chr(b)] = b
    else:
      chars[chr(256 + n)] = b
      n += 1
  return chars
