"""Causal-LM rows: nanoGPT windows over a token stream, or packed documents.

Both row sources share one interface with the MLM and seq2seq ones, which the
pipeline drives: `num_rows`, `stats`, and `batch(keys_B, rows_B) -> dict` where
`rows_B` are row ids (-1 = an all-padding row, used to fill the last eval batch)
and `keys_B` are the rows' global positions in the data stream (random masking
uses them; LM ignores them).

'windows' (`data.lm_sampling=windows`): the split's documents are joined into one
stream (EOS between documents; a single-document split such as tiny shakespeare is
the raw text, exactly as nanoGPT's char model sees it). Training row r is the
window of L+1 tokens starting at offset r; the pipeline visits all offsets in a
random order each epoch (nanoGPT draws offsets with replacement; a permutation
has the same distribution per batch and sees every window once per epoch).
Evaluation rows are non-overlapping: row r starts at r*L, so every target token
of the split is scored exactly once; the last window is padded with weight 0.

'packed' (`data.lm_sampling=packed`): each document is BOS + tokens + EOS; a row
holds several documents, `inputs` are a document's BOS + tokens and `targets` its
tokens + EOS, so nothing is predicted across a document boundary, and attention
must be restricted with `segment_ids` (same nonzero id) and positions restart
at 0 per document.

Batch keys (int32 unless noted, B rows of L = data.seq_len):
  inputs [B, L], targets [B, L], weights [B, L] float32 (0 on padding)
  packed only: segment_ids [B, L] (1, 2, ... per document, 0 = pad), positions [B, L]
  windows with segment_ids=True (a vocabulary whose id 0 is a real token, e.g. GPT-2's
  "!" under data.tokenizer=hf): segment_ids [B, L] (1 on real inputs, 0 on padding)
"""

from __future__ import annotations

import numpy as np

from tx.data.errors import DataError
from tx.data.packing import Feature, Ragged
from tx.data.rows import PackedDocs
from tx.data.tokenizers.specials import BOS_ID, EOS_ID


class Windows:
  """Windows of `width` tokens of `stream`; training: every offset, eval: stride apart.

  Args:
    stream: int32 [N] token ids.
    width: tokens per window.
    stride: eval distance between window starts (training ignores it).
    train: all N - width + 1 offsets are rows; otherwise ceil((N - overlap) / stride)
      rows where overlap = width - stride, the last one padded.
  """

  def __init__(self, stream: np.ndarray, width: int, *, stride: int, train: bool):
    self.stream = np.asarray(stream, np.int32)
    self.width, self.stride, self.train = width, stride, train
    n, overlap = len(self.stream), width - stride
    if (train and n < width) or n <= overlap:
      raise DataError(
          f'data.seq_len: the split has {n} tokens, fewer than one window of {width}; '
          f'lower data.seq_len or use a larger dataset')
    # Eval windows may run past the end (padded), so a short split still scores.
    self.num_rows = n - width + 1 if train else -(-(n - overlap) // stride)
    self.stats = {'examples': 1, 'dropped': 0, 'truncated': 0, 'rows': self.num_rows}

  def tokens(self, rows_B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [B, width], valid bool [B, width]); invalid positions hold PAD."""
    rows_B = np.asarray(rows_B, np.int64)
    starts = rows_B if self.train else rows_B * self.stride
    idx = starts[:, None] + np.arange(self.width)[None]
    n = len(self.stream)
    if self.train and (rows_B >= 0).all():
      return self.stream[idx], np.ones(idx.shape, bool)
    valid = (idx < n) & (rows_B >= 0)[:, None]
    tokens = np.where(valid, self.stream[np.clip(idx, 0, n - 1)], 0).astype(np.int32)
    return tokens, valid


class CausalWindows:
  """Causal-LM rows from contiguous windows of L + 1 tokens.

  segment_ids: also emit 'segment_ids' (1 on real inputs, 0 on padding), so a model does
  not take an input id 0 for padding (for vocabularies where id 0 is a real token).
  """

  def __init__(self, stream: np.ndarray, seq_len: int, *, train: bool, segment_ids: bool = False):
    self.windows = Windows(stream, seq_len + 1, stride=seq_len, train=train)
    self.num_rows, self.stats = self.windows.num_rows, self.windows.stats
    self.segment_ids = segment_ids

  def batch(self, keys_B: np.ndarray, rows_B: np.ndarray) -> dict[str, np.ndarray]:
    """{'inputs', 'targets' int32 [B, L], 'weights' float32 [B, L]}; targets = inputs shifted."""
    del keys_B
    tokens, valid = self.windows.tokens(rows_B)
    out = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': valid[:, 1:].astype(np.float32)}
    if self.segment_ids:
      out['segment_ids'] = valid[:, :-1].astype(np.int32)
    return out


class CausalPacked(PackedDocs):
  """Causal-LM rows of packed documents (BOS + tokens + EOS each), with segment ids.

  Args:
    docs: the split's documents.
    seq_len: L.
    policy: 'truncate' (a document longer than L + 1 with BOS/EOS is cut) or 'drop'.
    order: permutation of document ids to pack in (training); None = dataset order.
    bos, eos: the ids around each document (a converted checkpoint's own; () for none).
  """

  def __init__(self, docs: Ragged, seq_len: int, *, policy: str,
               order: np.ndarray | None = None, bos: tuple[int, ...] = (BOS_ID,),
               eos: tuple[int, ...] = (EOS_ID,)):
    super().__init__('lm', Feature(docs, seq_len, bos, eos, shift=True), policy=policy,
                     order=order)

  def batch(self, keys_B: np.ndarray, rows_B: np.ndarray) -> dict[str, np.ndarray]:
    """{'inputs', 'targets', 'segment_ids', 'positions' int32 [B, L], 'weights' float32 [B, L]}."""
    del keys_B
    d = self.docs(rows_B)
    return {'inputs': d['tokens'], 'targets': d['targets'], 'weights': d['weights'],
            'segment_ids': d['segment_ids'], 'positions': d['positions']}
