"""The one entry point from a `DataConfig` to examples: `load_source(data_cfg, split)`.

    src = load_source(DataConfig(dataset='tinyshakespeare'), 'train')
    len(src), src[0]['text']

Datasets (`data.dataset`), with RAW = `raw_dir(data_cfg)`:

    stdlib            this Python's standard library (train/validation by crc32 of path)
    tinyshakespeare   RAW/tinyshakespeare/input.txt, 90/10 by position (nanoGPT's split);
                      without RAW: TFDS catalog tiny_shakespeare (90/5/5; needs TensorFlow
                      to prepare)
    multi30k          RAW/multi30k/{train,val,test_2016_flickr}.{lang}.gz, source =
                      data.source_lang, target = data.target_lang
    text              data.files: a file, folder or glob (see builders/text.py)
    parallel          data.source_files / data.target_files: one file per split
    tfds:NAME         a TFDS catalog dataset, e.g. tfds:lm1b, tfds:wmt14_translate/de-en

Records are dicts of python str: {'text'} for kind 'text', {'source', 'target'} for
kind 'parallel'. Splits are named 'train', 'validation', 'test'. Prepared data is
cached under the data dir (`data.data_dir`, else $TFDS_DATA_DIR, else
~/tensorflow_datasets) and reused while the inputs are unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from tx.config.data import PARALLEL_DATASETS, TEXT_DATASETS, DataConfig
from tx.data.builders import catalog, common
from tx.data.builders.parallel import parallel_builder
from tx.data.builders.stdlib import stdlib_builder
from tx.data.builders.text import resolve_files, text_builder
from tx.data.errors import DataError

SPLITS = ('train', 'validation', 'test')
DATASETS = ('stdlib', 'tinyshakespeare', 'multi30k', 'text', 'parallel', 'tfds:NAME')
MULTI30K_FILES = {'train': 'train', 'validation': 'val', 'test': 'test_2016_flickr'}


class Source:
  """Random access to one prepared split: `len(src)`, `src[i] -> {key: str}`.

  Wraps a `tfds.data_source` split (array_record, stores UTF-8 bytes) and decodes
  the fields tx uses; picklable, so Grain workers can hold it. For a full pass,
  iterate (`list(src)`) or call `src.__getitems__(indices)`: batched reads are
  about 3x faster than `src[i]` in a loop.
  """
  READ_CHUNK = 1024

  def __init__(self, data_source, keys: dict[str, str], name: str, split: str):
    self._source = data_source
    self._keys = keys  # tx key -> stored feature name
    self.name, self.split = name, split

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict[str, str]:
    if index < 0:
      index += len(self)
    if not 0 <= index < len(self):
      raise IndexError(f'{self.name}[{self.split}]: index {index} out of range')
    return self._decode(self._source[index])

  def __getitems__(self, indices) -> list[dict[str, str]]:
    return [self._decode(record) for record in self._source.__getitems__(list(indices))]

  def __iter__(self):
    # Batched reads: about 3x faster than one __getitem__ per record.
    for start in range(0, len(self), self.READ_CHUNK):
      yield from self.__getitems__(range(start, min(start + self.READ_CHUNK, len(self))))

  def __repr__(self) -> str:
    return f'Source({self.name!r}, split={self.split!r}, len={len(self)})'

  def _decode(self, record) -> dict[str, str]:
    return {key: _to_str(record[stored]) for key, stored in self._keys.items()}


def _to_str(value: Any) -> str:
  if hasattr(value, 'item') and not isinstance(value, (bytes, str)):
    value = value.item()  # numpy scalar
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


@dataclasses.dataclass
class _Dataset:
  """A resolved dataset: its builder, record keys and prepare step."""
  name: str
  builder: Any
  kind: str = 'text'
  tfds_name: str | None = None  # set for TFDS catalog datasets
  raw: Path | None = None


def raw_dir(data_cfg: DataConfig) -> Path | None:
  """Where raw files live: data.raw_dir, else $TX_RAW_DATA, else None."""
  value = data_cfg.raw_dir or os.environ.get('TX_RAW_DATA')
  return Path(value).expanduser() if value else None


def data_dir(data_cfg: DataConfig) -> Path:
  """The prepared-data cache: data.data_dir, else $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
  return common.data_root(data_cfg.data_dir)


