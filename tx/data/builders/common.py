"""What tx's TFDS builders share: config digests, UTF-8 reading, preparing.

How strings are stored. Every string feature is `tfds.features.Text()`. Encoding a
python `str` into it needs no TensorFlow (TFDS falls back to numpy), and the
array_record files read back through `tfds.data_source` / `as_data_source` hold
UTF-8 `bytes`; `tx.data.sources.Source` decodes them to `str`. A raw bytes feature
(`Tensor(shape=(), dtype=object)`) would work too, but `Text` documents the
intent in `features.json` and lets TFDS-with-TensorFlow users read `tf.string`.

Record order. `disable_shuffling=True`: records are stored in generation order,
so record 0 of a parallel split is line 1 of its files.

Cache keying. A builder config is named `LABEL-DIGEST`, where DIGEST is the first
12 hex digits of a SHA-256 over the inputs (resolved paths, sizes, mtimes, split
rule, fraction, UTF-8 policy). Prepared data lives at
`DATA_DIR/<builder>/LABEL-DIGEST/<version>/`; TFDS writes it into an
`incomplete.*` folder first and renames it only after every split is written, so
a failed or killed preparation never looks complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import tensorflow_datasets as tfds

from tx.data.errors import DataError

log = logging.getLogger('tx.data')

VERSION = '1.0.0'
_UTF8_REPLACEMENT = '\ufffd'.encode('utf-8')


@dataclasses.dataclass(eq=False, kw_only=True, repr=False)
class TxBuilderConfig(tfds.core.BuilderConfig):
  """Base of tx builder configs; `setting` names the `data.*` key for errors.

  Subclasses are declared with `repr=False` so that this short repr (no file
  lists) is what logs show.
  """
  setting: str = 'data.files'
  utf8_errors: str = 'error'

  def __repr__(self) -> str:
    return f'{type(self).__name__}(name={self.name!r})'


class _QuietTfdsNotices(logging.Filter):
  """Drops TFDS's per-construction notices that every tx builder triggers by design
  (configs are made on the fly; a config folder exists before it is prepared)."""
  NOTICES = ('Using custom data configuration', 'Variant folder')

  def filter(self, record: logging.LogRecord) -> bool:
    if not str(record.msg).startswith(self.NOTICES):
      return True
    args = record.args if isinstance(record.args, tuple) else (record.args,)
    return not any(isinstance(a, TxBuilderConfig) or '/tx_' in str(a) for a in args)


logging.getLogger('absl').addFilter(_QuietTfdsNotices())


def digest(payload: Any) -> str:
  """A stable 12-hex-digit digest of a JSON-able payload (not Python's salted hash)."""
  text = json.dumps(payload, sort_keys=True, default=str)
  return hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]


def config_name(label: str, payload: Any) -> str:
  """`LABEL-DIGEST`, with LABEL reduced to the characters TFDS allows."""
  label = re.sub(r'[^\w.+-]+', '_', label).strip('_') or 'data'
  return f'{label}-{digest(payload)}'


def stamp(path: Path, setting: str) -> list:
  """[resolved path, size, mtime_ns] of a file; a missing file is a DataError."""
  try:
    st = path.stat()
  except FileNotFoundError:
    raise DataError(f'{setting}: {path} does not exist; fix the path in {setting}') from None
  if not path.is_file():
    raise DataError(f'{setting}: {path} is not a file; point {setting} at a file')
  return [str(path), st.st_size, st.st_mtime_ns]


def read_bytes(path: Path, setting: str) -> bytes:
  """The file's bytes, gunzipped when the name ends in `.gz`."""
  try:
    if path.suffix == '.gz':
      with gzip.open(path, 'rb') as f:
        return f.read()
    return path.read_bytes()
  except FileNotFoundError:
    raise DataError(f'{setting}: {path} does not exist; fix the path in {setting}') from None
  except (OSError, EOFError) as e:
    raise DataError(f'{setting}: cannot read {path} ({e}); check the file') from None


