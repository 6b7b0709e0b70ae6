"""Subword regularisation (data.subword_dropout): sampled segmentations round-trip and are
reproducible, the training rows are those of data.subword_samples segmentations stacked,
evaluation keeps the deterministic one, and misuse is a one-line error."""

import random

import numpy as np
import pytest

from tx.config import DataConfig
from tx.config.base import ConfigError
from tx.data.errors import DataError
from tx.data.pipeline import make_pipeline
from tx.data.stacked import StackedRows
from tx.data.tokenizers import CharTokenizer, SentencePieceTokenizer

WORDS = ('the a dog cat runs sleeps under yellow small big woman child ball playing jumping '
         'standing wearing outside').split()


def _sentences(n, seed):
  rng = random.Random(seed)
  return [' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + '.' for _ in range(n)]


RECORDS = [{'source': s, 'target': t} for s, t in zip(_sentences(200, 0), _sentences(200, 1))]


@pytest.fixture(scope='module')
def bpe():
  return SentencePieceTokenizer.train([r[k] for r in RECORDS for k in ('source', 'target')],
                                      kind='bpe', vocab_size=320)


def _cfg(**kw):
  return DataConfig(dataset='parallel', tokenizer='bpe', vocab_size=320, seq_len=48,
                    target_len=48, packing=True, **kw)


def _pipe(bpe, split='train', train=True, cache_dir=None, **kw):
  return make_pipeline(_cfg(**kw), 'seq2seq', split, batch_size=8, seed=0, train=train,
                       source=lambda _: RECORDS, tokenizer=bpe, cache_dir=cache_dir)


def test_sampled_segmentations_round_trip_and_repeat_with_the_seed(bpe):
  texts = [r['source'] for r in RECORDS[:50]] + ['marker \u2581 inside']
  fixed = [bpe.encode(t) for t in texts]
  draw = lambda seed: [bpe.sampler(0.3, seed)(t) for t in texts]
  first, again, other = draw(1), draw(1), draw(2)
  assert first == again and first != other
  assert all(bpe.decode(ids) == t for ids, t in zip(first, texts))
  assert sum(map(len, first)) > sum(map(len, fixed))  # dropped merges leave more pieces
  assert [bpe.sampler(0.0, 1)(t) for t in texts] == fixed


def test_stacked_rows_are_each_sources_own_rows(bpe):
  a, b = _pipe(bpe).rows, _pipe(bpe, subword_dropout=0.2, subword_samples=2).rows
  assert isinstance(b, StackedRows) and len(b.sources) == 2
  stack = StackedRows([a, b.sources[0]])
  rows = np.array([0, stack.starts[1], 1, stack.starts[1] + 3, -1])
  got = stack.batch(np.arange(5), rows)
  want_a = a.batch(np.arange(5), np.array([0, -1, 1, -1, -1]))
  want_b = b.sources[0].batch(np.arange(5), np.array([-1, 0, -1, 3, -1]))
  for key in got:
    np.testing.assert_array_equal(got[key][[0, 2, 4]], want_a[key][[0, 2, 4]])
    np.testing.assert_array_equal(got[key][[1, 3]], want_b[key][[1, 3]])
  assert stack.num_rows == a.num_rows + b.sources[0].num_rows
  assert stack.stats['kept'] == a.stats['kept'] + b.sources[0].stats['kept']


def test_training_rows_stack_the_samples_and_evaluation_keeps_one_segmentation(bpe, tmp_path):
  plain = _pipe(bpe)
  sampled = _pipe(bpe, cache_dir=tmp_path, subword_dropout=0.2, subword_samples=3)
  assert sampled.stats['segmentations'] == 3 and sampled.stats['kept'] == 3 * len(RECORDS)
  assert sampled.num_rows > 3 * plain.num_rows * 0.9
  tokens = lambda pipe: sum(int((b['weights'] > 0).sum())
                            for b, _ in zip(pipe.iterator(), range(pipe.num_batches)))
  assert tokens(sampled) > 3 * tokens(plain)  # longer segmentations
  # the same rows again from the cache (and the same order for the same seed)
  again = _pipe(bpe, cache_dir=tmp_path, subword_dropout=0.2, subword_samples=3)
  assert len(list(tmp_path.glob('*/train-dropout0.2-*'))) == 3
  for x, y, _ in zip(sampled.iterator(), again.iterator(), range(5)):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
  for split in ('validation', 'train'):
    ev = [_pipe(bpe, split, train=False, **kw) for kw in ({}, {'subword_dropout': 0.2})]
    assert ev[0].num_rows == ev[1].num_rows
    for x, y in zip(ev[0].iterator(), ev[1].iterator()):
      np.testing.assert_array_equal(x['src'], y['src'])


@pytest.mark.parametrize('kw, says', [
    ({'subword_dropout': 1.0}, 'must be in [0, 1)'),
    ({'subword_dropout': 0.1, 'tokenizer': 'char'}, 'use data.tokenizer=bpe or unigram'),
    ({'subword_samples': 0}, 'must be >= 1'),
])
def test_bad_settings_are_one_line_errors(kw, says):
  with pytest.raises(ConfigError) as e:
    DataConfig(**{'tokenizer': 'bpe', **kw}).validate()
  assert says in str(e.value) and '\n' not in str(e.value)


def test_a_tokenizer_that_cannot_sample_is_refused(tmp_path):
  char = CharTokenizer.train([r['source'] for r in RECORDS])
  with pytest.raises(DataError, match='cannot sample segmentations') as e:
    _pipe(char, subword_dropout=0.1)
  assert '\n' not in str(e.value) and 'data.tokenizer=bpe' in str(e.value)
