"""`tx.data.sources`: real datasets (tinyshakespeare, multi30k, stdlib) and the API's errors."""

import gzip
import importlib.util
import os
import pickle
import sys
from pathlib import Path

import pytest

from tx.config import DataConfig
from tx.data import sources
from tx.data.builders import catalog, stdlib
from tx.data.errors import DataError

NO_TF = importlib.util.find_spec('tensorflow') is None


def _shared_data() -> Path | None:
  """$TX_RAW_DATA, else the repo's sibling shared/data, when it holds the raw files."""
  for root in (os.environ.get('TX_RAW_DATA'),
               Path(__file__).resolve().parents[2] / '..' / 'shared' / 'data'):
    if root and (Path(root) / 'tinyshakespeare' / 'input.txt').is_file() and (
        Path(root) / 'multi30k' / 'train.en.gz').is_file():
      return Path(root).resolve()
  return None


RAW = _shared_data()
needs_raw = pytest.mark.skipif(
    RAW is None, reason='raw data not found: set TX_RAW_DATA or put shared/data next to the '
    'repo (tinyshakespeare/input.txt, multi30k/*.gz)')


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(autouse=True)
def _no_env_raw(monkeypatch):
  monkeypatch.delenv('TX_RAW_DATA', raising=False)


def _one_line(excinfo, *words):
  message = str(excinfo.value)
  assert '\n' not in message, message
  for word in words:
    assert word in message, (word, message)


@needs_raw
def test_tinyshakespeare_is_90_10_by_position_and_rejoins(cache):
  cfg = DataConfig(dataset='tinyshakespeare', raw_dir=str(RAW), data_dir=cache)
  original = (RAW / 'tinyshakespeare' / 'input.txt').read_bytes().decode('utf-8')
  train, val = sources.load_source(cfg, 'train'), sources.load_source(cfg, 'validation')
  assert len(original) == 1_115_394
  assert len(train[0]['text']) == int(len(original) * 0.9)  # nanoGPT: data[:int(n*0.9)]
  assert train[0]['text'] + val[0]['text'] == original
  assert sources.dataset_kind(cfg) == 'text'
  assert sources.prepared_dir(cfg).is_dir()
  if NO_TF:
    assert sys.modules.get('tensorflow') is None


@needs_raw
def test_multi30k_has_all_splits_and_first_pair_matches_raw(cache):
  cfg = DataConfig(dataset='multi30k', raw_dir=str(RAW), data_dir=cache)
  sizes = {split: len(sources.load_source(cfg, split)) for split in sources.SPLITS}
  assert sizes == {'train': 29_000, 'validation': 1_014, 'test': 1_000}
  for split, stem in sources.MULTI30K_FILES.items():
    first = {lang: gzip.open(RAW / 'multi30k' / f'{stem}.{lang}.gz', 'rt',
                             encoding='utf-8').readline().rstrip('\n') for lang in ('en', 'de')}
    assert sources.load_source(cfg, split)[0] == {'source': first['en'], 'target': first['de']}
  flipped = cfg.replace(source_lang='de', target_lang='en')
  assert sources.load_source(flipped, 'train')[0]['source'].startswith('Zwei junge')
  assert sources.prepared_dir(flipped) != sources.prepared_dir(cfg)
  assert sources.dataset_kind(cfg) == 'parallel'
  if NO_TF:
    assert sys.modules.get('tensorflow') is None


def test_stdlib_split_is_fixed_disjoint_and_nonempty(cache):
  cfg = DataConfig(dataset='stdlib', data_dir=cache)
  files = stdlib.stdlib_files()
  val_files = [f for f in files if stdlib.split_of(f) == 'validation']
  assert [stdlib.split_of(f) for f in ('asyncio/events.py', 'os.py', 'typing.py')] == [
      'validation', 'train', 'train']  # crc32 % 10 == 0: the same on every machine
  assert not any(part in stdlib.EXCLUDED_DIRS for f in files for part in f.split('/')[:-1])
  train, val = sources.load_source(cfg, 'train'), sources.load_source(cfg, 'validation')
  assert len(val) == len(val_files) > 0 and len(train) == len(files) - len(val_files) > 0
  root = stdlib.stdlib_root()
  read = lambda rel: (root / rel).read_bytes().decode('utf-8')
  assert [r['text'] for r in val] == [read(f) for f in val_files]  # sorted, one per file
  train_files = [f for f in files if f not in set(val_files)]
  assert (train[0]['text'], train[-1]['text']) == (read(train_files[0]), read(train_files[-1]))
  assert sources.prepared_dir(cfg) == sources.prepared_dir(DataConfig(dataset='stdlib',
                                                                      data_dir=cache))
  with pytest.raises(DataError) as e:
    sources.load_source(cfg, 'test')
  _one_line(e, "no 'test' split", 'train, validation')


def test_source_is_random_access_and_picklable(cache):
  src = sources.load_source(DataConfig(dataset='stdlib', data_dir=cache), 'validation')
  again = pickle.loads(pickle.dumps(src))
  assert len(again) == len(src) and again[-1] == src[len(src) - 1]
  assert src.__getitems__([1, 0]) == [src[1], src[0]]
  assert all(isinstance(v, str) for v in src[0].values())
  with pytest.raises(IndexError):
    src[len(src)]


def test_multi30k_without_raw_dir_says_how_to_point_at_it(tmp_path):
  with pytest.raises(DataError) as e:
    sources.load_source(DataConfig(dataset='multi30k', data_dir=str(tmp_path)), 'train')
  _one_line(e, 'TX_RAW_DATA', 'data.raw_dir', 'multi30k/')


