"""tx's TFDS builders on small temporary files: splits, errors, caching, atomicity."""

import gzip
import importlib.util
import json
import logging
import sys
import tempfile
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from tx.config import DataConfig
from tx.data import sources
from tx.data.builders import TxParallel, TxText, parallel_builder, prepare, text_builder
from tx.data.builders.text import assign_files
from tx.data.errors import DataError


def _text_cfg(tmp_path, files, **kw):
  return DataConfig(dataset='text', files=str(files), data_dir=str(tmp_path / 'tfds'), **kw)


def _parallel_cfg(tmp_path, src, tgt, **kw):
  return DataConfig(dataset='parallel', source_files=tuple(map(str, src)),
                    target_files=tuple(map(str, tgt)), data_dir=str(tmp_path / 'tfds'), **kw)


def _one_line_error(excinfo, *words):
  message = str(excinfo.value)
  assert '\n' not in message, message
  for word in words:
    assert word in message, (word, message)


def test_single_file_splits_by_position_and_rejoins(tmp_path):
  text = ''.join(f'line {i}: h\u00e9llo\r\n' for i in range(100))
  path = tmp_path / 'corpus.txt'
  path.write_bytes(text.encode('utf-8'))
  cfg = _text_cfg(tmp_path, path, validation_fraction=0.25)
  train = sources.load_source(cfg, 'train')
  val = sources.load_source(cfg, 'validation')
  assert len(train) == len(val) == 1
  assert train[0]['text'] == text[:int(len(text) * 0.75)]
  assert train[0]['text'] + val[0]['text'] == text  # CRLF kept verbatim


def test_folder_assigns_last_sorted_files_to_validation(tmp_path):
  folder = tmp_path / 'docs'
  (folder / 'sub').mkdir(parents=True)
  for name in ('b.txt', 'a.txt', 'sub/c.txt', 'd.txt'):
    (folder / name).write_text(f'doc {name}\n')
  (folder / '.hidden').write_text('ignored')
  (folder / 'empty.txt').write_text('')
  cfg = _text_cfg(tmp_path, folder, validation_fraction=0.25)
  train = [r['text'] for r in sources.load_source(cfg, 'train')]
  val = [r['text'] for r in sources.load_source(cfg, 'validation')]
  assert train == ['doc a.txt\n', 'doc b.txt\n', 'doc d.txt\n']
  assert val == ['doc sub/c.txt\n']


def test_files_named_by_split_go_to_that_split(tmp_path):
  for split in ('train', 'valid', 'test'):
    (tmp_path / f'wiki.{split}.tokens').write_text(f'{split} text')
  cfg = _text_cfg(tmp_path, tmp_path / 'wiki.*.tokens')
  assert sources.load_source(cfg, 'validation')[0] == {'text': 'valid text'}
  assert sources.load_source(cfg, 'test')[0] == {'text': 'test text'}
  paths = [Path('x.train.txt'), Path('x.dev.txt'), Path('y.train.txt')]
  assert assign_files(paths, 0.5) == {'train': [paths[0], paths[2]], 'validation': [paths[1]]}


def test_parallel_pairs_lines_in_order_from_gz_and_plain(tmp_path):
  src, tgt = tmp_path / 'train.de.gz', tmp_path / 'train.en'
  with gzip.open(src, 'wt', encoding='utf-8') as f:
    f.write('Ein Hund.\r\n\nZwei  Katzen.\n')
  tgt.write_text('A dog.\n\nTwo  cats.')  # No final newline: still three lines.
  source = sources.load_source(_parallel_cfg(tmp_path, [src], [tgt]), 'train')
  assert [source[i] for i in range(len(source))] == [
      {'source': 'Ein Hund.', 'target': 'A dog.'}, {'source': '', 'target': ''},
      {'source': 'Zwei  Katzen.', 'target': 'Two  cats.'}]
  with pytest.raises(DataError) as e:
    sources.load_source(_parallel_cfg(tmp_path, [src], [tgt]), 'validation')
  _one_line_error(e, "no 'validation' split", 'train')


def test_mismatched_line_counts_name_both_files(tmp_path):
  src, tgt = tmp_path / 's.txt', tmp_path / 't.txt'
  src.write_text('a\nb\nc\n')
  tgt.write_text('x\ny\n')
  with pytest.raises(DataError) as e:
    sources.load_source(_parallel_cfg(tmp_path, [src], [tgt]), 'train')
  _one_line_error(e, str(src), str(tgt), '3 lines', 'has 2')
  assert not (tmp_path / 'tfds' / 'tx_parallel').exists() or not any(
      (tmp_path / 'tfds' / 'tx_parallel').rglob('*.array_record*'))


@pytest.mark.parametrize('content,words', [
    (None, ['does not exist']),
    (b'', ['is empty']),
    (b'x', ['too short', 'data.validation_fraction']),
])
def test_missing_empty_or_unsplittable_file_is_one_line_error(tmp_path, content, words):
  path = tmp_path / 'corpus.txt'
  if content is not None:
    path.write_bytes(content)
  with pytest.raises(DataError) as e:
    sources.load_source(_text_cfg(tmp_path, path), 'train')
  _one_line_error(e, 'data.files', str(path), *words)