def dataset_kind(data_cfg: DataConfig) -> str:
  """'text' (records {'text': str}) or 'parallel' (records {'source', 'target'})."""
  if data_cfg.dataset in TEXT_DATASETS:
    return 'text'
  if data_cfg.dataset in PARALLEL_DATASETS:
    return 'parallel'
  return _resolve(data_cfg).kind


def prepared_dir(data_cfg: DataConfig) -> Path:
  """The directory of this dataset's builder config and version (exists after load_source).

  Unique per input digest, so files cached next to the data (vocabularies) are
  invalidated together with it.
  """
  return Path(os.fspath(_resolve(data_cfg).builder.data_path))


def load_source(data_cfg: DataConfig, split: str) -> Source:
  """Random-access source (supports len() and [i] -> dict of python str) for split in
  {'train', 'validation', 'test'} (map canonical names to each dataset's own split names;
  multi30k: train / val / test_2016_flickr). Prepares the dataset on first use."""
  if split not in SPLITS:
    raise DataError(f'split {split!r} is not one of {", ".join(SPLITS)}')
  ds = _resolve(data_cfg)
  if not ds.builder.is_prepared():
    with common.preparing(ds.builder):
      if ds.tfds_name:
        catalog.prepare_catalog(ds.builder, ds.tfds_name, ds.raw)
      else:
        common.prepare(ds.builder)
    # A builder made before its data existed has empty split info (and another process
    # may have prepared it); a fresh one reads what was written.
    ds = _resolve(data_cfg)
  elif not ds.builder.info.splits.keys():
    # made while another process was finishing the preparation: prepared now, but this
    # builder saw no data
    ds = _resolve(data_cfg)
  builder = ds.builder
  if ds.tfds_name:
    own = catalog.split_name(builder, split)
    _, keys = catalog.record_keys(builder, data_cfg.source_lang, data_cfg.target_lang)
  else:
    own = split if split in builder.info.splits.keys() else None
    keys = {'text': 'text'} if ds.kind == 'text' else {'source': 'source', 'target': 'target'}
  if own is None:
    have = ', '.join(builder.info.splits.keys())
    raise DataError(f'data.dataset={data_cfg.dataset}: has no {split!r} split (it has '
                    f'{have}); use one of those')
  try:
    source = builder.as_data_source(split=own)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f'data.dataset={data_cfg.dataset}: cannot read {builder.data_path} as '
                    f'array_record ({type(e).__name__}); delete that folder to prepare it '
                    f'again') from None
  return Source(source, keys, name=data_cfg.dataset, split=split)


