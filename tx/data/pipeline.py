"""`make_pipeline`: a split of a dataset as a checkpointable Grain iterator of batches.

    pipe = make_pipeline(cfg.data, 'causal_lm', 'train', batch_size=12, seed=0)
    it = pipe.iterator()                 # grain DatasetIterator of numpy dicts
    batch = next(it)                     # {'inputs': int32 [12, L], 'targets': ..., 'weights': ...}
    state = it.get_state()               # JSON-serialisable; save with the model checkpoint
    it = pipe.iterator(state)            # ... later: continues with exactly the next batches

How it works. The split is tokenized once (cached as .npy under `prepared_dir`,
keyed by tokenizer) and turned into a *row source* (lm.py, mlm.py, seq2seq.py):
R rows, each a pure function of its row id. (With data.subword_dropout the training split
is tokenized data.subword_samples times, sampling segmentations, and the R rows are those
of all of them: stacked.py.) Grain only orders row ids:

    train: range(R).shuffle(seed).repeat()  -> epoch e reshuffled with seed + e, forever
    eval:  range(R) padded with -1 rows to a multiple of the global batch, one pass
    then   [shard_index::shard_count] -> batch(batch_size // shard_count) -> row source

The iterator state is therefore a step counter: no RNG state, no buffers. Global
batch k is rows k*G .. k*G+G-1 of that order whatever the number of processes, so
shards are disjoint, their union is the single-process batch, and a checkpoint can
be resumed on a different number of processes with the same global batch size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import grain
import numpy as np
from absl import flags

from tx.data import sources
from tx.data import sources, tokenizers
from tx.data.errors import DataError
from tx.data.lm import CausalPacked, CausalWindows
from tx.data.mlm import MLMPacked, MLMWindows, Masking, splitmix64
from tx.data.packing import Ragged
from tx.data.seq2seq import Framing, Seq2SeqRows
from tx.data.stacked import StackedRows
from tx.data.tokenizers.base import special
from tx.data.tokenizers.specials import EOS_ID, NUM_SPECIALS

log = logging.getLogger('tx.data')

OBJECTIVES = ('causal_lm', 'mlm', 'seq2seq')
SPLITS = ('train', 'validation', 'test')
_PROBE = 'The quick brown fox, 12 Äpfel; naïve café — 東京.\n'


# --- tokenizing a split once ----------------------------------------------------------------


def tokenizer_key(tokenizer) -> str:
  """A short name for the tokenizer's exact behaviour (cache key of tokenized arrays)."""
  if hasattr(tokenizer, 'header'):  # tx tokenizers: kind, vocabulary, model digest
    header = tokenizer.header()
  else:
    try:
      header = {'vocab_size': tokenizer.vocab_size, 'probe': tokenizer.encode(_PROBE)}
    except Exception:  # pylint: disable=broad-except
      header = {'vocab_size': tokenizer.vocab_size, 'class': type(tokenizer).__qualname__}
  digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:12]
  kind = getattr(tokenizer, 'kind', type(tokenizer).__name__.lower())
  return f'{kind}-{tokenizer.vocab_size}-{digest}'


def _atomic_save(path: Path, write: Callable[[Any], None], mode: str = 'wb'):
  """Writes through a temporary file, so a concurrent reader never sees half a file."""
  tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
  with open(tmp, mode) as f:
    write(f)
  os.replace(tmp, path)


