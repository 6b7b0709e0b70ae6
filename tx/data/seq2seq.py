"""Seq2seq rows (translation): source + EOS for the encoder, BOS + target for the decoder.

For a pair (s, t) of token lists, with tx's tokenizers:

    src        = s + [EOS]            (Ls = data.seq_len positions)
    tgt_inputs = [BOS] + t            (Lt = data.target_len; teacher forcing)
    targets    = t + [EOS]
    weights    = 1 on the target positions, 0 on padding

A converted checkpoint's tokenizer (data.tokenizer=hf) frames them with its own ids, as
transformers builds a T5 batch: src = prefix + s + suffix (T5: s + </s>), tgt_inputs =
[decoder start] + t (T5: its pad id 0), targets = t + [its EOS]. Since the start may be
id 0, which tx reads as padding, those rows always carry segment ids and positions.

`data.length_policy` 'drop' removes a pair whose src or target needs more than Ls / Lt
positions; 'truncate' cuts the full sequence (so a cut target has no EOS).
`data.packing=True` puts several pairs in a row (first-fit on both lengths at
once); the row's k-th source and k-th target belong to the same pair, so
cross-attention is restricted with `src_segment_ids == tgt_segment_ids`.

Batch keys (int32 unless noted):
  src [B, Ls], tgt_inputs [B, Lt], targets [B, Lt], weights [B, Lt] float32
  packed or own ids: src_segment_ids, src_positions [B, Ls], tgt_segment_ids, tgt_positions
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tx.data.errors import DataError
from tx.data.packing import Feature, Ragged
from tx.data.rows import PackedSource
from tx.data.tokenizers.base import special
from tx.data.tokenizers.specials import BOS_ID, EOS_ID


class Framing(NamedTuple):
  """Special ids around a pair: src = src_prefix + s + src_suffix, tgt = [start] + t + end."""
  src_prefix: tuple[int, ...] = ()
  src_suffix: tuple[int, ...] = (EOS_ID,)
  start: int = BOS_ID
  end: tuple[int, ...] = (EOS_ID,)
  segments: bool = False  # segment ids / positions even one pair per row

  @classmethod
  def of(cls, tokenizer) -> Framing:
    """The framing `tokenizer` implies (tx's kinds: the default above)."""
    if special(tokenizer, 'uses_tx_specials'):
      return cls()
    eos = special(tokenizer, 'eos_id')
    return cls(tuple(special(tokenizer, 'prefix_ids')), tuple(special(tokenizer, 'suffix_ids')),
               special(tokenizer, 'decoder_start_id'), (eos,) if eos >= 0 else (), True)


class Seq2SeqRows(PackedSource):
  """Rows of (source, target) pairs, one per row or packed.

  Args:
    src, tgt: aligned Ragged token ids of the split's sources and targets.
    src_len, tgt_len: Ls, Lt.
    policy: 'truncate' or 'drop'.
    packed: several pairs per row.
    order: permutation of pair ids to lay out in (training); None = dataset order.
    framing: the special ids around each pair (default: tx's BOS / EOS).
  """

  def __init__(self, src: Ragged, tgt: Ragged, src_len: int, tgt_len: int, *, policy: str,
               packed: bool, order: np.ndarray | None = None, framing: Framing = Framing()):
    if len(src) != len(tgt):
      raise DataError(f'data.dataset: {len(src)} sources but {len(tgt)} targets; '
                      f'the source and target files must have the same number of lines')
    features = {'src': Feature(src, src_len, framing.src_prefix, framing.src_suffix),
                'tgt': Feature(tgt, tgt_len, (framing.start,), framing.end, shift=True)}
    self.segments = packed or framing.segments
    super().__init__(
        features, policy=policy, packed=packed, order=order,
        empty=f'data.length_policy: no pair of {len(src)} fits data.seq_len={src_len} / '
        f'data.target_len={tgt_len}; raise them or use data.length_policy=truncate')

  def batch(self, keys_B: np.ndarray, rows_B: np.ndarray) -> dict[str, np.ndarray]:
    """{'src' [B, Ls], 'tgt_inputs', 'targets' [B, Lt], 'weights' float32 [B, Lt], + segments}."""
    del keys_B
    d = self.rows.batch(rows_B)
    s, t = d['src'], d['tgt']
    out = {'src': s['tokens'], 'tgt_inputs': t['tokens'], 'targets': t['targets'],
           'weights': t['weights']}
    if self.segments:
      out.update(src_segment_ids=s['segment_ids'], src_positions=s['positions'],
                 tgt_segment_ids=t['segment_ids'], tgt_positions=t['positions'])
    return out
