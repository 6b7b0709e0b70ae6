"""Evaluation beyond the loss: BLEU / chrF of decoded translations, LM perplexity at
longer contexts (length extrapolation), masked-token accuracy.

    scores = translation_scores(cfg, params, 'test')   # bleu/chrf (beam), bleu_greedy, ...
    table = extrapolation(cfg, params, 'validation', mesh)['extrapolation']
    # {64: 5.1, 128: 4.9, 256: 5.3}: perplexity at 1x, 2x, 4x data.seq_len

BLEU is sacreBLEU's corpus BLEU on detokenized text (the tokenizer's `decode`) against
the raw reference sentences, with its default 13a tokenization (cased); `bleu_lc` is the
same on lower-cased text (13a-tokenized, lower-cased BLEU); chrF is sacreBLEU's chrF2. Both
come with their signatures, which belong next to the number.

Loss-based metrics come from `tx.train.evaluate`; decoding from `tx.decode`.
"""

from __future__ import annotations

import jax

from tx.data import make_pipeline
from tx.data import sources as data_sources
from tx.data.pipeline import dataset_tokenizer
from tx.decode.texts import generate_texts
from tx.models.build import build_model
from tx.tasks import make_task
from tx.train.evaluate import evaluate
from tx.train.step import make_eval_step

DEFAULT_FACTORS = (1, 2, 4)


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
  """{'bleu', 'bleu_lc', 'chrf' and their '*_signature's} of detokenized sentences (one
  reference each): sacreBLEU corpus BLEU (13a tokenization, cased), the same on lower-cased
  text ('bleu_lc': 13a-tokenized, lower-cased BLEU, what papers reporting tokenized
  lower-cased BLEU on Multi30k compare with) and chrF."""
  # heavy: kept off start-up
  from sacrebleu.metrics import BLEU, CHRF  # pylint: disable=g-import-not-at-top
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses but {len(references)} references')
  bleu, bleu_lc, chrf = BLEU(tokenize='13a'), BLEU(tokenize='13a', lowercase=True), CHRF()
  refs = [list(references)]
  return {'bleu': bleu.corpus_score(hypotheses, refs).score,
          'bleu_lc': bleu_lc.corpus_score(hypotheses, refs).score,
          'chrf': chrf.corpus_score(hypotheses, refs).score,
          'bleu_signature': str(bleu.get_signature()),
          'bleu_lc_signature': str(bleu_lc.get_signature()),
          'chrf_signature': str(chrf.get_signature())}


def translation_scores(cfg, params, split: str, *, strategies=('greedy', 'beam'),
                       decode_cfg=None, batch_size: int | None = None,
                       max_sentences: int | None = None, source=None, tokenizer=None) -> dict:
  """BLEU and chrF of the run's model on `split`, per decoding strategy.

  Args:
    cfg: the run's ExperimentConfig (seq2seq); decode_cfg: default cfg.decode (beam_size,
      length_penalty, max_len are used; strategy is set per entry of `strategies`).
    batch_size: sentences per decoding call (default train.batch_size).
    max_sentences: score only the first N pairs of the split (default: all).
    source, tokenizer: replace tx.data.sources / the dataset tokenizer (tests).
  Returns:
    {'bleu', 'bleu_lc', 'chrf'} of the LAST strategy (beam by default), 'bleu_<s>',
    'bleu_lc_<s>' and 'chrf_<s>' for every strategy, the sacreBLEU signatures, 'sentences'
    and, per strategy, 'examples_<s>' (the first 3 hypotheses with their sources and references).
  """
  decode_cfg = decode_cfg or cfg.decode
  records = source(split) if source is not None else data_sources.load_source(cfg.data, split)
  n = len(records) if max_sentences is None else min(max_sentences, len(records))
  srcs = [records[i]['source'] for i in range(n)]
  refs = [records[i]['target'] for i in range(n)]
  if tokenizer is None:
    tokenizer = dataset_tokenizer(cfg.data, source=source)
  out: dict = {'sentences': n}
  for strategy in strategies:
    hyps = generate_texts(cfg, params, tokenizer, srcs, decode_cfg.replace(strategy=strategy),
                          batch_size=batch_size or cfg.train.batch_size)
    scores = corpus_scores(hyps, refs)
    out.update({f'bleu_{strategy}': scores['bleu'], f'chrf_{strategy}': scores['chrf'],
                f'bleu_lc_{strategy}': scores['bleu_lc'], 'bleu_lc': scores['bleu_lc'],
                'bleu': scores['bleu'], 'chrf': scores['chrf'],
                'bleu_signature': scores['bleu_signature'],
                'bleu_lc_signature': scores['bleu_lc_signature'],
                'chrf_signature': scores['chrf_signature'],
                f'examples_{strategy}': [{'source': s, 'reference': r, 'output': h}
                                         for s, r, h in zip(srcs[:3], refs[:3], hyps[:3])]})
  return out


def clipping_note(cfg, lengths) -> str | None:
  """The caveat for learned positions evaluated beyond model.max_len, else None."""
  if cfg.model.position != 'learned' or max(lengths) <= cfg.model.max_len:
    return None
  return (f'model.position=learned: positions >= model.max_len={cfg.model.max_len} reuse the '
          'last learned position embedding (tx clips them)')


def extrapolation(cfg, params, split: str, mesh, *, factors=DEFAULT_FACTORS,
                  max_batches: int | None = None, source=None, tokenizer=None) -> dict:
  """Causal-LM perplexity at k x the training context (data.seq_len), for k in `factors`.

  Each length gets its own eval pipeline with data.seq_len = k * L, so positions run
  up to k * L - 1: beyond anything seen in training for k > 1. Batches hold
  train.batch_size // k rows (rounded to the data-parallel size), so every length
  scores the same number of tokens per batch; with `max_batches` every length sees the
  same first tokens of the split. Learned positions beyond model.max_len are clipped
  to the last learned one (see `clipping_note`).

  Returns {'extrapolation': {length: perplexity}, 'extrapolation_bits_per_byte':
  {length: bpb} (where the tokenizer counts bytes), 'extrapolation_note': str | None}.
  """
  task = make_task(cfg)
  if task.name != 'causal_lm':
    raise ValueError(f'extrapolation: needs a causal LM, got task {task.name}')
  eval_step = jax.jit(make_eval_step(build_model(cfg.model), task))
  shards = mesh.shape['data'] * mesh.shape['fsdp']
  table, bpb = {}, {}
  for k in factors:
    length = int(k * cfg.data.seq_len)
    rows = max(shards, cfg.train.batch_size // max(1, int(k)) // shards * shards)
    pipe = make_pipeline(cfg.data.replace(seq_len=length), 'causal_lm', split, batch_size=rows,
                         seed=cfg.train.seed, train=False, tokenizer=tokenizer, source=source,
                         shard_index=jax.process_index(), shard_count=jax.process_count())
    metrics = evaluate(eval_step, params, pipe, mesh, max_batches=max_batches)
    table[length] = metrics['perplexity']
    if 'bits_per_byte' in metrics:
      bpb[length] = metrics['bits_per_byte']
  out = {'extrapolation': table, 'extrapolation_note': clipping_note(cfg, list(table))}
  if bpb:
    out['extrapolation_bits_per_byte'] = bpb
  return out


def masked_lm_scores(metrics: dict) -> dict:
  """MLM: tx.train.evaluate's accuracy / perplexity are over the masked positions only
  (their weights); returned under explicit names."""
  return {'masked_accuracy': metrics['accuracy'], 'masked_perplexity': metrics['perplexity']}

