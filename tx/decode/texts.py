"""Text in, text out: prompts and sources as static-shape batches, generated ids as text.

Every batch has the same shape ([batch_size, P] prompts or [batch_size, S] sources;
the last batch is filled with dummy rows), so a whole file or split compiles the
decoder once per strategy.
"""

from __future__ import annotations

import jax
import numpy as np

from tx.config.base import ConfigError
from tx.data.tokenizers.specials import BOS_ID, EOS_ID, PAD_ID
from tx.decode.beam import beam_search_lm, beam_search_seq2seq
from tx.decode.generate import generate_lm, generate_seq2seq, left_pad


def source_rows(tokenizer, texts: list[str], src_len: int):
  """int32 [N, src_len]: each text's ids cut to src_len - 1, + EOS, right-padded with PAD."""
  out = np.zeros((len(texts), src_len), np.int32)
  for i, text in enumerate(texts):
    ids = tokenizer.encode(text)[:src_len - 1] + [EOS_ID]
    out[i, :len(ids)] = ids
  return out


def prompt_rows(tokenizer, texts: list[str], *, start_id: int = EOS_ID, max_len: int | None = None):
  """int32 [N, P] left-padded prompts (an empty prompt becomes [start_id]); P = the longest,
  or max_len keeping each prompt's end."""
  return np.asarray(left_pad([tokenizer.encode(t) or [start_id] for t in texts], max_len))


def output_ids(row) -> list[int]:
  """The generated ids of one row up to (not including) EOS, without PAD."""
  out = []
  for i in np.asarray(row).tolist():
    if i == EOS_ID:
      break
    if i != PAD_ID:
      out.append(i)
  return out


def static_batches(rows: np.ndarray, batch_size: int, filler: np.ndarray):
  """Yields (batch [batch_size, ...], number of real rows): the last one filled with `filler`."""
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    n = len(chunk)
    if n < batch_size:
      chunk = np.concatenate([chunk, np.repeat(filler[None], batch_size - n, axis=0)])
    yield chunk, n


def generate_batch(cfg, params, batch, decode_cfg, rng):
  """ids int32 [B, decode.max_len] for prompts / sources [B, P] with `decode_cfg`'s strategy."""
  family, model_cfg = cfg.model.family, cfg.model
  if decode_cfg.strategy == 'beam':
    search = beam_search_lm if family == 'decoder' else beam_search_seq2seq
    out, _ = search(model_cfg, params, batch, beams=decode_cfg.beam_size,
                    max_len=decode_cfg.max_len, alpha=decode_cfg.length_penalty)
    return out
  generate = generate_lm if family == 'decoder' else generate_seq2seq
  return generate(model_cfg, params, batch, rng, max_new=decode_cfg.max_len,
                  strategy=decode_cfg.strategy, temperature=decode_cfg.temperature,
                  top_k=decode_cfg.top_k, top_p=decode_cfg.top_p)


def generate_texts(cfg, params, tokenizer, texts: list[str], decode_cfg, *,
                   batch_size: int | None = None) -> list[str]:
  """Continuations (decoder-only) or translations (encoder-decoder) of `texts`.

  Sources are cut to data.seq_len tokens (EOS included); prompts are left-padded to
  the longest. `batch_size` rows per call (default: all at once).
  """
  if cfg.model.family == 'encoder':
    raise ConfigError('model.family=encoder does not generate; use tx eval for masked LMs')
  if not texts:
    return []
  if cfg.model.family == 'decoder':
    start = BOS_ID if cfg.data.lm_sampling == 'packed' else EOS_ID
    rows = prompt_rows(tokenizer, texts, start_id=start)
    filler = np.full(rows.shape[1:], start, np.int32)
  else:
    rows = source_rows(tokenizer, texts, cfg.data.seq_len)
    filler = np.zeros(rows.shape[1:], np.int32)
    filler[0] = EOS_ID
  rng = jax.random.key(decode_cfg.seed)
  outputs = []
  for i, (batch, n) in enumerate(static_batches(rows, batch_size or len(rows), filler)):
    ids = generate_batch(cfg, params, batch, decode_cfg, jax.random.fold_in(rng, i))
    outputs += [tokenizer.decode(output_ids(r)) for r in np.asarray(ids)[:n]]
  return outputs
