"""Text corpus builder: one file, a folder or a glob -> `{'text': str}` records.

How inputs become splits (fixed and documented, so a run is reproducible):

- One file: split by position, as nanoGPT does for tiny shakespeare. With n
  characters and validation fraction f, train = text[:int(n * (1 - f))] and
  validation = the rest; one record per split holding that contiguous text, so
  train + validation re-join to exactly the file.
- Several files whose names all carry a split word (name tokens split on
  non-alphanumerics: `train`; `valid`/`validation`/`val`/`dev`; `test`), e.g.
  `wiki.train.tokens`, `wiki.valid.tokens`: split by name, one record per file.
- Any other set of files: sorted by path, the last max(1, round(f * n)) files are
  validation, the rest train (needs n >= 2); one record per file.

A folder means every regular file under it, recursively, except names starting
with '.'; empty files in a folder or glob are skipped (an empty single file is an
error). Lines are kept verbatim (no newline translation).
"""

from __future__ import annotations

import dataclasses
import glob
import re
from pathlib import Path

from tx.data.builders import common
from tx.data.errors import DataError

_SPLIT_WORDS = {'train': 'train', 'valid': 'validation', 'validation': 'validation',
                'val': 'validation', 'dev': 'validation', 'test': 'test'}


@dataclasses.dataclass(eq=False, kw_only=True, repr=False)
class TextConfig(common.TxBuilderConfig):
  """Resolved input files and the split rule (see the module docstring)."""
  files: tuple[str, ...] = ()
  validation_fraction: float = 0.1


class TxText(common.TxBuilder):
  """tx text corpus: `{'text': str}` records, splits by position, name or order."""
  DESCRIPTION = 'Plain-text corpus prepared by tx (tx/data/builders/text.py).'

  def _split_generators(self, dl_manager):
    del dl_manager  # Inputs are local files.
    cfg = self.builder_config
    paths = [Path(p) for p in cfg.files]
    if len(paths) == 1:
      splits = self._split_by_position(paths[0])
      return {name: self._generate_examples(texts=texts) for name, texts in splits.items()}
    assignment = assign_files(paths, cfg.validation_fraction)
    common.require_nonempty(assignment, cfg.setting, 'the text files')
    for split_paths in assignment.values():  # Validate UTF-8 before writing anything.
      for path in split_paths:
        self._read(path)
    return {name: self._generate_examples(paths=split_paths)
            for name, split_paths in assignment.items()}

  def _split_by_position(self, path: Path) -> dict[str, list[str]]:
    cfg = self.builder_config
    text = self._read(path)
    if not text:
      raise DataError(f'{cfg.setting}: {path} is empty; point {cfg.setting} at a non-empty '
                      f'text file')
    cut = int(len(text) * (1 - cfg.validation_fraction))
    if cut == 0 or cut == len(text):
      raise DataError(f'{cfg.setting}: {path} ({len(text)} characters) is too short to hold '
                      f'out data.validation_fraction={cfg.validation_fraction}; use a longer '
                      f'file or another fraction')
    return {'train': [text[:cut]], 'validation': [text[cut:]]}

  def _generate_examples(self, texts=None, paths=None):
    if texts is not None:
      for i, text in enumerate(texts):
        yield i, {'text': text}
    else:
      for i, path in enumerate(paths):
        yield i, {'text': self._read(path)}


def assign_files(paths: list[Path], validation_fraction: float) -> dict[str, list[Path]]:
  """Assigns whole files to splits: by split words in names, else sorted order."""
  paths = sorted(paths)
  by_name = {p: _split_word(p) for p in paths}
  if all(by_name.values()):
    out: dict[str, list[Path]] = {}
    for path, split in by_name.items():
      out.setdefault(split, []).append(path)
    out.setdefault('train', [])
    return out
  n_val = max(1, round(validation_fraction * len(paths)))
  return {'train': paths[:len(paths) - n_val], 'validation': paths[len(paths) - n_val:]}


def _split_word(path: Path) -> str | None:
  words = {_SPLIT_WORDS[t] for t in re.split(r'[^a-z0-9]+', path.name.lower())
           if t in _SPLIT_WORDS}
  return words.pop() if len(words) == 1 else None


def resolve_files(spec: str, base: Path | None, setting: str = 'data.files') -> list[Path]:
  """The files named by `spec`: a file, a folder (recursive) or a glob.

  A relative spec is resolved against `base` (the raw dir) when given, else the
  working directory. Hidden names are skipped in folders; empty files are
  skipped in folders and globs.
  """
  path = Path(spec).expanduser()
  if not path.is_absolute() and base is not None:
    path = base / path
  if glob.has_magic(str(path)):
    files = [Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file()]
    if not files:
      raise DataError(f'{setting}: {spec!r} matches no files; fix the pattern')
  elif path.is_dir():
    files = [p for p in path.rglob('*')
             if p.is_file() and not any(part.startswith('.')
                                        for part in p.relative_to(path).parts)]
    if not files:
      raise DataError(f'{setting}: folder {path} holds no files; put text files in it')
  elif path.exists():
    return [path.resolve()]
  else:
    raise DataError(f'{setting}: {path} does not exist; point {setting} at a file, folder '
                    f'or glob')
  files = sorted(p.resolve() for p in files if p.stat().st_size > 0)
  if not files:
    raise DataError(f'{setting}: every file matched by {spec!r} is empty; give it text')
  return files


def text_builder(files: list[Path], *, label: str, data_dir: Path,
                 validation_fraction: float = 0.1, utf8_errors: str = 'error',
                 setting: str = 'data.files') -> TxText:
  """A TxText builder whose config name digests `files` and the split settings."""
  stamps = [common.stamp(Path(f), setting) for f in files]
  payload = {'builder': 'text', 'files': stamps, 'fraction': validation_fraction,
             'utf8_errors': utf8_errors}
  cfg = TextConfig(name=common.config_name(label, payload), files=tuple(map(str, files)),
                   validation_fraction=validation_fraction, utf8_errors=utf8_errors,
                   setting=setting)
  return TxText(config=cfg, data_dir=str(data_dir), file_format='array_record')
