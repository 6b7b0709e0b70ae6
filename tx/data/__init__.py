"""tx.data: sources, tokenizers and fixed-shape batches for the three objectives.

    from tx.data import make_pipeline
    pipe = make_pipeline(cfg.data, 'causal_lm', 'train', batch_size=12, seed=0)
    it = pipe.iterator()
    batch = next(it)          # numpy dict, static shapes; it.get_state() is JSON

Names load on first use, so `import tx.data` is cheap and a piece that fails to
import (TFDS missing, say) only breaks the names that need it.
"""

import importlib

_LAZY = {
    # batches and pipeline
    'make_pipeline': 'tx.data.pipeline', 'Pipeline': 'tx.data.pipeline',
    'BatchIterator': 'tx.data.pipeline', 'dataset_tokenizer': 'tx.data.pipeline',
    'row_index_dataset': 'tx.data.pipeline', 'tokenize_split': 'tx.data.pipeline',
    'OBJECTIVES': 'tx.data.pipeline',
    'CausalWindows': 'tx.data.lm', 'CausalPacked': 'tx.data.lm', 'Windows': 'tx.data.lm',
    'MLMWindows': 'tx.data.mlm', 'MLMPacked': 'tx.data.mlm', 'Masking': 'tx.data.mlm',
    'mask_tokens': 'tx.data.mlm',
    'Seq2SeqRows': 'tx.data.seq2seq',
    'Ragged': 'tx.data.packing', 'Feature': 'tx.data.packing', 'PackedRows': 'tx.data.packing',
    'first_fit': 'tx.data.packing', 'place': 'tx.data.packing',
    # sources
    'load_source': 'tx.data.sources', 'dataset_kind': 'tx.data.sources',
    'prepared_dir': 'tx.data.sources', 'Source': 'tx.data.sources',
    # tokenizers
    'Tokenizer': 'tx.data.tokenizers', 'build_tokenizer': 'tx.data.tokenizers',
    'load_tokenizer': 'tx.data.tokenizers', 'ByteTokenizer': 'tx.data.tokenizers',
    'CharTokenizer': 'tx.data.tokenizers', 'SentencePieceTokenizer': 'tx.data.tokenizers',
    'KINDS': 'tx.data.tokenizers',
    'PAD_ID': 'tx.data.tokenizers.specials', 'BOS_ID': 'tx.data.tokenizers.specials',
    'EOS_ID': 'tx.data.tokenizers.specials', 'UNK_ID': 'tx.data.tokenizers.specials',
    'MASK_ID': 'tx.data.tokenizers.specials', 'NUM_SPECIALS': 'tx.data.tokenizers.specials',
    # errors
    'DataError': 'tx.data.errors',
}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f'module tx.data has no attribute {name!r}')


def __dir__():
  return sorted(set(globals()) | set(_LAZY))
