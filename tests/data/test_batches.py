"""Row formats of tx.data: LM windows and packing, seq2seq pairs, MLM masking, length policy.

These drive the numpy row sources directly (no Grain, no files): each test builds a
tiny Ragged corpus of token ids and checks a property of the batches.
"""

import numpy as np
import pytest

from tx.data.errors import DataError
from tx.data.lm import CausalPacked, CausalWindows
from tx.data.mlm import MLMPacked, MLMWindows, Masking, mask_tokens
from tx.data.packing import Ragged, apply_length_policy, first_fit, place
from tx.data.seq2seq import Seq2SeqRows
from tx.data.tokenizers.specials import BOS_ID, EOS_ID, MASK_ID, NUM_SPECIALS, PAD_ID

V = 40  # vocabulary of the fake corpora


def random_docs(n, lo, hi, seed=0):
  rng = np.random.default_rng(seed)
  return Ragged.from_lists([rng.integers(NUM_SPECIALS, V, rng.integers(lo, hi + 1)).tolist()
                            for _ in range(n)])


def doc_list(docs):
  return [docs.tokens[docs.offsets[i]:docs.offsets[i + 1]].tolist() for i in range(len(docs))]


def segments(seg_row):
  """[(id, start, end)] of the nonzero runs of one row."""
  out, t = [], 0
  while t < len(seg_row):
    s = seg_row[t]
    e = t
    while e < len(seg_row) and seg_row[e] == s:
      e += 1
    if s:
      out.append((int(s), t, e))
    t = e
  return out


def check_segments_partition(seg, pos):
  """Ids are 1, 2, ... in contiguous runs then 0 padding; positions restart at 0 per run."""
  for s_row, p_row in zip(seg, pos):
    runs = segments(s_row)
    assert [r[0] for r in runs] == list(range(1, len(runs) + 1))
    used = runs[-1][2] if runs else 0
    assert (s_row[used:] == 0).all() and (p_row[used:] == 0).all()
    for _, a, b in runs:
      np.testing.assert_array_equal(p_row[a:b], np.arange(b - a))


# --- causal LM -----------------------------------------------------------------------------


def test_lm_windows_shift_by_one_and_contiguous():
  stream = np.random.default_rng(1).integers(NUM_SPECIALS, V, 500).astype(np.int32)
  rows = CausalWindows(stream, 16, train=True)
  assert rows.num_rows == 500 - 17 + 1
  starts = np.array([0, 7, rows.num_rows - 1])
  b = rows.batch(starts, starts)
  assert b['inputs'].shape == b['targets'].shape == b['weights'].shape == (3, 16)
  np.testing.assert_array_equal(b['targets'][:, :-1], b['inputs'][:, 1:])
  for i, s in enumerate(starts):
    np.testing.assert_array_equal(b['inputs'][i], stream[s:s + 16])
    np.testing.assert_array_equal(b['targets'][i], stream[s + 1:s + 17])
  assert (b['weights'] == 1).all()


