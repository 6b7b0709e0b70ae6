"""tx.decode: cached generation shared by decoder-only and encoder-decoder models."""

from tx.decode.generate import generate_lm, generate_seq2seq, left_pad
