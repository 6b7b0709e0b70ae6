"""Text in, text out: prompts and sources as static-shape batches, generated ids as text.

Every batch has the same shape ([batch_size, P] prompts or [batch_size, S] sources;
the last batch is filled with dummy rows), so a whole file or split compiles the
decoder once per strategy.

Special ids come from the tokenizer (`tx.data.tokenizers.base.Tokenizer`): tx's kinds
have the fixed ones of `specials`; a Hugging Face tokenizer (data.tokenizer=hf) has the
checkpoint's: its EOS ends generation, its post-processor's leading specials start every
prompt (LLaMA's <s>), seq2seq sources end with its trailing ones (T5's </s>), decoding
starts from its decoder start id (T5: 0), and where its id 0 is a real token (GPT-2's
"!") prompts carry explicit validity and id 0 may be generated.
"""

from __future__ import annotations

import jax
import numpy as np

from tx.config.base import ConfigError
from tx.data.tokenizers.base import special
from tx.data.tokenizers.specials import EOS_ID, PAD_ID
from tx.decode.beam import beam_search_lm, beam_search_seq2seq
from tx.decode.generate import generate_lm, generate_seq2seq, left_pad


def source_rows(tokenizer, texts: list[str], src_len: int):
  """int32 [N, src_len]: each text's ids cut to fit, between the tokenizer's prefix and suffix
  (tx: ids + EOS), right-padded with PAD."""
  prefix, suffix = list(special(tokenizer, 'prefix_ids')), list(special(tokenizer, 'suffix_ids'))
  room = max(0, src_len - len(prefix) - len(suffix))
  out = np.zeros((len(texts), src_len), np.int32)
  for i, text in enumerate(texts):
    ids = (prefix + tokenizer.encode(text)[:room] + suffix)[:src_len]
    out[i, :len(ids)] = ids
  return out


def prompt_ids(tokenizer, text: str, start_id: int = EOS_ID) -> list[int]:
  """The tokenizer's prefix (LLaMA: BOS; tx: none) + the ids of `text`; [start_id] if empty."""
  ids = list(special(tokenizer, 'prefix_ids')) + tokenizer.encode(text)
  if not ids and start_id < 0:
    raise ConfigError('--prompt: an empty prompt needs a start token, and this tokenizer has '
                      'no BOS or EOS; give a non-empty prompt')
  return ids or [start_id]


def prompt_rows(tokenizer, texts: list[str], *, start_id: int = EOS_ID, max_len: int | None = None):
  """int32 [N, P] left-padded prompts (an empty prompt becomes [start_id]); P = the longest,
  or max_len keeping each prompt's end."""
  return np.asarray(left_pad([prompt_ids(tokenizer, t, start_id) for t in texts], max_len))


def output_ids(row, eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> list[int]:
  """The generated ids of one row up to (not including) EOS, without PAD (-1: keep every id)."""
  out = []
  for i in np.asarray(row).tolist():
    if i == eos_id:
      break
    if i != pad_id:
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


def generate_batch(cfg, params, batch, decode_cfg, rng, tokenizer=None, valid=None):
  """ids int32 [B, decode.max_len] for prompts / sources [B, P] with `decode_cfg`'s strategy.

  tokenizer: where the special ids come from (default tx's); valid: bool [B, P] real prompt
  tokens, given where the tokenizer's id 0 is a real token (then id 0 may be generated).
  """
  family, model_cfg = cfg.model.family, cfg.model
  eos_id = special(tokenizer, 'eos_id')
  lm_kw = {} if valid is None else {'prompt_valid': valid, 'pad_id': -1}
  s2s_kw = {} if tokenizer is None else {'bos_id': special(tokenizer, 'decoder_start_id')}
  if decode_cfg.strategy == 'beam':
    if family == 'decoder':
      out, _ = beam_search_lm(model_cfg, params, batch, beams=decode_cfg.beam_size,
                              max_len=decode_cfg.max_len, alpha=decode_cfg.length_penalty,
                              eos_id=eos_id, **lm_kw)
    else:
      out, _ = beam_search_seq2seq(model_cfg, params, batch, beams=decode_cfg.beam_size,
                                   max_len=decode_cfg.max_len, alpha=decode_cfg.length_penalty,
                                   eos_id=eos_id, **s2s_kw)
    return out
  common = dict(max_new=decode_cfg.max_len, strategy=decode_cfg.strategy,
                temperature=decode_cfg.temperature, top_k=decode_cfg.top_k,
                top_p=decode_cfg.top_p, eos_id=eos_id)
  if family == 'decoder':
    return generate_lm(model_cfg, params, batch, rng, **common, **lm_kw)
  return generate_seq2seq(model_cfg, params, batch, rng, **common, **s2s_kw)


def generate_texts(cfg, params, tokenizer, texts: list[str], decode_cfg, *,
                   batch_size: int | None = None) -> list[str]:
  """Continuations (decoder-only) or translations (encoder-decoder) of `texts`.

  Sources are cut to data.seq_len tokens (EOS included); prompts are left-padded to
  the longest. `batch_size` rows per call (default: all at once). A continuation is
  decoded in the context of its prompt (`Tokenizer.decode_continuation`).
  """
  if cfg.model.family == 'encoder':
    raise ConfigError('model.family=encoder does not generate; use tx eval for masked LMs')
  if not texts:
    return []
  eos_id, zero_is_token = special(tokenizer, 'eos_id'), special(tokenizer, 'zero_is_token')
  pad_id = -1 if zero_is_token else PAD_ID
  prompts = None
  if cfg.model.family == 'decoder':
    bos_id = special(tokenizer, 'bos_id')
    packed = cfg.data.lm_sampling == 'packed'
    start = bos_id if (packed or eos_id < 0) and bos_id >= 0 else eos_id
    prompts = [prompt_ids(tokenizer, t, start) for t in texts]
    rows = np.asarray(left_pad(prompts))
    lengths = np.array([len(p) for p in prompts])
  else:
    rows = source_rows(tokenizer, texts, cfg.data.seq_len)
    lengths = np.full(len(rows), rows.shape[1])
  decode_rest = getattr(tokenizer, 'decode_continuation', None)
  rng = jax.random.key(decode_cfg.seed)
  outputs = []
  size = batch_size or len(rows)
  # the last batch is filled with copies of the first row (their outputs are dropped)
  batches = zip(static_batches(rows, size, rows[0]), static_batches(lengths, size, lengths[0]))
  for i, ((batch, n), (batch_lengths, _)) in enumerate(batches):
    valid = None
    if zero_is_token and prompts is not None:  # left-padded: the last `length` slots are real
      valid = np.arange(rows.shape[1])[None, :] >= (rows.shape[1] - batch_lengths)[:, None]
    ids = generate_batch(cfg, params, batch, decode_cfg, jax.random.fold_in(rng, i),
                         tokenizer=tokenizer, valid=valid)
    for j, row in enumerate(np.asarray(ids)[:n]):
      new = output_ids(row, eos_id, pad_id)
      if prompts is not None and decode_rest is not None:
        outputs.append(decode_rest(prompts[i * size + j], new))
      else:
        outputs.append(tokenizer.decode(new))
  return outputs


def beam_search_texts(cfg, params, tokenizer, texts: list[str], decode_cfg) -> list[str]:
  """Beam-search continuations / translations of `texts` (the `tx generate` path)."""
  return generate_texts(cfg, params, tokenizer, texts, decode_cfg.replace(strategy='beam'))