def decode(data: bytes, path: Path, utf8_errors: str, setting: str) -> tuple[str, int]:
  """(text, number of replaced invalid byte sequences) under the UTF-8 policy.

  'error' raises a DataError naming the byte offset; 'replace' maps each invalid
  sequence to U+FFFD and counts them (U+FFFD characters already in the file as
  valid UTF-8 are not counted).
  """
  try:
    return data.decode('utf-8'), 0
  except UnicodeDecodeError as e:
    if utf8_errors != 'replace':
      raise DataError(
          f'{setting}: {path} is not valid UTF-8 (byte {e.start}); fix the file or set '
          f'data.utf8_errors=replace') from None
  text = data.decode('utf-8', errors='replace')
  return text, text.count('\ufffd') - data.count(_UTF8_REPLACEMENT)


def read_text(path: Path, utf8_errors: str, setting: str) -> tuple[str, int]:
  """(decoded text, replacements) of a plain or `.gz` file."""
  return decode(read_bytes(path, setting), path, utf8_errors, setting)


def require_nonempty(splits: dict[str, Any], setting: str, what: str):
  """Raises a DataError naming the first empty split."""
  for split, items in splits.items():
    if not items:
      raise DataError(f'{setting}: split {split!r} of {what} is empty; give it data '
                      f'(or a different split setting)')


class _LocalInfo(tfds.core.DatasetInfo):
  """DatasetInfo of a tx builder: its data is always prepared locally, never on GCS."""

  def initialize_from_bucket(self) -> None:
    # TFDS's version makes a temporary folder before it looks for the dataset on GCS and
    # leaves it behind when there is nothing there: one empty /tmp/tmp*tfds per builder
    # made for unprepared data.
    pass


class TxBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of tx builders: Text features, generation order kept, UTF-8 counts kept."""
  VERSION = tfds.core.Version(VERSION)
  FEATURES: tuple[str, ...] = ('text',)
  DESCRIPTION = ''

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.replacements: dict[str, int] = {}

  def _info(self) -> tfds.core.DatasetInfo:
    return _LocalInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict(
            {name: tfds.features.Text() for name in self.FEATURES}),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict())

  def _read(self, path: Path) -> str:
    """Reads one input under this config's UTF-8 policy.

    Replacements (policy 'replace') are logged once per file as a warning and
    kept in `self.replacements` and the dataset's metadata.json
    (`utf8_replacements`: {path: count}).
    """
    cfg = self.builder_config
    text, replaced = read_text(path, cfg.utf8_errors, cfg.setting)
    if replaced and str(path) not in self.replacements:
      log.warning('%s: replaced %d invalid UTF-8 byte sequence(s) with U+FFFD '
                  '(data.utf8_errors=replace)', path, replaced)
      self.replacements[str(path)] = replaced
      self.info.metadata['utf8_replacements'] = dict(self.replacements)
    return text


def prepare(builder: tfds.core.DatasetBuilder) -> None:
  """Prepares `builder` as array_record unless a complete copy already exists.

  Another process may finish the same config first (TFDS's final rename then
  fails here); that counts as success when the finished copy is complete.
  """
  if builder.is_prepared():
    return
  log.info('preparing %s into %s', builder.name, builder.data_path)
  try:
    builder.download_and_prepare(
        file_format='array_record',
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  except OSError:
    if not builder.is_prepared():
      raise


@contextlib.contextmanager
def preparing(builder: tfds.core.DatasetBuilder):
  """Holds an exclusive lock on preparing `builder`'s data, across the processes of a host.

  Processes that start a job together (`jax.distributed`, or two runs sharing a data
  dir) would otherwise all prepare the same config at once; with the lock one prepares
  and the others wait, then find it prepared. The lock file sits beside the version
  folder (a dot-name TFDS does not take for a version).
  """
  path = Path(os.fspath(builder.data_path))
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path.parent / f'.{path.name}.lock', 'w') as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(fh, fcntl.LOCK_UN)


def data_root(data_dir: str | os.PathLike | None) -> Path:
  """`data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets (expanded)."""
  root = data_dir or os.environ.get('TFDS_DATA_DIR') or '~/tensorflow_datasets'
  return Path(root).expanduser()
