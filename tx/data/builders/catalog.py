"""TFDS catalog datasets (`data.dataset=tfds:NAME`): build, prepare, map keys and splits.

Catalog builders (tiny_shakespeare, lm1b, wmt14_translate, ...) need TensorFlow to
*prepare* (they read raw files with `tf.io.gfile`), but not to *read*: tx prepares
them as array_record and reads them with `tfds.data_source`. So a dataset that is
already prepared under `data.data_dir` loads without TensorFlow; preparing one
without TensorFlow raises a DataError saying `pip install 'tx[tf]'`.

Offline preparation: TFDS looks for each download under
`DownloadConfig(manual_dir=...)` by the file name of its URL before it reaches
for the network. tx passes `RAW/NAME/` (NAME without its config) when that folder
exists, else `RAW/` itself, where RAW is `data.raw_dir` or $TX_RAW_DATA. A
download that fails anyway (no network) becomes a one-line DataError.
"""

from __future__ import annotations

import importlib
import importlib.util
import socket
from pathlib import Path

import tensorflow_datasets as tfds

from tx.data.builders import common
from tx.data.errors import DataError

# Catalog modules that `import tensorflow_datasets` registers only lazily.
_LEGACY_MODULES = ('text', 'translate', 'summarization', 'question_answering')
# Canonical split -> names a catalog dataset may use, in order of preference.
SPLIT_ALIASES = {'train': ('train',), 'validation': ('validation', 'valid', 'val', 'dev', 'test'),
                 'test': ('test',)}
_NETWORK_WORDS = ('connection', 'timeout', 'maxretry', 'nameresolution', 'download')


def tf_available() -> bool:
  """Whether TensorFlow can be imported (without importing it)."""
  try:
    return importlib.util.find_spec('tensorflow') is not None
  except (ImportError, ValueError):  # Blocked by an import hook, or a spec-less module.
    return False


def catalog_builder(name: str, data_dir: Path) -> tfds.core.DatasetBuilder:
  """The TFDS builder for catalog `name` ('lm1b', 'wmt14_translate/de-en') in data_dir."""
  setting = f'data.dataset=tfds:{name}'
  for attempt in range(2):
    try:
      return tfds.builder(name, data_dir=str(data_dir), file_format='array_record')
    except tfds.core.registered.DatasetNotFoundError:
      if attempt:
        raise DataError(f'{setting}: TFDS has no dataset {name!r}; pick one from '
                        f'https://www.tensorflow.org/datasets/catalog') from None
      for module in _LEGACY_MODULES:
        try:
          importlib.import_module(f'tensorflow_datasets.{module}')
        except ImportError:
          pass
    except (ValueError, AssertionError) as e:
      raise DataError(f'{setting}: {_first_line(e)}') from None
  raise AssertionError('unreachable')


def prepare_catalog(builder: tfds.core.DatasetBuilder, name: str, raw: Path | None) -> None:
  """Prepares a catalog dataset as array_record, offline from `raw` when possible."""
  if builder.is_prepared():
    return
  setting = f'data.dataset=tfds:{name}'
  if not tf_available():
    raise DataError(f"{setting}: preparing a TFDS catalog dataset needs TensorFlow; run "
                    f"pip install 'tx[tf]' (reading it once prepared does not)")
  base = name.split('/')[0].split(':')[0]
  manual = None
  if raw is not None:
    manual = raw / base if (raw / base).is_dir() else raw
  config = tfds.download.DownloadConfig(
      manual_dir=str(manual) if manual else None, try_download_gcs=False)
  try:
    builder.download_and_prepare(file_format='array_record', download_config=config)
  except Exception as e:  # pylint: disable=broad-except
    if builder.is_prepared():  # Another process finished it first.
      return
    if _is_network_error(e):
      raise DataError(
          f'{setting}: downloading its raw files failed ({type(e).__name__}; offline?); put '
          f'them in RAW/{base}/ and set TX_RAW_DATA (or data.raw_dir) to RAW') from None
    if 'manual' in str(e).lower():
      raise DataError(
          f'{setting}: needs files downloaded by hand; put them in RAW/{base}/ and set '
          f'TX_RAW_DATA (or data.raw_dir) to RAW (see its TFDS catalog page)') from None
    raise


def record_keys(builder, source_lang: str, target_lang: str) -> tuple[str, dict[str, str]]:
  """(kind, {tx key: catalog feature}) for a catalog dataset.

  Translation datasets ({'de': ..., 'en': ...}) map data.source_lang -> 'source'
  and data.target_lang -> 'target'; datasets with a 'text' feature are 'text'.
  """
  features = builder.info.features
  keys = list(features.keys())
  name = f'tfds:{builder.info.full_name}'
  if isinstance(features, tfds.features.Translation) or (
      source_lang in keys and target_lang in keys):
    for setting, lang in (('data.source_lang', source_lang), ('data.target_lang', target_lang)):
      if lang not in keys:
        raise DataError(f'{setting}: {lang!r} is not a language of {name}; use one of '
                        f'{", ".join(keys)}')
    return 'parallel', {'source': source_lang, 'target': target_lang}
  if 'text' in keys:
    return 'text', {'text': 'text'}
  raise DataError(f'data.dataset={name}: tx reads text datasets (a "text" feature) or '
                  f'translation datasets; this one has {", ".join(keys)}')


def split_name(builder, split: str) -> str | None:
  """The catalog's own split for canonical `split` (validation may fall back to test)."""
  available = list(builder.info.splits.keys())
  for candidate in SPLIT_ALIASES[split]:
    if candidate in available:
      if split == 'validation' and candidate == 'test':
        common.log.warning('%s has no validation split; using its test split',
                           builder.info.full_name)
      return candidate
  return None


def _is_network_error(error: BaseException) -> bool:
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, (ConnectionError, socket.gaierror, TimeoutError)):
      return True
    if any(word in type(error).__name__.lower() for word in _NETWORK_WORDS):
      return True
    error = error.__cause__ or error.__context__
  return False


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__
