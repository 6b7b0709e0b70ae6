"""A checkpoint's tokenizer without a tokenizer.json: converted to one with `transformers`.

Older checkpoints ship the files of a "slow" tokenizer instead of a fast `tokenizer.json`:

    vocab.json + merges.txt        byte-level BPE (GPT-2, RoBERTa, BLOOM's ancestors)
    spiece.model                   sentencepiece (T5)
    tokenizer.model                sentencepiece (LLaMA 1/2)
    sentencepiece.bpe.model        sentencepiece (XLM-R, mBART)
    vocab.txt                      WordPiece (BERT)

tx reads fast tokenizers only (tx/data/tokenizers/hf.py), so `tx convert` asks
`transformers` (the interop extra) to load the folder with `AutoTokenizer` (which picks
the tokenizer class from config.json and converts these files) and to save it, which
writes `tokenizer.json` and `tokenizer_config.json`. The ids are transformers' own, so
tx encodes exactly as `AutoTokenizer.from_pretrained(DIR)` does (T5: with its 100
`<extra_id_N>` sentinels appended).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tx.config.base import ConfigError
from tx.data.tokenizers.hf import CONFIG_FILES, HF_FILE

SLOW_FILES = (('vocab.json', 'merges.txt'), ('spiece.model',), ('tokenizer.model',),
              ('sentencepiece.bpe.model',), ('vocab.txt',))


def slow_files(hf_dir: Path) -> tuple[str, ...] | None:
  """The first set of slow tokenizer files all present in `hf_dir`, else None."""
  return next((files for files in SLOW_FILES if all((hf_dir / f).is_file() for f in files)),
              None)


def convert_slow_tokenizer(hf_dir: Path, out: Path) -> Path:
  """Writes `out`/tokenizer.json (+ tokenizer_config.json, config.json) converted from
  `hf_dir`'s slow tokenizer files; returns `out`. One-line ConfigError when transformers
  is missing or cannot convert them."""
  files = slow_files(hf_dir)
  assert files is not None, hf_dir
  try:
    # optional (the interop extra); heavy
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError(f'{hf_dir} has no {HF_FILE}, only {" + ".join(files)}; converting them '
                      'needs transformers: pip install -e ".[interop]" (or save the '
                      f'tokenizer as {HF_FILE} with transformers elsewhere)') from None
  try:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    if not getattr(tokenizer, 'is_fast', False):
      raise ValueError(f'transformers loaded {type(tokenizer).__name__}, not a fast tokenizer')
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
  except Exception as e:  # pylint: disable=broad-except
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f'{hf_dir}: could not convert {" + ".join(files)} to a {HF_FILE} '
                      f'({reason}); save the tokenizer as {HF_FILE} with transformers and '
                      'convert again') from None
  if not (out / HF_FILE).is_file():
    raise ConfigError(f'{hf_dir}: transformers saved no {HF_FILE} for {" + ".join(files)}; '
                      f'save the tokenizer as {HF_FILE} with transformers and convert again')
  for name in ('config.json', *CONFIG_FILES):  # special ids the saved configs lack
    if (hf_dir / name).is_file() and not (out / name).is_file():
      shutil.copyfile(hf_dir / name, out / name)
  return out
