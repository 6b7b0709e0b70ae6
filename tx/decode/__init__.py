"""tx.decode: cached generation shared by decoder-only and encoder-decoder models.

generate.py (greedy / sampling), beam.py (beam search), steps.py (prefill + cached
steps), segments.py (growing the cache in segments, for both), reference.py (the same decoding without a cache, for tests and benchmarks),
texts.py (text <-> static-shape batches), evaluation.py (BLEU/chrF, extrapolation),
cli.py (`tx generate`, `tx eval`).
"""

from tx.decode.beam import beam_search_lm, beam_search_seq2seq, beam_search_texts
from tx.decode.generate import generate_lm, generate_seq2seq, left_pad
from tx.decode.texts import generate_texts
