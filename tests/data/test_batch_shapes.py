"""tx.data.shapes.batch_shapes (config only) equals Pipeline.batch_spec() (real data) for every
objective and row layout, so `tx plan` compiles the step `tx train` runs."""

import numpy as np
import pytest

from tx.config import DataConfig
from tx.data.errors import DataError
from tx.data.pipeline import make_pipeline
from tx.data.shapes import batch_shapes
from tx.data.tokenizers.specials import NUM_SPECIALS

ALPHABET = ' abcdefghijklmnopqrstuvwxyz.'


class Chars:
  """A fixed character tokenizer (no training, nothing cached)."""
  vocab_size = NUM_SPECIALS + len(ALPHABET)

  def encode(self, text):
    return [NUM_SPECIALS + ALPHABET.index(c) for c in text]

  def num_bytes(self, ids):
    return sum(1 for i in ids if i >= NUM_SPECIALS)

  def header(self):
    return {'kind': 'chars', 'alphabet': ALPHABET}


def source(parallel: bool):
  rng = np.random.default_rng(0)
  words = lambda: ' '.join(''.join(rng.choice(list('abcdefgh'), 4)) for _ in range(3)) + '.'
  rows = [({'source': words(), 'target': words()} if parallel else {'text': words()})
          for _ in range(60)]
  return lambda split: rows


CASES = {
    'lm_windows': ('causal_lm', dict(seq_len=16)),
    'lm_packed': ('causal_lm', dict(seq_len=24, lm_sampling='packed')),
    'mlm_windows': ('mlm', dict(seq_len=16)),
    'mlm_packed': ('mlm', dict(seq_len=24, packing=True)),
    'seq2seq': ('seq2seq', dict(seq_len=32, target_len=40)),
    'seq2seq_packed': ('seq2seq', dict(seq_len=32, target_len=24, packing=True)),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_batch_shapes_equal_the_pipeline_spec(case):
  objective, overrides = CASES[case]
  cfg = DataConfig(**overrides)
  pipe = make_pipeline(cfg, objective, 'train', batch_size=8, seed=0,
                       source=source(objective == 'seq2seq'), tokenizer=Chars())
  spec = {k: (tuple(s), np.dtype(d)) for k, (s, d) in pipe.batch_spec().items()}
  assert batch_shapes(cfg, objective, 8) == spec


def test_the_spec_of_a_huge_batch_builds_one_row_not_the_batch():
  """The spec is read off one row: a batch of 2^24 rows was once built (GiBs, tens of
  seconds) only to be measured before the step compiled."""
  objective, overrides = CASES['lm_windows']
  pipe = make_pipeline(DataConfig(**overrides), objective, 'train', batch_size=2 ** 24, seed=0,
                       source=source(False), tokenizer=Chars())
  built = []
  real_batch = pipe.rows.batch
  pipe.rows.batch = lambda keys, rows: built.append(len(rows)) or real_batch(keys, rows)
  spec = pipe.batch_spec()
  assert built == [1] and spec['inputs'] == ((2 ** 24, 16), np.dtype(np.int32))


def test_unknown_objective():
  with pytest.raises(DataError, match='objective'):
    batch_shapes(DataConfig(), 'lm', 8)