def test_invalid_utf8_errors_or_counts_replacements(tmp_path, caplog):
  path = tmp_path / 'bad.txt'
  # Two invalid sequences plus one genuine U+FFFD, which must not be counted.
  path.write_bytes(b'caf\xe9 ok \xef\xbf\xbd and \xff' + b' more text' * 20)
  with pytest.raises(DataError) as e:
    sources.load_source(_text_cfg(tmp_path, path), 'train')
  _one_line_error(e, str(path), 'byte 3', 'data.utf8_errors=replace')
  cfg = _text_cfg(tmp_path, path, utf8_errors='replace')
  with caplog.at_level(logging.WARNING, logger='tx.data'):
    train = sources.load_source(cfg, 'train')
  assert train[0]['text'].startswith('caf\ufffd ok \ufffd and \ufffd')
  assert any('replaced 2 invalid UTF-8' in r.getMessage() for r in caplog.records)
  metadata = json.loads((sources.prepared_dir(cfg) / 'metadata.json').read_text())
  assert metadata['utf8_replacements'] == {str(path.resolve()): 2}


def test_second_load_reuses_and_changed_input_prepares_anew(tmp_path, monkeypatch):
  path = tmp_path / 'corpus.txt'
  path.write_text('first version of the text\n' * 10)
  cfg = _text_cfg(tmp_path, path)
  calls = []
  original = TxText._split_generators
  monkeypatch.setattr(TxText, '_split_generators',
                      lambda self, dl: calls.append(1) or original(self, dl))
  sources.load_source(cfg, 'train')
  first_dir = sources.prepared_dir(cfg)
  mtimes = {p: p.stat().st_mtime_ns for p in first_dir.iterdir()}
  sources.load_source(cfg, 'train')
  sources.load_source(cfg, 'validation')
  assert len(calls) == 1
  assert {p: p.stat().st_mtime_ns for p in first_dir.iterdir()} == mtimes
  path.write_text('second version, longer than the first one\n' * 10)
  assert sources.load_source(cfg, 'train')[0]['text'].startswith('second version')
  assert len(calls) == 2 and sources.prepared_dir(cfg) != first_dir
  other = sources.prepared_dir(cfg.replace(validation_fraction=0.2))
  assert other != sources.prepared_dir(cfg)


def test_failed_preparation_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
  src, tgt = tmp_path / 's.txt', tmp_path / 't.txt'
  src.write_text(''.join(f's{i}\n' for i in range(50)))
  tgt.write_text(''.join(f't{i}\n' for i in range(50)))
  cfg = _parallel_cfg(tmp_path, [src], [tgt])
  original = TxParallel._generate_examples

  def fail_midway(self, lines):
    for i, example in enumerate(original(self, lines)):
      if i == 20:
        raise RuntimeError('disk full')
      yield example

  monkeypatch.setattr(TxParallel, '_generate_examples', fail_midway)
  with pytest.raises(Exception, match='disk full'):
    sources.load_source(cfg, 'train')
  config_dir = sources.prepared_dir(cfg).parent
  assert not sources.prepared_dir(cfg).exists()
  assert not any(p.name.startswith('incomplete') for p in config_dir.parent.rglob('*'))
  # A preparation killed outright leaves an incomplete.* folder: never taken as complete.
  (config_dir / 'incomplete.ABCDEF_1.0.0').mkdir(parents=True)
  (config_dir / 'incomplete.ABCDEF_1.0.0' / 'dataset_info.json').write_text('{}')
  monkeypatch.setattr(TxParallel, '_generate_examples', original)
  source = sources.load_source(cfg, 'train')
  assert len(source) == 50 and source[49] == {'source': 's49', 'target': 't49'}


def test_prepared_data_reads_back_with_tfds_data_source(tmp_path):
  src, tgt = tmp_path / 's.txt', tmp_path / 't.txt'
  src.write_text('eins\nzwei\n')
  tgt.write_text('one\ntwo\n')
  builder = parallel_builder({'train': (src, tgt)}, label='demo', data_dir=tmp_path / 'tfds')
  prepare(builder)
  name = f'{builder.name}/{builder.builder_config.name}'
  ds = tfds.data_source(name, split='train', data_dir=str(tmp_path / 'tfds'))
  assert len(ds) == 2
  assert ds[1] == {'source': b'zwei', 'target': b'two'}  # Text features store UTF-8 bytes.


@pytest.mark.skipif(importlib.util.find_spec('tensorflow') is not None,
                    reason='TensorFlow is installed here; this test proves tx prepares without it')
def test_builders_prepare_without_tensorflow(tmp_path):
  (tmp_path / 'c.txt').write_text('some text to split by position\n' * 5)
  (tmp_path / 's.txt').write_text('a\nb\n')
  (tmp_path / 't.txt').write_text('x\ny\n')
  text = text_builder([tmp_path / 'c.txt'], label='c', data_dir=tmp_path / 'tfds')
  pairs = parallel_builder({'train': (tmp_path / 's.txt', tmp_path / 't.txt')}, label='p',
                           data_dir=tmp_path / 'tfds')
  prepare(text)
  prepare(pairs)
  assert len(text.as_data_source('train')) == 1 and len(pairs.as_data_source('train')) == 2
  assert sys.modules.get('tensorflow') is None


def test_a_builder_for_unprepared_data_leaves_no_temporary_folder(tmp_path, monkeypatch):
  (tmp_path / 'c.txt').write_text('some text\n' * 5)
  scratch = tmp_path / 'scratch'
  scratch.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(scratch))  # where mkdtemp() would put one
  text_builder([tmp_path / 'c.txt'], label='c', data_dir=tmp_path / 'tfds')
  assert list(scratch.iterdir()) == []


def test_text_builder_rejects_missing_input_before_writing(tmp_path):
  with pytest.raises(DataError) as e:
    text_builder([tmp_path / 'nope.txt'], label='x', data_dir=tmp_path / 'tfds')
  _one_line_error(e, 'nope.txt', 'does not exist')
  assert not (tmp_path / 'tfds').exists()