def test_lm_eval_windows_score_every_target_once():
  n, L = 103, 10
  stream = np.arange(n, dtype=np.int32) + NUM_SPECIALS  # token value encodes position
  rows = CausalWindows(stream, L, train=False)
  assert rows.num_rows == -(-(n - 1) // L)
  b = rows.batch(np.arange(rows.num_rows + 2), np.r_[np.arange(rows.num_rows), -1, -1])
  scored = b['targets'][b['weights'] > 0] - NUM_SPECIALS
  np.testing.assert_array_equal(np.sort(scored), np.arange(1, n))  # every target once
  assert (b['weights'][-2:] == 0).all() and (b['inputs'][-2:] == PAD_ID).all()
  valid = b['weights'] > 0
  np.testing.assert_array_equal(b['targets'][valid], (b['inputs'] + 1)[valid])


def test_joined_stream_separates_documents_with_eos():
  docs = Ragged.from_lists([[5, 6], [7], [8, 9, 10]])
  np.testing.assert_array_equal(docs.joined(), [5, 6, EOS_ID, 7, EOS_ID, 8, 9, 10])
  np.testing.assert_array_equal(Ragged.from_lists([[5, 6]]).joined(), [5, 6])


def test_packed_lm_rows_respect_documents():
  docs = random_docs(60, 0, 12)
  L = 16
  rows = CausalPacked(docs, L, policy='truncate', order=np.random.default_rng(0).permutation(60))
  b = rows.batch(np.arange(rows.num_rows), np.arange(rows.num_rows))
  x, y, w = b['inputs'], b['targets'], b['weights']
  seg, pos = b['segment_ids'], b['positions']
  assert x.shape == (rows.num_rows, L)
  check_segments_partition(seg, pos)
  np.testing.assert_array_equal(w, (seg > 0).astype(np.float32))
  # An attention mask from segment ids (same nonzero id) pairs only tokens of one document,
  # and every document appears exactly once, whole, as BOS + tokens -> tokens + EOS.
  seen = []
  for r in range(len(x)):
    mask = (seg[r][:, None] == seg[r][None, :]) & (seg[r][:, None] > 0)
    for s, a, e in segments(seg[r]):
      assert mask[a:e, a:e].all() and not mask[a:e, :a].any() and not mask[a:e, e:].any()
      assert x[r, a] == BOS_ID
      doc = x[r, a + 1:e].tolist()
      seen.append(doc)
      np.testing.assert_array_equal(y[r, a:e - 1], x[r, a + 1:e])  # shift inside the doc
      assert y[r, e - 1] == EOS_ID  # the last target is the doc's own EOS, not the next doc
      if e < L and seg[r, e] != 0:
        assert x[r, e] == BOS_ID and y[r, e - 1] != x[r, e]
  assert sorted(seen) == sorted(doc_list(docs))


def test_packed_lm_truncation_cuts_without_false_eos():
  docs = Ragged.from_lists([list(range(5, 25))])  # 20 tokens, rows of 8
  rows = CausalPacked(docs, 8, policy='truncate')
  b = rows.batch(np.zeros(1, np.int64), np.zeros(1, np.int64))
  np.testing.assert_array_equal(b['inputs'][0], [BOS_ID] + list(range(5, 12)))
  np.testing.assert_array_equal(b['targets'][0], list(range(5, 13)))  # no EOS: cut, not ended
  assert rows.stats['truncated'] == 1
  with pytest.raises(DataError, match='data.length_policy'):
    CausalPacked(docs, 8, policy='drop')


# --- packing helpers -------------------------------------------------------------------------


def test_first_fit_places_each_example_once_within_capacity():
  rng = np.random.default_rng(3)
  lengths = rng.integers(1, 9, (200, 2))
  plan = first_fit(np.arange(200), lengths, (10, 12), num_bins=4)
  assert sorted(plan.members.tolist()) == list(range(200))
  for r in range(plan.num_rows):
    members = plan.members[plan.splits[r]:plan.splits[r + 1]]
    assert (lengths[members].sum(axis=0) <= [10, 12]).all()


def test_place_segments_and_positions():
  p = place(np.array([0, 0, 2]), np.array([3, 2, 4]), batch=3, row_len=6)
  np.testing.assert_array_equal(p.segment_ids, [[1, 1, 1, 2, 2, 0], [0] * 6, [1, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(p.positions, [[0, 1, 2, 0, 1, 0], [0] * 6, [0, 1, 2, 3, 0, 0]])


@pytest.mark.parametrize('policy', ['drop', 'truncate'])
def test_length_policy_counts(policy):
  lengths = np.array([[3, 4], [9, 2], [2, 11], [5, 5], [12, 12]])
  kept, stats = apply_length_policy(lengths, (8, 10), policy)
  assert stats['examples'] == 5
  if policy == 'drop':
    assert stats == {'examples': 5, 'dropped': 3, 'truncated': 0}
    np.testing.assert_array_equal(kept, [0, 3])
  else:
    assert stats == {'examples': 5, 'dropped': 0, 'truncated': 3}
    np.testing.assert_array_equal(kept, np.arange(5))
  with pytest.raises(DataError, match='data.length_policy'):
    apply_length_policy(lengths, (8, 10), 'clip')


# --- seq2seq ---------------------------------------------------------------------------------


def check_pair_layout(src, tin, tgt, w, s_src, t_tgt):
  """One pair: src = s + EOS, tgt_inputs = BOS + t, targets = t + EOS."""
  assert src[-1] == EOS_ID and list(src[:-1]) == s_src
  assert tin[0] == BOS_ID and list(tin[1:]) == t_tgt
  np.testing.assert_array_equal(tin[1:], tgt[:-1])
  assert tgt[-1] == EOS_ID and (w == 1).all()


def test_seq2seq_unpacked_layout_and_length_policy():
  src, tgt = random_docs(30, 0, 9, seed=1), random_docs(30, 0, 9, seed=2)
  Ls, Lt = 8, 9
  for policy in ('drop', 'truncate'):
    rows = Seq2SeqRows(src, tgt, Ls, Lt, policy=policy, packed=False)
    over = (src.lengths + 1 > Ls) | (tgt.lengths + 1 > Lt)
    assert rows.stats['dropped' if policy == 'drop' else 'truncated'] == over.sum() > 0
  rows = Seq2SeqRows(src, tgt, Ls, Lt, policy='drop', packed=False)
  b = rows.batch(np.arange(rows.num_rows), np.arange(rows.num_rows))
  assert set(b) == {'src', 'tgt_inputs', 'targets', 'weights'}
  assert b['src'].shape == (rows.num_rows, Ls) and b['targets'].shape == (rows.num_rows, Lt)
  for r, i in enumerate(rows.rows.plan.members):
    ns, nt = int(src.lengths[i]) + 1, int(tgt.lengths[i]) + 1
    check_pair_layout(b['src'][r, :ns], b['tgt_inputs'][r, :nt], b['targets'][r, :nt],
                      b['weights'][r, :nt], doc_list(src)[i], doc_list(tgt)[i])
    assert (b['src'][r, ns:] == PAD_ID).all() and (b['targets'][r, nt:] == PAD_ID).all()
    assert (b['tgt_inputs'][r, nt:] == PAD_ID).all() and (b['weights'][r, nt:] == 0).all()


def test_seq2seq_packed_pairs_align_by_segment():
  src, tgt = random_docs(80, 1, 6, seed=3), random_docs(80, 1, 7, seed=4)
  rows = Seq2SeqRows(src, tgt, 16, 16, policy='drop', packed=True,
                     order=np.random.default_rng(1).permutation(80))
  assert rows.num_rows < 80 and rows.stats['kept'] == 80
  b = rows.batch(np.arange(rows.num_rows), np.arange(rows.num_rows))
  check_segments_partition(b['src_segment_ids'], b['src_positions'])
  check_segments_partition(b['tgt_segment_ids'], b['tgt_positions'])
  pairs = []
  for r in range(rows.num_rows):
    s_runs, t_runs = segments(b['src_segment_ids'][r]), segments(b['tgt_segment_ids'][r])
    assert [s for s, _, _ in s_runs] == [s for s, _, _ in t_runs]
    for (_, a, e), (_, c, d) in zip(s_runs, t_runs):
      s_toks, t_toks = b['src'][r, a:e - 1].tolist(), b['tgt_inputs'][r, c + 1:d].tolist()
      check_pair_layout(b['src'][r, a:e], b['tgt_inputs'][r, c:d], b['targets'][r, c:d],
                        b['weights'][r, c:d], s_toks, t_toks)
      pairs.append((tuple(s_toks), tuple(t_toks)))
  assert sorted(pairs) == sorted(zip(map(tuple, doc_list(src)), map(tuple, doc_list(tgt))))


# --- MLM -------------------------------------------------------------------------------------


def test_mlm_masking_statistics():
  rng = np.random.default_rng(5)
  B, L = 512, 512
  tokens = rng.integers(NUM_SPECIALS, V, (B, L)).astype(np.int32)
  specials = rng.random((B, L)) < 0.1
  tokens[specials] = rng.integers(0, NUM_SPECIALS, specials.sum())
  m = Masking(V, seed=11, probability=0.15, mask_fraction=0.8, random_fraction=0.1)
  out = mask_tokens(tokens, np.arange(B) * 7 + 3, m)
  x, y, w = out['inputs'], out['targets'], out['weights']
  candidates = tokens >= NUM_SPECIALS
  assert candidates.sum() >= 200_000
  sel = w > 0
  np.testing.assert_array_equal(y, tokens)
  assert not sel[~candidates].any()  # PAD and specials are never selected
  assert abs(sel.sum() / candidates.sum() - 0.15) < 0.01
  masked = sel & (x == MASK_ID)
  changed = sel & (x != MASK_ID) & (x != tokens)
  kept = sel & (x == tokens)
  # A random replacement can draw the original token (1 / (V - 5) of the time).
  p_same = 1 / (V - NUM_SPECIALS)
  assert abs(masked.sum() / sel.sum() - 0.8) < 0.02
  assert abs(changed.sum() / sel.sum() - 0.1 * (1 - p_same)) < 0.02
  assert abs(kept.sum() / sel.sum() - (0.1 + 0.1 * p_same)) < 0.02
  assert (x[changed] >= NUM_SPECIALS).all() and (x[changed] < V).all()  # never a special
  np.testing.assert_array_equal(x[~sel], tokens[~sel])  # the rest untouched, weight 0
  assert (w[~sel] == 0).all() and w.dtype == np.float32
  # A pure function of (seed, key): same keys same masks, other keys other masks.
  again = mask_tokens(tokens, np.arange(B) * 7 + 3, m)
  np.testing.assert_array_equal(again['inputs'], x)
  other = mask_tokens(tokens, np.arange(B) * 7 + 4, m)
  assert (other['weights'] != w).any()


def test_mlm_rows_windows_and_packed():
  m = Masking(V, seed=0)
  stream = np.random.default_rng(0).integers(NUM_SPECIALS, V, 300).astype(np.int32)
  rows = MLMWindows(stream, 32, m, train=False)
  assert rows.num_rows == -(-300 // 32)
  b = rows.batch(np.arange(rows.num_rows), np.arange(rows.num_rows))
  np.testing.assert_array_equal(b['targets'].ravel()[:300], stream)  # eval: every token once
  assert (b['weights'].ravel()[300:] == 0).all()
  docs = random_docs(40, 2, 20)
  rows = MLMPacked(docs, 32, m, policy='truncate')
  b = rows.batch(np.arange(rows.num_rows), np.arange(rows.num_rows))
  check_segments_partition(b['segment_ids'], b['positions'])
  y, seg = b['targets'], b['segment_ids']
  for r in range(len(y)):
    for _, a, e in segments(seg[r]):
      assert y[r, a] == BOS_ID and y[r, e - 1] == EOS_ID
  assert not (b['weights'][(y < NUM_SPECIALS)] > 0).any()
