"""Tokenizers for tx: byte, char and sentencepiece (bpe / unigram), fixed special ids;
and 'hf', a Hugging Face tokenizer.json with a converted checkpoint's own ids (hf.py).

    from tx.data.tokenizers import build_tokenizer, load_tokenizer, PAD_ID, EOS_ID
    tok = build_tokenizer('bpe', lambda: texts, cache_dir=cache, vocab_size=8000)
    ids = [BOS_ID] + tok.encode('A dog runs.') + [EOS_ID]
    tok.decode(ids)       # 'A dog runs.'
    tok.num_bytes(ids)    # 11, for bits per byte

Special ids (PAD 0, BOS 1, EOS 2, UNK 3, MASK 4) are the same for every kind tx trains;
see `specials`. 'hf' is loaded, never trained: `load_hf_tokenizer(path)`. Saved tokenizers
are JSON (+ a sentencepiece .model), never pickle.
"""

from tx.data.tokenizers.base import Tokenizer
from tx.data.tokenizers.build import build_tokenizer, cache_path, train_tokenizer
from tx.data.tokenizers.byte import ByteTokenizer
from tx.data.tokenizers.char import CharTokenizer
from tx.data.tokenizers.hf import HfTokenizer
from tx.data.tokenizers.loading import KINDS, load_hf_tokenizer, load_tokenizer
from tx.data.tokenizers.specials import (BOS_ID, EOS_ID, MASK_ID, NUM_SPECIALS, PAD_ID,
                                         SPECIAL_PIECES, UNK_ID)
from tx.data.tokenizers.subword import SentencePieceTokenizer

__all__ = [
    'BOS_ID', 'EOS_ID', 'MASK_ID', 'NUM_SPECIALS', 'PAD_ID', 'SPECIAL_PIECES', 'UNK_ID',
    'KINDS', 'ByteTokenizer', 'CharTokenizer', 'HfTokenizer', 'SentencePieceTokenizer',
    'Tokenizer', 'build_tokenizer', 'cache_path', 'load_hf_tokenizer', 'load_tokenizer',
    'train_tokenizer',
]
