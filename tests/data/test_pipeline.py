"""make_pipeline: determinism, checkpointable state, sharding, eval coverage, static shapes.

Uses tiny in-memory sources and a tiny char tokenizer (no files) except the
integration tests at the end, which read the shared raw data when it is present.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tx.config import DataConfig
from tx.data.errors import DataError
from tx.data.pipeline import make_pipeline
from tx.data.tokenizers.specials import BOS_ID, EOS_ID, NUM_SPECIALS, PAD_ID

ALPHABET = ' abcdefghijklmnopqrstuvwxyz.'


class TinyCharTokenizer:
  """28 characters after the 5 specials; counts encode calls (to see the cache work)."""
  vocab_size = NUM_SPECIALS + len(ALPHABET)

  def __init__(self):
    self.calls = 0

  def encode(self, text):
    self.calls += 1
    return [NUM_SPECIALS + ALPHABET.index(c) for c in text]

  def decode(self, ids):
    return ''.join(ALPHABET[i - NUM_SPECIALS] for i in ids if i >= NUM_SPECIALS)

  def num_bytes(self, ids):
    return sum(1 for i in ids if i >= NUM_SPECIALS)

  def header(self):
    return {'kind': 'tiny', 'alphabet': ALPHABET}


def sentence(rng, lo, hi):
  words = [''.join(rng.choice(list(ALPHABET[1:-1]), rng.integers(1, 6)))
           for _ in range(rng.integers(lo, hi + 1))]
  return ' '.join(words) + '.'


def text_source(n=120, seed=0):
  rng = np.random.default_rng(seed)
  splits = {s: [{'text': sentence(rng, 1, 8)} for _ in range(n)]
            for s in ('train', 'validation', 'test')}
  return lambda split: splits[split]


def code(i):
  """A unique lowercase word for integer i (makes every target distinct)."""
  return ''.join(ALPHABET[1 + int(d)] for d in str(i))


def parallel_source(n=150, seed=0):
  rng = np.random.default_rng(seed)
  splits = {s: [{'source': sentence(rng, 1, 4), 'target': code(i) + ' ' + sentence(rng, 1, 4)}
                for i in range(n)] for s in ('train', 'validation', 'test')}
  return lambda split: splits[split]


CASES = {  # name: (objective, config overrides, source, batch size)
    'lm_windows': ('causal_lm', dict(seq_len=16), text_source, 8),
    'lm_packed': ('causal_lm', dict(seq_len=24, lm_sampling='packed'), text_source, 8),
    'mlm_windows': ('mlm', dict(seq_len=16), text_source, 8),
    'mlm_packed': ('mlm', dict(seq_len=24, lm_sampling='packed'), text_source, 8),
    'seq2seq': ('seq2seq', dict(seq_len=32, target_len=40), parallel_source, 8),
    'seq2seq_packed': ('seq2seq', dict(seq_len=32, target_len=32, packing=True),
                       parallel_source, 8),
}


def pipeline(case, *, seed=0, split='train', train=True, shard_index=0, shard_count=1,
             batch_size=None, tokenizer=None, **kw):
  objective, overrides, source, bs = CASES[case]
  cfg = DataConfig(**{**overrides, **kw})
  return make_pipeline(cfg, objective, split, batch_size=batch_size or bs, seed=seed,
                       shard_index=shard_index, shard_count=shard_count, train=train,
                       source=source(), tokenizer=tokenizer or TinyCharTokenizer())


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def batches_differ(a, b):
  return any((x['targets'] != y['targets']).any() for x, y in zip(a, b))


@pytest.mark.parametrize('case', list(CASES))
def test_state_roundtrip_through_json_gives_same_next_batches(case):
  pipe = pipeline(case)
  it = pipe.iterator()
  take(it, 7)
  state = json.loads(json.dumps(it.get_state()))
  expected = take(it, 3)
  assert_batches_equal(take(pipe.iterator(state), 3), expected)
  # A new pipeline object (a restarted process) restores the same way.
  it2 = pipeline(case).iterator()
  it2.set_state(state)
  assert_batches_equal(take(it2, 3), expected)


@pytest.mark.parametrize('case', ['lm_windows', 'mlm_packed', 'seq2seq_packed'])
def test_seed_determines_order(case):
  a, b = take(pipeline(case, seed=1).iterator(), 4), take(pipeline(case, seed=1).iterator(), 4)
  assert_batches_equal(a, b)
  c = take(pipeline(case, seed=2).iterator(), 4)
  assert batches_differ(a, c)


@pytest.mark.parametrize('case', ['lm_windows', 'lm_packed', 'mlm_windows', 'seq2seq'])
def test_two_shards_are_disjoint_halves_of_the_global_batch(case):
  whole = take(pipeline(case).iterator(), 5)
  halves = [take(pipeline(case, shard_index=i, shard_count=2).iterator(), 5) for i in range(2)]
  for step in range(5):
    h0, h1 = halves[0][step], halves[1][step]
    assert h0['targets'].shape[0] == h1['targets'].shape[0] == 4
    rows0 = {r.tobytes() for r in h0['targets']}
    rows1 = {r.tobytes() for r in h1['targets']}
    assert not rows0 & rows1  # disjoint
    # Together they are the single-process global batch (same rows, same masks).
    for k in whole[step]:
      both = np.concatenate([h0[k], h1[k]])
      assert sorted(map(bytes, both)) == sorted(map(bytes, whole[step][k])), k


def test_resume_on_another_number_of_processes():
  it = pipeline('mlm_windows').iterator()
  take(it, 4)
  state = json.loads(json.dumps(it.get_state()))
  expected = take(it, 2)
  halves = [take(pipeline('mlm_windows', shard_index=i, shard_count=2).iterator(state), 2)
            for i in range(2)]
  for step in range(2):
    both = np.concatenate([halves[0][step]['inputs'], halves[1][step]['inputs']])
    assert sorted(map(bytes, both)) == sorted(map(bytes, expected[step]['inputs']))


def test_state_from_another_seed_is_refused():
  state = pipeline('lm_windows', seed=1).iterator().get_state()
  with pytest.raises(DataError, match='seed'):
    pipeline('lm_windows', seed=2).iterator(state)


@pytest.mark.parametrize('case', list(CASES))
def test_static_shapes_over_many_steps(case):
  pipe = pipeline(case)
  spec = pipe.batch_spec()
  it = pipe.iterator()
  for _ in range(3 * pipe.num_batches + 5):  # several epochs
    batch = next(it)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == spec
  assert it.get_state()['epoch'] >= 3


def test_epochs_reshuffle_and_cover_all_rows():
  pipe = pipeline('seq2seq', batch_size=10)
  n = pipe.num_rows
  it = pipe.iterator()
  targets = np.concatenate([b['targets'] for b in take(it, 2 * n // 10)])
  first, second = targets[:n], targets[n:2 * n]
  assert len({r.tobytes() for r in first}) == n  # each pair once per epoch
  assert {r.tobytes() for r in first} == {r.tobytes() for r in second}
  assert (first != second).any()  # in another order


@pytest.mark.parametrize('case', ['seq2seq', 'seq2seq_packed'])
def test_seq2seq_eval_covers_every_pair_once(case):
  records = parallel_source()('validation')
  tok = TinyCharTokenizer()
  for shard_count in (1, 2):
    seen, shapes = [], set()
    for i in range(shard_count):
      pipe = pipeline(case, split='validation', train=False, shard_index=i,
                      shard_count=shard_count, batch_size=16)
      it = pipe.iterator()
      for batch in take(it, pipe.num_batches):
        shapes.add(batch['targets'].shape)
        seg = batch.get('tgt_segment_ids', (batch['weights'] > 0).astype(int))
        for r in range(len(seg)):
          for s in range(1, seg[r].max() + 1):
            idx = np.flatnonzero(seg[r] == s)
            assert batch['targets'][r, idx[-1]] == EOS_ID
            seen.append(tok.decode(batch['targets'][r, idx]))
      with pytest.raises(StopIteration):
        next(it)
    assert sorted(seen) == sorted(r['target'] for r in records)
    assert len(shapes) == 1


def test_lm_eval_scores_every_token_once():
  pipe = pipeline('lm_windows', split='validation', train=False, batch_size=4)
  records = text_source()('validation')
  stream = []
  for r in records:
    stream += [NUM_SPECIALS + ALPHABET.index(c) for c in r['text']] + [EOS_ID]
  stream = stream[:-1]
  batches = list(pipe.iterator())
  assert len(batches) == pipe.num_batches
  targets = np.concatenate([b['targets'].ravel()[b['weights'].ravel() > 0] for b in batches])
  np.testing.assert_array_equal(targets, stream[1:])  # in order, each once
  assert pipe.stats['tokens'] == sum(len(r['text']) for r in records)


def test_length_policy_counts_reach_stats():
  drop = pipeline('seq2seq', seq_len=8, target_len=10, length_policy='drop').stats
  trunc = pipeline('seq2seq', seq_len=8, target_len=10, length_policy='truncate').stats
  records = parallel_source()('train')
  over = sum(len(r['source']) + 1 > 8 or len(r['target']) + 1 > 10 for r in records)
  assert drop['dropped'] == trunc['truncated'] == over > 0
  assert drop['kept'] == len(records) - over and trunc['kept'] == len(records)
  assert drop['truncated'] == trunc['dropped'] == 0


def test_tokenized_arrays_are_cached(tmp_path):
  objective, overrides, source, _ = CASES['lm_packed']
  cfg = DataConfig(**overrides)
  tok = TinyCharTokenizer()
  first = make_pipeline(cfg, objective, 'train', batch_size=8, seed=0, source=source(),
                        tokenizer=tok, cache_dir=tmp_path)
  calls = tok.calls
  assert calls > 0 and list(tmp_path.rglob('text.tokens.npy'))
  second = make_pipeline(cfg, objective, 'train', batch_size=8, seed=0, source=source(),
                         tokenizer=tok, cache_dir=tmp_path)
  assert tok.calls == calls  # loaded, not re-encoded
  assert_batches_equal(take(first.iterator(), 3), take(second.iterator(), 3))
  assert first.stats == second.stats


def test_bytes_accounting():
  pipe = pipeline('lm_windows')
  assert pipe.stats['bytes_per_token'] == 1.0
  batch = next(pipe.iterator())
  assert pipe.batch_bytes(batch) == float(((batch['targets'] >= NUM_SPECIALS)
                                           * batch['weights']).sum())


def test_user_errors_name_the_fix():
  with pytest.raises(DataError, match='batch_size'):
    pipeline('lm_windows', batch_size=7, shard_count=2)
  with pytest.raises(DataError, match='parallel'):
    make_pipeline(DataConfig(), 'seq2seq', 'train', batch_size=4, seed=0, source=text_source(),
                  tokenizer=TinyCharTokenizer())
  with pytest.raises(DataError, match='objective'):
    make_pipeline(DataConfig(), 'lm', 'train', batch_size=4, seed=0, source=text_source(),
                  tokenizer=TinyCharTokenizer())
  with pytest.raises(DataError, match='data.seq_len'):
    pipeline('lm_windows', seq_len=100_000)


# --- integration with the real sources and tokenizers ----------------------------------------

RAW = Path(os.environ.get('TX_RAW_DATA')
           or Path(__file__).resolve().parents[2].parent / 'shared' / 'data')
needs_raw = pytest.mark.skipif(
    not (RAW / 'tinyshakespeare' / 'input.txt').is_file() or not (RAW / 'multi30k').is_dir(),
    reason=f'shared raw data not found at {RAW} (set TX_RAW_DATA to the folder holding '
           f'tinyshakespeare/ and multi30k/)')


@needs_raw
def test_tiny_shakespeare_char_windows(tmp_path):
  cfg = DataConfig(dataset='tinyshakespeare', tokenizer='char', seq_len=64, raw_dir=str(RAW),
                   data_dir=str(tmp_path))
  pipe = make_pipeline(cfg, 'causal_lm', 'train', batch_size=12, seed=0)
  assert pipe.vocab_size == 65 + NUM_SPECIALS
  assert pipe.stats['tokens'] == 1_003_854  # nanoGPT's 90% train split of 1,115,394 chars
  batch = next(pipe.iterator())
  assert batch['inputs'].shape == (12, 64) and (batch['weights'] == 1).all()
  np.testing.assert_array_equal(batch['targets'][:, :-1], batch['inputs'][:, 1:])
  text = (RAW / 'tinyshakespeare' / 'input.txt').read_text()
  assert pipe.tokenizer.decode(batch['inputs'][0]) in text
  val = make_pipeline(cfg, 'causal_lm', 'validation', batch_size=12, seed=0, train=False)
  assert sum(b['weights'].sum() for b in val.iterator()) == val.stats['tokens'] - 1


@needs_raw
def test_multi30k_bpe_seq2seq(tmp_path):
  cfg = DataConfig(dataset='multi30k', tokenizer='bpe', vocab_size=1000, seq_len=64,
                   target_len=64, raw_dir=str(RAW), data_dir=str(tmp_path),
                   source_lang='de', target_lang='en')
  pipe = make_pipeline(cfg, 'seq2seq', 'validation', batch_size=64, seed=0, train=False)
  assert pipe.stats['examples'] == 1014 and pipe.num_batches == 16
  batch = next(pipe.iterator())
  assert batch['src'].shape == (64, 64) and batch['tgt_inputs'].shape == (64, 64)
  first = pipe.tokenizer.decode(batch['targets'][0])
  assert first and first[0].isupper()  # an English caption
  assert (batch['tgt_inputs'][:, 0] == BOS_ID).all()
  assert (batch['src'][:, 0] != PAD_ID).all()
