"""tx.decode: the generation library, cached decoding for decoder-only and encoder-decoder models.

It depends on tx.models, tx.ops, tx.config and tx's special token ids only; the commands
that decode over a run directory (`tx eval`, `tx generate`, BLEU) live in tx.runs.

generate.py (greedy / sampling), beam.py (beam search), steps.py (prefill + cached
steps), segments.py (growing the cache in segments, for both), learned_positions.py
(learned positions past model.max_len: crop and recompute), reference.py (the same
decoding without a cache, for tests and benchmarks), texts.py (text <-> static-shape
batches).
"""

from tx.decode.beam import beam_search_lm, beam_search_seq2seq
from tx.decode.generate import generate_lm, generate_seq2seq, left_pad
from tx.decode.texts import beam_search_texts, generate_texts