def tokenize_split(records: Sequence[dict], fields: Sequence[str], tokenizer, *,
                   cache: Path | None = None, encode: Callable[[str], list[int]] | None = None
                   ) -> tuple[dict[str, Ragged], dict[str, int]]:
  """Token ids of `fields` of every record, cached as .npy files in `cache`.

  Args:
    records: random-access sequence of N dicts of str.
    fields: e.g. ('text',) or ('source', 'target').
    cache: folder for '{field}.tokens.npy' / '{field}.offsets.npy' / 'meta.json'; one
      per (dataset, tokenizer, split): a cached entry is trusted if the number of
      records matches (make_pipeline keys it by prepared_dir, tokenizer and split).
    encode: replaces `tokenizer.encode` (a sampled segmentation); called on every text of
      the first field, then of the next, in record order.
  Returns:
    ({field: Ragged with N examples}, {'{field}_bytes': UTF-8 bytes, '{field}_tokens': ids}).
  """
  meta_path = cache / 'meta.json' if cache is not None else None
  if meta_path is not None and meta_path.exists():
    meta = json.loads(meta_path.read_text())
    out = {f: Ragged(np.load(cache / f'{f}.tokens.npy'), np.load(cache / f'{f}.offsets.npy'))
           for f in fields}
    if meta['examples'] == len(records) and all(len(r) == len(records) for r in out.values()):
      return out, meta['counts']
  texts = {f: [] for f in fields}
  for i in range(len(records)):
    record = records[i]
    for f in fields:
      texts[f].append(record[f])
  out, counts = {}, {}
  for f in fields:
    out[f] = Ragged.from_lists([(encode or tokenizer.encode)(t) for t in texts[f]])
    counts[f'{f}_bytes'] = sum(len(t.encode('utf-8')) for t in texts[f])
    counts[f'{f}_tokens'] = int(len(out[f].tokens))
  if cache is not None:
    cache.mkdir(parents=True, exist_ok=True)
    for f, r in out.items():
      _atomic_save(cache / f'{f}.tokens.npy', lambda fh, a=r.tokens: np.save(fh, a))
      _atomic_save(cache / f'{f}.offsets.npy', lambda fh, a=r.offsets: np.save(fh, a))
    meta = {'examples': len(records), 'counts': counts}
    _atomic_save(meta_path, lambda fh: json.dump(meta, fh), mode='w')
  return out, counts


# --- ordering rows with Grain -----------------------------------------------------------------


def shuffle_seed(seed: int) -> int:
  """A 32-bit Grain shuffle seed from `seed`; grain uses seed + epoch per epoch, so mix first."""
  return int(splitmix64(np.array([seed % 2**64], np.uint64))[0] >> np.uint64(32))