def _resolve(data_cfg: DataConfig) -> _Dataset:
  """Builds (without preparing) the builder that `data_cfg.dataset` names."""
  name, root = data_cfg.dataset, data_dir(data_cfg)
  raw, utf8 = raw_dir(data_cfg), data_cfg.utf8_errors
  if name == 'stdlib':
    return _Dataset(name, stdlib_builder(data_dir=root))
  if name == 'tinyshakespeare':
    if raw is None:
      return _catalog(data_cfg, 'tiny_shakespeare', root, raw, fallback_for=name)
    path = _raw_file(data_cfg, raw, 'tinyshakespeare/input.txt')
    return _Dataset(name, text_builder(
        [path], label=name, data_dir=root, validation_fraction=data_cfg.validation_fraction,
        utf8_errors=utf8, setting=_raw_setting(data_cfg)))
  if name == 'multi30k':
    if raw is None:
      raise DataError('data.dataset=multi30k needs its raw files; set TX_RAW_DATA or '
                      'data.raw_dir to a folder holding multi30k/{train,val,test_2016_flickr}'
                      '.{en,de}.gz')
    src, tgt = data_cfg.source_lang, data_cfg.target_lang
    pairs = {split: (_raw_file(data_cfg, raw, f'multi30k/{stem}.{src}.gz'),
                     _raw_file(data_cfg, raw, f'multi30k/{stem}.{tgt}.gz'))
             for split, stem in MULTI30K_FILES.items()}
    return _Dataset(name, parallel_builder(
        pairs, label=f'multi30k-{src}-{tgt}', data_dir=root, utf8_errors=utf8,
        setting=_raw_setting(data_cfg)), kind='parallel')
  if name == 'text':
    if not data_cfg.files:
      raise DataError('data.files: not set; data.dataset=text needs data.files=PATH '
                      '(a file, a folder or a glob)')
    files = resolve_files(data_cfg.files, raw)
    return _Dataset(name, text_builder(
        files, label=Path(data_cfg.files).name, data_dir=root,
        validation_fraction=data_cfg.validation_fraction, utf8_errors=utf8))
  if name == 'parallel':
    return _Dataset(name, parallel_builder(
        _parallel_pairs(data_cfg, raw), label='parallel', data_dir=root, utf8_errors=utf8),
                    kind='parallel')
  if name.startswith('tfds:') and len(name) > len('tfds:'):
    return _catalog(data_cfg, name[len('tfds:'):], root, raw)
  raise DataError(f'data.dataset: {name!r} is not one of {", ".join(DATASETS)}')


def _catalog(data_cfg, tfds_name: str, root: Path, raw: Path | None,
             fallback_for: str | None = None) -> _Dataset:
  builder = catalog.catalog_builder(tfds_name, root)
  if fallback_for and not builder.is_prepared() and not catalog.tf_available():
    raise DataError(
        f"data.dataset={fallback_for}: no raw file (set TX_RAW_DATA or data.raw_dir to a "
        f"folder holding {fallback_for}/input.txt) and the TFDS catalog fallback "
        f"{tfds_name} needs TensorFlow to prepare: pip install 'tx[tf]'")
  kind, _ = catalog.record_keys(builder, data_cfg.source_lang, data_cfg.target_lang)
  return _Dataset(data_cfg.dataset, builder, kind=kind, tfds_name=tfds_name, raw=raw)


def _raw_setting(data_cfg: DataConfig) -> str:
  return 'data.raw_dir' if data_cfg.raw_dir else 'TX_RAW_DATA'


def _raw_file(data_cfg: DataConfig, raw: Path, relative: str) -> Path:
  setting = _raw_setting(data_cfg)
  if not raw.is_dir():
    raise DataError(f'{setting}: {raw} is not a folder; point {setting} at the folder of '
                    f'raw datasets')
  path = raw / relative
  if not path.is_file():
    raise DataError(f'{setting}: {path} does not exist; put {data_cfg.dataset}\'s raw file '
                    f'there (or point {setting} at the folder that has {relative})')
  return path.resolve()


def _parallel_pairs(data_cfg: DataConfig, raw: Path | None) -> dict[str, tuple[Path, Path]]:
  src, tgt = data_cfg.source_files, data_cfg.target_files
  if not src or not tgt:
    raise DataError('data.source_files: not set; data.dataset=parallel needs '
                    'data.source_files and data.target_files (one file per split: train, '
                    'validation, test)')
  if len(src) != len(tgt) or len(src) > len(SPLITS):
    raise DataError(f'data.target_files: {len(tgt)} files but data.source_files has '
                    f'{len(src)}; give both the same 1-3 files (train, validation, test)')

  def resolve(spec: str, setting: str) -> Path:
    path = Path(spec).expanduser()
    if not path.is_absolute() and raw is not None:
      path = raw / path
    if not path.is_file():
      raise DataError(f'{setting}: {path} does not exist; fix the path in {setting}')
    return path.resolve()

  return {split: (resolve(s, 'data.source_files'), resolve(t, 'data.target_files'))
          for split, s, t in zip(SPLITS, src, tgt)}
