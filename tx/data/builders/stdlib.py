"""'stdlib' corpus: the running interpreter's standard-library `.py` files.

Every machine with Python has it, so it is tx's default dataset: code-shaped text
of a few MB that needs no download.

Which files. Root = `sysconfig.get_paths()['stdlib']` (the base interpreter's
library, also inside a virtualenv). Every `*.py` file below it, except those in
a folder named (at any depth) site-packages, dist-packages, test, tests,
idle_test, idlelib, lib2to3, pydoc_data (generated topic tables), encodings
(generated codec tables), turtledemo, distutils, ensurepip, __pycache__,
__phello__, or config-* (build files). Empty files (many `__init__.py`) and files
that are not valid UTF-8 are skipped. CPython 3.11.7 on Linux: 399 files (354
train / 45 validation), 8.2 MB (7.3 MB / 0.9 MB), prepared in well under a second.

Split. Files sorted by POSIX path relative to the root; a file is validation
when `zlib.crc32(relative_path.encode()) % 10 == 0` (about 10 %), else train.
crc32 is stable across runs and machines (Python's hash() is salted); a file's
split depends only on its own path, so the split of a file never changes when
the stdlib gains or loses others. One `{'text': str}` record per file, in
sorted order. No test split.

The builder config name digests the Python version, the root and every
selected file's path, size and mtime, so another interpreter prepares anew.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
import zlib
from pathlib import Path

from tx.data.builders import common

EXCLUDED_DIRS = frozenset({
    'site-packages', 'dist-packages', 'test', 'tests', 'idle_test', 'idlelib', 'lib2to3',
    'pydoc_data', 'encodings', 'turtledemo', 'distutils', 'ensurepip', '__pycache__',
    '__phello__'})


def stdlib_root() -> Path:
  """The standard-library folder of the running interpreter."""
  return Path(sysconfig.get_paths()['stdlib'])


def _excluded(name: str) -> bool:
  return name in EXCLUDED_DIRS or name.startswith('config-') or name.startswith('.')


def stdlib_files(root: Path | None = None) -> list[str]:
  """Sorted POSIX paths (relative to `root`) of the non-empty stdlib `.py` files."""
  root = root or stdlib_root()
  out = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if not _excluded(d)]
    for name in files:
      if name.endswith('.py'):
        path = Path(folder, name)
        if path.stat().st_size > 0:
          out.append(path.relative_to(root).as_posix())
  return sorted(out)


def split_of(relative_path: str) -> str:
  """'validation' when crc32(relative_path) % 10 == 0, else 'train'."""
  return 'validation' if zlib.crc32(relative_path.encode('utf-8')) % 10 == 0 else 'train'


@dataclasses.dataclass(eq=False, kw_only=True, repr=False)
class StdlibConfig(common.TxBuilderConfig):
  """The stdlib root and its selected files (relative POSIX paths)."""
  root: str = ''
  files: tuple[str, ...] = ()


class TxStdlib(common.TxBuilder):
  """Python standard-library sources, split by crc32 of the relative path."""
  DESCRIPTION = 'Python standard library .py files (tx/data/builders/stdlib.py).'

  def _split_generators(self, dl_manager):
    del dl_manager  # Inputs are local files.
    cfg = self.builder_config
    splits: dict[str, list[str]] = {'train': [], 'validation': []}
    for rel in cfg.files:
      if _is_utf8(Path(cfg.root, rel)):
        splits[split_of(rel)].append(rel)
      else:
        common.log.info('stdlib: skipping %s (not valid UTF-8)', rel)
    common.require_nonempty(splits, 'data.dataset=stdlib', f'the stdlib at {cfg.root}')
    return {name: self._generate_examples(rels=rels) for name, rels in splits.items()}

  def _generate_examples(self, rels):
    root = Path(self.builder_config.root)
    for i, rel in enumerate(rels):
      yield i, {'text': (root / rel).read_bytes().decode('utf-8')}


def stdlib_builder(*, data_dir: Path) -> TxStdlib:
  """A TxStdlib builder for the running interpreter; its name digests the file list."""
  root = stdlib_root()
  files = stdlib_files(root)
  payload = {'builder': 'stdlib', 'python': sys.version, 'root': str(root),
             'files': [common.stamp(root / rel, 'data.dataset') for rel in files]}
  label = f'py{sys.version_info.major}.{sys.version_info.minor}'
  cfg = StdlibConfig(name=common.config_name(label, payload), root=str(root),
                     files=tuple(files), setting='data.dataset')
  return TxStdlib(config=cfg, data_dir=str(data_dir), file_format='array_record')


def _is_utf8(path: Path) -> bool:
  try:
    path.read_bytes().decode('utf-8')
    return True
  except UnicodeDecodeError:
    return False