def row_index_dataset(num_rows: int, *, batch_size: int, seed: int, shard_index: int = 0,
                      shard_count: int = 1, train: bool = True) -> grain.MapDataset:
  """Grain MapDataset whose element k is this process's k-th batch of row ids.

  Args:
    num_rows: R rows in one epoch.
    batch_size: rows per process and batch (global batch = batch_size * shard_count).
    train: shuffled and infinite (reshuffled every epoch); else one in-order pass,
      padded with row id -1 to a whole number of global batches.
  Returns:
    MapDataset of (keys int64 [b], rows int64 [b]) where keys are global positions
    in the row order (the same on every topology) and rows the row ids.
  """
  if train:
    ds = grain.MapDataset.range(num_rows).shuffle(seed=shuffle_seed(seed)).repeat()
    ds = ds.map_with_index(lambda k, r: (k, r))
  else:
    g = batch_size * shard_count
    total = -(-num_rows // g) * g
    ds = grain.MapDataset.range(total).map(lambda k: (k, k if k < num_rows else -1))
  ds = ds[shard_index::shard_count]
  return ds.batch(batch_size, drop_remainder=True,
                  batch_fn=lambda xs: tuple(np.array(c, np.int64) for c in zip(*xs)))


class BatchIterator(grain.DatasetIterator):
  """The pipeline's iterator: Grain's, plus a readable state that checks it fits.

  State (JSON): {'step': batches yielded, 'epoch': informational, 'seed',
  'global_batch_size', 'objective', 'split', 'train', 'shard_count', 'parent': Grain's}.
  Restoring needs the same seed, global batch size, objective, split and mode, else
  DataError; the number of processes may differ when data.num_workers=0.
  """

  def __init__(self, pipeline: 'Pipeline'):
    self._pipe = pipeline
    super().__init__(pipeline.dataset().__iter__())
    self._step = 0

  def __next__(self):
    batch = next(self._parent)
    self._step += 1
    return batch

  def _fixed(self) -> dict[str, Any]:
    p = self._pipe
    return {'seed': p.seed, 'global_batch_size': p.global_batch_size, 'objective': p.objective,
            'split': p.split, 'train': p.train}

  def get_state(self) -> dict[str, Any]:
    epoch = self._step * self._pipe.global_batch_size // self._pipe.num_rows
    return {'step': self._step, 'epoch': epoch, **self._fixed(),
            'shard_count': self._pipe.shard_count, 'parent': self._parent.get_state()}

  def set_state(self, state: dict[str, Any]):
    for key, value in self._fixed().items():
      if state.get(key) != value:
        raise DataError(
            f'data iterator state: {key}={state.get(key)!r} in the checkpoint but {value!r} '
            f'now; resume with the same {key} or start the data from scratch')
    self._step = int(state['step'])
    if self._pipe.num_workers == 0:
      self._parent.set_state({'next_index': self._step})
    elif state.get('shard_count') == self._pipe.shard_count:
      self._parent.set_state(state['parent'])
    else:
      raise DataError('data.num_workers: a multi-worker iterator state resumes only on the '
                      'same number of processes; set data.num_workers=0 to reshard')

  def __str__(self):
    return f'BatchIterator({self._pipe.objective}, {self._pipe.split})'


# --- the pipeline --------------------------------------------------------------------------


class Pipeline:
  """A split as batches of `batch_size` rows (this process's share of the global batch).

  Attributes:
    tokenizer, vocab_size: the dataset's tokenizer.
    rows: the row source (lm.CausalWindows, mlm.MLMPacked, seq2seq.Seq2SeqRows, ...).
    num_rows: rows per epoch (train) or in the split (eval).
    num_batches: global batches per epoch (train, rounded down) or in the one pass (eval).
    stats: {'examples', 'kept', 'dropped', 'truncated', 'rows', 'tokens', 'bytes',
      'bytes_per_token', ...}: counts over the whole split, for the start-of-training report.
  """

  def __init__(self, rows, *, tokenizer, objective: str, split: str, batch_size: int, seed: int,
               shard_index: int, shard_count: int, train: bool, counts: dict[str, int],
               num_workers: int = 0):
    self.rows, self.tokenizer = rows, tokenizer
    self.vocab_size = int(tokenizer.vocab_size)
    self.objective, self.split, self.train, self.seed = objective, split, train, seed
    self.batch_size, self.shard_index, self.shard_count = batch_size, shard_index, shard_count
    self.global_batch_size = batch_size * shard_count
    self.num_workers = num_workers
    self.num_rows = rows.num_rows
    g = self.global_batch_size
    self.num_batches = self.num_rows // g if train else -(-self.num_rows // g)
    field = 'target' if objective == 'seq2seq' else 'text'
    tokens, nbytes = counts.get(f'{field}_tokens', 0), counts.get(f'{field}_bytes', 0)
    self.stats = {**rows.stats, **counts, 'tokens': tokens, 'bytes': nbytes,
                  'bytes_per_token': nbytes / max(1, tokens), 'num_batches': self.num_batches}
    self._token_bytes = None

  def dataset(self) -> grain.IterDataset:
    """The Grain IterDataset of numpy batch dicts (what `iterator()` iterates)."""
    ds = row_index_dataset(self.num_rows, batch_size=self.batch_size, seed=self.seed,
                           shard_index=self.shard_index, shard_count=self.shard_count,
                           train=self.train)
    ds = ds.map(lambda kr: self.rows.batch(*kr))
    # Rows are in memory and a batch is a few vectorized numpy calls: threads only add
    # GIL contention (Grain's own advice for in-memory data).
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    if self.num_workers:
      if not flags.FLAGS.is_parsed():  # Grain workers read absl flags; use their defaults
        flags.FLAGS.mark_as_parsed()
      it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.num_workers))
    return it

  def iterator(self, state: dict[str, Any] | None = None) -> BatchIterator:
    """A fresh iterator at step 0, or at `state` (from `get_state()` of an earlier one)."""
    it = BatchIterator(self)
    if state is not None:
      it.set_state(state)
    return it

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{key: (shape, dtype)} of every batch (static: identical at every step): [batch_size,
    ...] each. Read off one all-pad row, so a huge batch is not built just to be measured."""
    empty = self.rows.batch(np.zeros(1, np.int64), np.full(1, -1, np.int64))
    return {k: ((self.batch_size,) + v.shape[1:], v.dtype) for k, v in empty.items()}

  @property
  def bytes_per_token(self) -> float:
    """UTF-8 bytes per token over the split (bits/byte = nats/token / ln 2 / this)."""
    return self.stats['bytes_per_token']

  @property
  def token_bytes(self) -> np.ndarray:
    """float32 [V]: UTF-8 bytes each token id stands for (0 for specials)."""
    if self._token_bytes is None:
      if hasattr(self.tokenizer, 'byte_lengths'):
        table = np.asarray(self.tokenizer.byte_lengths(), np.float32)
      else:
        table = np.array([self.tokenizer.num_bytes([i]) for i in range(self.vocab_size)],
                         np.float32)
      if getattr(self.tokenizer, 'uses_tx_specials', True):
        table[:NUM_SPECIALS] = 0  # ('hf' tokenizers give their own specials 0 bytes)
      self._token_bytes = table
    return self._token_bytes

  def batch_bytes(self, batch: dict[str, np.ndarray]) -> float:
    """UTF-8 bytes of the weighted targets of `batch` (the denominator of bits per byte)."""
    return float((self.token_bytes[batch['targets']] * batch['weights']).sum())


def _check(objective: str, split: str, batch_size: int, shard_index: int, shard_count: int):
  if objective not in OBJECTIVES:
    raise DataError(f'objective: {objective!r} is not one of {", ".join(OBJECTIVES)}')
  if split not in SPLITS:
    raise DataError(f'split: {split!r} is not one of {", ".join(SPLITS)}')
  if shard_count < 1 or not 0 <= shard_index < shard_count:
    raise DataError(f'shard_index={shard_index}, shard_count={shard_count}: need '
                    f'0 <= shard_index < shard_count')
  if batch_size <= 0 or batch_size % shard_count:
    raise DataError(f'train.batch_size: {batch_size} is not divisible by the {shard_count} '
                    f'data-loading processes; use a multiple of {shard_count}')


def make_rows(data_cfg, objective: str, fields: dict[str, Ragged], *, tokenizer, seed: int,
              train: bool):
  """The row source of `objective` over tokenized `fields` ('text' or 'source'/'target').

  The tokenizer's special ids frame the rows: tx's fixed ones, or a converted checkpoint's
  own (data.tokenizer=hf: its EOS between documents, its BOS/EOS around packed ones, its
  prefix/suffix around MLM rows and sources, its decoder start before targets).
  """
  packed = data_cfg.lm_sampling == 'packed' or data_cfg.packing
  order = None
  if train and (packed or objective == 'seq2seq'):
    n = len(next(iter(fields.values())))
    order = np.random.default_rng([seed, 7]).permutation(n)
  if objective == 'seq2seq':
    if 'source' not in fields:
      raise DataError(f'data.dataset: objective seq2seq needs a parallel dataset '
                      f'(multi30k, parallel), got {data_cfg.dataset!r}')
    return Seq2SeqRows(fields['source'], fields['target'], data_cfg.seq_len,
                       data_cfg.target_len, policy=data_cfg.length_policy,
                       packed=data_cfg.packing, order=order, framing=Framing.of(tokenizer))
  if 'text' not in fields:
    raise DataError(f'data.dataset: objective {objective} needs a text dataset, '
                    f'got the parallel dataset {data_cfg.dataset!r}; use objective seq2seq')
  docs = fields['text']
  bos, eos = special(tokenizer, 'bos_id'), special(tokenizer, 'eos_id')
  if objective == 'causal_lm':
    if packed:
      return CausalPacked(docs, data_cfg.seq_len, policy=data_cfg.length_policy, order=order,
                          bos=(bos,) if bos >= 0 else (), eos=(eos,) if eos >= 0 else ())
    return CausalWindows(docs.joined(eos if eos >= 0 else None), data_cfg.seq_len,
                         train=train, segment_ids=special(tokenizer, 'zero_is_token'))
  mlm_specials = None if special(tokenizer, 'uses_tx_specials') else hf_mlm_specials(tokenizer)
  own = {} if mlm_specials is None else {'mask_id': mlm_specials['mask_id'],
                                          'special_ids': tuple(mlm_specials['special_ids'])}
  masking = Masking(tokenizer.vocab_size, seed=seed, probability=data_cfg.mlm_probability,
                    mask_fraction=data_cfg.mlm_mask_fraction,
                    random_fraction=data_cfg.mlm_random_fraction,
                    max_predictions=data_cfg.mlm_max_predictions, **own)
  if packed:
    framing = {} if mlm_specials is None else {'prefix': mlm_specials['prefix'],
                                               'suffix': mlm_specials['suffix']}
    return MLMPacked(docs, data_cfg.seq_len, masking, policy=data_cfg.length_policy,
                     order=order, **framing)
  if mlm_specials is not None:
    return MLMWindows(docs.joined(mlm_specials['separator']), data_cfg.seq_len, masking,
                      train=train, prefix=mlm_specials['prefix'], suffix=mlm_specials['suffix'])
  return MLMWindows(docs.joined(EOS_ID), data_cfg.seq_len, masking, train=train)


def sampled_rows(data_cfg, objective: str, records: Sequence[dict], fields: Sequence[str], *,
                 tokenizer, seed: int, cache: Path | None) -> StackedRows:
  """The training rows of `data.subword_samples` segmentations of `records`, each drawn with
  `data.subword_dropout` (sentencepiece seed k + 1 for the k-th, so the same on every run
  and process) and cached beside the deterministic one; each laid out in its own order."""
  if not hasattr(tokenizer, 'sampler'):
    raise DataError(f'data.subword_dropout: {type(tokenizer).__name__} cannot sample '
                    f'segmentations; use data.tokenizer=bpe or unigram, or subword_dropout=0')
  dropout, parts = data_cfg.subword_dropout, []
  for k in range(data_cfg.subword_samples):
    where = cache.with_name(f'{cache.name}-dropout{dropout:g}-{k}') if cache is not None else None
    tokens, _ = tokenize_split(records, fields, tokenizer, cache=where,
                               encode=tokenizer.sampler(dropout, seed=k + 1))
    parts.append(make_rows(data_cfg, objective, tokens, tokenizer=tokenizer, seed=seed + k,
                           train=True))
  return StackedRows(parts)


def dataset_tokenizer(data_cfg, *, source: Callable[[str], Sequence[dict]] | None = None,
                      cache_dir: str | Path | None = None):
  """The dataset's tokenizer, trained on the train split the first time, then cached.

  The cache is `prepared_dir(data_cfg)` (or `cache_dir`), so evaluation and generation
  code that calls this gets the very tokenizer the pipeline used. data.tokenizer=hf is
  read from data.tokenizer_path instead (nothing trained or cached).
  """
  if data_cfg.tokenizer == 'hf':
    return tokenizers.load_hf_tokenizer(data_cfg.tokenizer_path)
  load = source or (lambda split: sources.load_source(data_cfg, split))

  def texts():
    records = load('train')
    keys = ('source', 'target') if 'source' in records[0] else ('text',)
    return [records[i][k] for k in keys for i in range(len(records))]

  return tokenizers.build_tokenizer(
      data_cfg.tokenizer, texts, cache_dir=cache_dir or sources.prepared_dir(data_cfg),
      vocab_size=data_cfg.vocab_size)


def hf_mlm_specials(tokenizer) -> dict[str, Any]:
  """MLM ids of a tokenizer with its own specials: mask_id, special_ids (never masked nor
  drawn), prefix / suffix framing each row, separator between documents (None: none).

  Raises a one-line DataError when its pad id is not 0 (tx pads and masks with id 0) or
  it has no mask token.
  """
  kind = getattr(tokenizer, 'kind', 'hf')
  ids = tokenizer.special_ids
  if ids.get('mask') is None:
    raise DataError(f'data.tokenizer={kind}: objective mlm needs a mask token, and '
                    f'{tokenizer.source or "this tokenizer"} names none (mask_token)')
  if ids.get('pad') != 0:
    raise DataError(f'data.tokenizer={kind}: objective mlm pads with id 0 (tx masks '
                    f'tokens != 0), but this tokenizer\'s pad id is {ids.get("pad")}')
  separator = next((ids[r] for r in ('sep', 'eos') if ids.get(r) is not None), None)
  return {'mask_id': ids['mask'], 'special_ids': tuple(tokenizer.all_special_ids),
          'prefix': tuple(tokenizer.prefix_ids), 'suffix': tuple(tokenizer.suffix_ids),
          'separator': separator}


def make_pipeline(data_cfg, objective: str, split: str, *, batch_size: int, seed: int,
                  shard_index: int = 0, shard_count: int = 1, train: bool = True,
                  source: Callable[[str], Sequence[dict]] | None = None, tokenizer=None,
                  cache_dir: str | Path | None = None) -> Pipeline:
  """Batches of `split` for `objective` ('causal_lm' | 'mlm' | 'seq2seq').

  Args:
    data_cfg: `DataConfig` (the `data.*` keys).
    batch_size: global batch size; each process gets batch_size // shard_count rows.
    seed: order of rows and MLM masks (train); eval uses it only for MLM masks.
    shard_index, shard_count: this process and the number of data-loading processes
      (usually jax.process_index(), jax.process_count()).
    train: shuffled, infinite, reshuffled per epoch; else one in-order pass over the split.
    source: tests / custom data: `source(split)` -> records, replacing tx.data.sources.
    tokenizer: replaces the dataset's tokenizer (then nothing is cached unless cache_dir).
    cache_dir: where tokenized arrays go; default `prepared_dir(data_cfg)/tokens`.
  Returns:
    A `Pipeline`; `.iterator()` yields dicts of numpy arrays of static shapes,
    [batch_size // shard_count, L] each (see lm.py, mlm.py, seq2seq.py for the keys).
  """
  _check(objective, split, batch_size, shard_index, shard_count)
  if source is None:
    records = sources.load_source(data_cfg, split)
    if cache_dir is None and tokenizer is None:
      cache_dir = sources.prepared_dir(data_cfg) / 'tokens'
  else:
    records = source(split)
  if len(records) == 0:
    raise DataError(f'data.dataset: the {split} split of {data_cfg.dataset!r} is empty; '
                    f'check data.files / data.validation_fraction')
  if tokenizer is None:
    tokenizer = dataset_tokenizer(data_cfg, source=source, cache_dir=cache_dir)
  fields = ('source', 'target') if 'source' in records[0] else ('text',)
  cache = Path(cache_dir) / tokenizer_key(tokenizer) / split if cache_dir is not None else None
  tokens, counts = tokenize_split(records, fields, tokenizer, cache=cache)
  if train and split == 'train' and data_cfg.subword_dropout:
    rows = sampled_rows(data_cfg, objective, records, fields, tokenizer=tokenizer, seed=seed,
                        cache=cache)
  else:
    rows = make_rows(data_cfg, objective, tokens, tokenizer=tokenizer, seed=seed, train=train)
  pipe = Pipeline(rows, tokenizer=tokenizer, objective=objective, split=split,
                  batch_size=batch_size // shard_count, seed=seed, shard_index=shard_index,
                  shard_count=shard_count, train=train, counts=counts,
                  num_workers=data_cfg.num_workers)
  log.info('data %s/%s: %s', objective, split, pipe.stats)
  return pipe
