"""`batch_shapes`: the static shapes and dtypes of a pipeline's batches, from the config alone.

    batch_shapes(cfg.data, 'causal_lm', batch_size=64)
    # {'inputs': ((64, L), int32), 'targets': ((64, L), int32), 'weights': ((64, L), float32)}

The same dict `Pipeline.batch_spec()` returns for that config, but without reading, preparing
or tokenizing any data (a test checks the two agree for every objective and layout). Used to
compile a training step ahead of time on abstract inputs (`tx plan`).

Keys by objective (B = batch_size, L = data.seq_len, Lt = data.target_len):
  causal_lm / mlm:  inputs, targets int32 [B, L], weights float32 [B, L];
                    packed rows (data.lm_sampling=packed or data.packing) add
                    segment_ids, positions int32 [B, L]
  seq2seq:          src int32 [B, L], tgt_inputs, targets int32 [B, Lt], weights float32 [B, Lt];
                    data.packing adds src_segment_ids, src_positions [B, L] and
                    tgt_segment_ids, tgt_positions [B, Lt], int32
"""

from __future__ import annotations

import numpy as np

from tx.data.errors import DataError

INT, FLOAT = np.dtype(np.int32), np.dtype(np.float32)


def batch_shapes(data_cfg, objective: str,
                 batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """{key: (shape, dtype)} of a batch of `batch_size` rows of `objective` under `data_cfg`."""
  b, length = batch_size, data_cfg.seq_len
  if objective in ('causal_lm', 'mlm'):
    out = {'inputs': ((b, length), INT), 'targets': ((b, length), INT),
           'weights': ((b, length), FLOAT)}
    if data_cfg.lm_sampling == 'packed' or data_cfg.packing:
      out.update(segment_ids=((b, length), INT), positions=((b, length), INT))
    return out
  if objective == 'seq2seq':
    lt = data_cfg.target_len
    out = {'src': ((b, length), INT), 'tgt_inputs': ((b, lt), INT), 'targets': ((b, lt), INT),
           'weights': ((b, lt), FLOAT)}
    if data_cfg.packing:
      out.update(src_segment_ids=((b, length), INT), src_positions=((b, length), INT),
                 tgt_segment_ids=((b, lt), INT), tgt_positions=((b, lt), INT))
    return out
  raise DataError(f'objective: {objective!r} is not one of causal_lm, mlm, seq2seq')
