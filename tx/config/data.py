"""`DataConfig`: the `data.*` keys (dataset, raw files, tokenizer, batching).

Owned by tx/data: sources read the dataset fields, the pipeline reads the rest.
"""

from __future__ import annotations

from tx.config.base import choice, config, fail


# tx's own datasets by the records they hold (tfds:NAME datasets are known only once resolved).
TEXT_DATASETS = ('stdlib', 'tinyshakespeare', 'text')
PARALLEL_DATASETS = ('multi30k', 'parallel')


@config
class DataConfig:
  """Where examples come from and how they become fixed-shape batches."""
  PREFIX = 'data.'

  # --- Sources (tx/data/sources, builders) -------------------------------------------
  # 'stdlib' (Python standard library sources; every machine has it), 'tinyshakespeare',
  # 'multi30k', 'text' (data.files), 'parallel' (data.source_files / data.target_files),
  # or 'tfds:NAME' for a TFDS catalog dataset (e.g. 'tfds:lm1b').
  dataset: str = 'stdlib'
  raw_dir: str | None = None  # where raw files live; None = $TX_RAW_DATA
  data_dir: str | None = None  # prepared-data cache; None = $TFDS_DATA_DIR or ~/tensorflow_datasets
  files: str | None = None  # 'text': a file, a folder or a glob
  validation_fraction: float = 0.1  # 'text'/'tinyshakespeare': last fraction (by position) held out
  # 'parallel': line-aligned files, one per split in the order (train, validation, test);
  # 1-3 entries, the same number in both, e.g. ('train.de', 'val.de'); '.gz' allowed.
  source_files: tuple[str, ...] | None = None
  target_files: tuple[str, ...] | None = None
  source_lang: str = 'en'
  target_lang: str = 'de'
  utf8_errors: str = choice('error', 'replace')

  # --- Tokenizer (tx/data/tokenizers) --------------------------------------------------
  # 'hf': a Hugging Face tokenizer.json read from data.tokenizer_path, never trained (the
  # tokenizer of a checkpoint imported by `tx convert`, with its own special ids; see
  # tx/data/tokenizers/hf.py). Needs the interop extra.
  tokenizer: str = choice('byte', 'char', 'bpe', 'unigram', 'hf')
  vocab_size: int = 8000  # sentencepiece vocabulary size (byte/char: fixed by the data)
  # data.tokenizer=hf only: a tokenizer.json (its tokenizer_config.json /
  # special_tokens_map.json / config.json beside it name the specials), the tx header that
  # `tx convert` writes next to one (RUN/tokenizer/tx_tokenizer.json), or a folder holding
  # either; relative paths are relative to the working directory.
  tokenizer_path: str | None = None
  # Subword regularisation of the training split ('bpe' / 'unigram'): BPE-dropout
  # (Provilkov et al. 2020) with this merge-dropout probability, or unigram sampling with this
  # smoothing (Kudo 2018); 0 = the one deterministic segmentation. `subword_samples`
  # segmentations of the split are drawn once (cached; the same for every run seed) and their
  # rows form one shuffled pass; evaluation and decoding always use the deterministic one.
  subword_dropout: float = 0.0
  subword_samples: int = 16

  # --- Batches (tx/data/pipeline, batching) -------------------------------------------
  seq_len: int = 128  # LM window / MLM row / seq2seq source length
  target_len: int = 128  # seq2seq target length
  # causal_lm / mlm rows: contiguous windows of the joined token stream (nanoGPT), or
  # documents (BOS + tokens + EOS) packed with segment ids; see tx/data/lm.py
  lm_sampling: str = choice('windows', 'packed')
  packing: bool = False  # seq2seq: several pairs per row with segment ids (causal_lm/mlm: = packed)
  length_policy: str = choice('truncate', 'drop')
  mlm_probability: float = 0.15
  mlm_mask_fraction: float = 0.8  # of the selected: -> MASK
  mlm_random_fraction: float = 0.1  # of the selected: -> random token (rest unchanged)
  # > 0: at most this many selected positions per row (BERT's max_predictions_per_seq; the
  # rest of a row's draws stay unselected), and the MLM head runs only at those positions
  # (the same loss, without the logits of the others). 0: no cap, the head at every position.
  mlm_max_predictions: int = 0
  num_workers: int = 0  # Grain worker processes (0 = in-process)

  def validate(self):
    if not 0 < self.validation_fraction < 1:
      fail('data.validation_fraction', f'must be in (0, 1), got {self.validation_fraction}')
    for name in ('seq_len', 'target_len', 'vocab_size'):
      if getattr(self, name) <= 0:
        fail(f'data.{name}', f'must be > 0, got {getattr(self, name)}')
    if not 0 < self.mlm_probability < 1:
      fail('data.mlm_probability', f'must be in (0, 1), got {self.mlm_probability}')
    if not 0 <= self.mlm_max_predictions <= self.seq_len:
      fail('data.mlm_max_predictions', f'must be in [0, data.seq_len={self.seq_len}] (0 = no cap), '
           f'got {self.mlm_max_predictions}')
    if self.mlm_mask_fraction + self.mlm_random_fraction > 1:
      fail('data.mlm_mask_fraction', 'mlm_mask_fraction + mlm_random_fraction must be <= 1')
    if self.tokenizer == 'hf' and not self.tokenizer_path:
      fail('data.tokenizer_path', 'data.tokenizer=hf reads a Hugging Face tokenizer.json; set '
           'data.tokenizer_path=PATH (a tokenizer.json or the checkpoint folder holding it)')
    if self.tokenizer_path is not None and self.tokenizer != 'hf':
      fail('data.tokenizer_path', f'is read only by data.tokenizer=hf, but data.tokenizer='
           f'{self.tokenizer!r}; set data.tokenizer=hf or drop data.tokenizer_path')
    if not 0 <= self.subword_dropout < 1:
      fail('data.subword_dropout', f'must be in [0, 1), got {self.subword_dropout}')
    if self.subword_dropout and self.tokenizer not in ('bpe', 'unigram'):
      fail('data.subword_dropout', f'samples sentencepiece segmentations, but data.tokenizer='
           f'{self.tokenizer!r}; use data.tokenizer=bpe or unigram, or subword_dropout=0')
    if self.subword_samples < 1:
      fail('data.subword_samples', f'must be >= 1, got {self.subword_samples}')
    if self.num_workers < 0:
      fail('data.num_workers', f'must be >= 0, got {self.num_workers}')
