"""Parallel corpus builder: per split a (source, target) file pair -> line pairs.

Each split is two line-aligned files (plain or `.gz`); record i is
`{'source': line i of the source file, 'target': line i of the target file}`,
in file order. A line is the text between '\\n's with one trailing '\\r' removed;
a final newline does not start an extra line; other whitespace and empty lines
are kept so that alignment never shifts. Both files of every split are read and
checked (UTF-8, equal line counts, non-empty) before anything is written; files
are held in memory while preparing, which suits corpora up to a few million
lines (WMT-sized data goes through the TFDS catalog, `tfds:wmt14_translate/de-en`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tx.data.builders import common
from tx.data.errors import DataError


@dataclasses.dataclass(eq=False, kw_only=True, repr=False)
class ParallelConfig(common.TxBuilderConfig):
  """`pairs`: ((split, source path, target path), ...)."""
  pairs: tuple[tuple[str, str, str], ...] = ()


class TxParallel(common.TxBuilder):
  """tx parallel corpus: `{'source': str, 'target': str}` records, one per line pair."""
  FEATURES = ('source', 'target')
  DESCRIPTION = 'Line-aligned parallel corpus prepared by tx (tx/data/builders/parallel.py).'

  def _split_generators(self, dl_manager):
    del dl_manager  # Inputs are local files.
    splits = {split: self._read_pair(Path(src), Path(tgt))
              for split, src, tgt in self.builder_config.pairs}
    return {split: self._generate_examples(lines=lines) for split, lines in splits.items()}

  def _read_pair(self, src: Path, tgt: Path) -> tuple[list[str], list[str]]:
    setting = self.builder_config.setting
    src_lines, tgt_lines = split_lines(self._read(src)), split_lines(self._read(tgt))
    for path, lines in ((src, src_lines), (tgt, tgt_lines)):
      if not lines:
        raise DataError(f'{setting}: {path} is empty; point {setting} at a file with one '
                        f'sentence per line')
    if len(src_lines) != len(tgt_lines):
      raise DataError(f'{setting}: {src} has {len(src_lines)} lines but {tgt} has '
                      f'{len(tgt_lines)}; parallel files must be line-aligned')
    return src_lines, tgt_lines

  def _generate_examples(self, lines):
    for i, (source, target) in enumerate(zip(*lines)):
      yield i, {'source': source, 'target': target}


def split_lines(text: str) -> list[str]:
  """Lines of `text` split on '\\n' only (not the extra breaks of str.splitlines)."""
  if not text:
    return []
  lines = text.split('\n')
  if lines[-1] == '':
    lines.pop()
  return [line[:-1] if line.endswith('\r') else line for line in lines]


def parallel_builder(pairs: dict[str, tuple[Path, Path]], *, label: str, data_dir: Path,
                     utf8_errors: str = 'error', setting: str = 'data.source_files'
                     ) -> TxParallel:
  """A TxParallel builder for {split: (source file, target file)}; name digests inputs."""
  stamps = {split: [common.stamp(Path(s), setting), common.stamp(Path(t), setting)]
            for split, (s, t) in pairs.items()}
  payload = {'builder': 'parallel', 'pairs': stamps, 'utf8_errors': utf8_errors}
  cfg = ParallelConfig(
      name=common.config_name(label, payload),
      pairs=tuple((split, str(s), str(t)) for split, (s, t) in pairs.items()),
      utf8_errors=utf8_errors, setting=setting)
  return TxParallel(config=cfg, data_dir=str(data_dir), file_format='array_record')