def test_raw_dir_missing_a_file_names_the_expected_path(tmp_path):
  cfg = DataConfig(dataset='tinyshakespeare', raw_dir=str(tmp_path), data_dir=str(tmp_path))
  with pytest.raises(DataError) as e:
    sources.load_source(cfg, 'train')
  _one_line(e, 'data.raw_dir', str(tmp_path / 'tinyshakespeare' / 'input.txt'))


@pytest.mark.skipif(not NO_TF, reason='TensorFlow is installed: catalog preparation works')
@pytest.mark.parametrize('dataset', ['tfds:tiny_shakespeare', 'tinyshakespeare'])
def test_catalog_preparation_without_tensorflow_says_pip_install(tmp_path, dataset):
  with pytest.raises(DataError) as e:
    sources.load_source(DataConfig(dataset=dataset, data_dir=str(tmp_path)), 'train')
  _one_line(e, "pip install 'tx[tf]'")
  assert not any(tmp_path.rglob('*.array_record*'))


def test_catalog_kind_and_unknown_names(tmp_path):
  assert sources.dataset_kind(DataConfig(dataset='tfds:lm1b', data_dir=str(tmp_path))) == 'text'
  wmt = DataConfig(dataset='tfds:wmt14_translate/de-en', data_dir=str(tmp_path))
  assert sources.dataset_kind(wmt) == 'parallel'
  with pytest.raises(DataError) as e:
    sources.dataset_kind(wmt.replace(source_lang='fr'))
  _one_line(e, 'data.source_lang', "'fr'")
  with pytest.raises(DataError) as e:
    sources.dataset_kind(DataConfig(dataset='tfds:no_such_dataset', data_dir=str(tmp_path)))
  _one_line(e, 'no_such_dataset')
  with pytest.raises(DataError) as e:
    sources.load_source(DataConfig(dataset='wikitext', data_dir=str(tmp_path)), 'train')
  _one_line(e, 'data.dataset', 'stdlib, tinyshakespeare')
  with pytest.raises(DataError) as e:
    sources.load_source(DataConfig(dataset='stdlib', data_dir=str(tmp_path)), 'dev')
  _one_line(e, "'dev'", 'train, validation, test')


def test_offline_catalog_download_is_one_line_error(monkeypatch, tmp_path):
  class OfflineBuilder:
    def is_prepared(self):
      return False

    def download_and_prepare(self, **kwargs):
      self.kwargs = kwargs
      raise RuntimeError('download failed') from ConnectionError('Name resolution failed')

  monkeypatch.setattr(catalog, 'tf_available', lambda: True)
  (tmp_path / 'lm1b').mkdir()
  builder = OfflineBuilder()
  with pytest.raises(DataError) as e:
    catalog.prepare_catalog(builder, 'lm1b', tmp_path)
  _one_line(e, 'tfds:lm1b', 'offline', 'TX_RAW_DATA')
  assert builder.kwargs['file_format'] == 'array_record'
  assert builder.kwargs['download_config'].manual_dir == str(tmp_path / 'lm1b')


def test_parallel_files_resolve_against_raw_dir(tmp_path):
  for split in ('train', 'val'):
    (tmp_path / f'{split}.de').write_text(f'{split} eins\n{split} zwei\n')
    (tmp_path / f'{split}.en').write_text(f'{split} one\n{split} two\n')
  cfg = DataConfig(dataset='parallel', raw_dir=str(tmp_path), data_dir=str(tmp_path / 'tfds'),
                   source_files=('train.de', 'val.de'), target_files=('train.en', 'val.en'))
  assert sources.load_source(cfg, 'validation')[1] == {'source': 'val zwei', 'target': 'val two'}
  with pytest.raises(DataError) as e:
    sources.load_source(cfg.replace(target_files=('train.en',)), 'train')
  _one_line(e, 'data.target_files', 'data.source_files')
  with pytest.raises(DataError) as e:
    sources.load_source(cfg.replace(source_files=None), 'train')
  _one_line(e, 'data.source_files')


def test_raw_dir_prefers_setting_then_environment(monkeypatch, tmp_path):
  assert sources.raw_dir(DataConfig()) is None
  monkeypatch.setenv('TX_RAW_DATA', str(tmp_path / 'env'))
  assert sources.raw_dir(DataConfig()) == tmp_path / 'env'
  assert sources.raw_dir(DataConfig(raw_dir=str(tmp_path / 'cfg'))) == tmp_path / 'cfg'
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'cache'))
  assert sources.data_dir(DataConfig()) == tmp_path / 'cache'


def test_a_builder_made_while_another_process_prepared_reads_the_data(tmp_path, monkeypatch):
  """Two processes sharing a data dir (notebooks side by side, the processes of a job): one
  made its builder before the other finished preparing, and then finds the data prepared;
  it reads the splits that were written, not the empty ones its builder saw."""
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n'.join(f'line {i} of a small corpus' for i in range(200)) + '\n')
  cfg = DataConfig(dataset='text', files=str(corpus), data_dir=str(tmp_path / 'tfds'))
  stale = sources._resolve(cfg)  # pylint: disable=protected-access
  prepared = len(sources.load_source(cfg, 'train'))  # "the other process"
  fresh = sources._resolve  # pylint: disable=protected-access
  first = iter([stale])
  monkeypatch.setattr(sources, '_resolve', lambda c: next(first, None) or fresh(c))
  assert len(sources.load_source(cfg, 'train')) == prepared > 0
