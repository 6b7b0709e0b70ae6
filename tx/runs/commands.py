"""`tx eval` and `tx generate`, and the sample printed after `tx train` for LMs."""

from __future__ import annotations

import json
from pathlib import Path

import jax

from tx.config.base import ConfigError, override, parse_overrides
from tx.config.experiment import ExperimentConfig
from tx.data import make_pipeline
from tx.decode.texts import generate_texts
from tx.models.build import build_model
from tx.runs import evaluation
from tx.runs.restore import load_run, run_tokenizer
from tx.tasks import make_task
from tx.train import run_dir
from tx.train.evaluate import evaluate
from tx.train.step import make_eval_step

DEFAULT_PROMPT = {'stdlib': 'def ', 'tinyshakespeare': 'ROMEO:'}
SUMMARY_FIX = ('restore it from a copy, or delete it (`tx train --workdir DIR` writes it again '
               'from the last checkpoint)')


def _decode_settings(cfg, pairs: list[str], command: str = 'generate'):
  """The run's DecodeConfig with `decode.*` overrides from the command line."""
  overrides = parse_overrides(pairs or [])
  for key in overrides:
    if not key.startswith('decode.'):
      raise ConfigError(f'{key}: tx {command} only takes decode.* overrides')
  return override(cfg, overrides).decode if overrides else cfg.decode


def sample_after_training(result) -> str:
  """A sample from the freshly trained LM (printed by `tx train` for causal LMs)."""
  cfg = result.config
  prompt = DEFAULT_PROMPT.get(cfg.data.dataset, '\n')
  decode_cfg = cfg.decode.replace(max_len=cfg.train.sample_tokens)
  if decode_cfg.strategy == 'beam':
    decode_cfg = decode_cfg.replace(strategy='sample')
  text = generate_texts(cfg, result.state.params, result.tokenizer, [prompt], decode_cfg)[0]
  return prompt + text


def run_generate(args) -> int:
  """`tx generate`: prints (and with --output writes, one line each) the outputs of a run."""
  if args.input:
    path = Path(args.input)
    if not path.exists():
      raise ConfigError(f'--input: {path} not found; pass an existing file, one text per line')
    texts = path.read_text().splitlines()
  else:
    texts = [args.prompt]
  decode_cfg = _decode_settings(run_dir.load_run_config(args.workdir), args.set)
  cfg, state, _, _ = load_run(args.workdir, step=args.step)
  outputs = generate_texts(cfg, state.params, run_tokenizer(cfg), texts, decode_cfg,
                           batch_size=getattr(args, 'batch_size', None) or 32)
  for text, out in zip(texts, outputs):
    print(out if cfg.model.family == 'encoder_decoder' else text + out)
  if args.output:
    Path(args.output).write_text(''.join(o.replace('\n', ' ') + '\n' for o in outputs))
  return 0


def parse_factors(text: str | None) -> tuple[int, ...]:
  """'1,2,4' -> (1, 2, 4); '' / 'none' / '0' -> () (no extrapolation table)."""
  if text is None or text.strip().lower() in ('', 'none', '0'):
    return ()
  try:
    factors = tuple(int(x) for x in text.split(','))
  except ValueError:
    raise ConfigError(f'--extrapolation: {text!r} is not a comma-separated list of integers; '
                      'use e.g. --extrapolation 1,2,4') from None
  if any(k < 1 for k in factors):
    raise ConfigError(f'--extrapolation: factors must be >= 1, got {text!r}')
  return factors


def _generation_metrics(cfg, params, mesh, split: str, args, loss_metrics: dict) -> dict:
  """The family's extra metrics: BLEU/chrF, the extrapolation table, masked-token scores."""
  task = cfg.task_name
  if task == 'seq2seq':
    batches = getattr(args, 'bleu_batches', None)
    if batches == 0:
      return {}
    batch_size = getattr(args, 'decode_batch', None) or cfg.train.batch_size
    decode_cfg = _decode_settings(cfg, getattr(args, 'set', None), 'eval')
    return evaluation.translation_scores(
        cfg, params, split, decode_cfg=decode_cfg, batch_size=batch_size,
        max_sentences=None if batches is None else batches * batch_size,
        tokenizer=run_tokenizer(cfg))
  if task == 'causal_lm':
    factors = parse_factors(getattr(args, 'extrapolation', '1,2,4'))
    if not factors:
      return {}
    return evaluation.extrapolation(cfg, params, split, mesh, factors=factors,
                                    max_batches=args.batches, tokenizer=run_tokenizer(cfg))
  return evaluation.masked_lm_scores(loss_metrics) if loss_metrics else {}


def _report(result: dict) -> None:
  if 'bleu' in result:
    for s in sorted(k[len('chrf_'):] for k in result
                    if k.startswith('chrf_') and k != 'chrf_signature'):
      print(f'{s:>8}: BLEU {result[f"bleu_{s}"]:6.2f}  lower-cased BLEU '
            f'{result[f"bleu_lc_{s}"]:6.2f}  chrF {result[f"chrf_{s}"]:6.2f}')
    print(f'sacreBLEU {result["bleu_signature"]}\nlower-cased {result["bleu_lc_signature"]}\n'
          f'chrF {result["chrf_signature"]}')
  if 'extrapolation' in result:
    print('context  perplexity')
    for length, ppl in result['extrapolation'].items():
      print(f'{length:>7}  {ppl:10.3f}')
    if result.get('extrapolation_note'):
      print('note:', result['extrapolation_note'])


def merge_into_summary(workdir: Path, extra: dict, *, split: str, step: int) -> None:
  """Adds `extra` under summary.json's 'eval' (with where it came from: 'tx_eval')."""
  path = Path(workdir) / run_dir.SUMMARY
  summary = run_dir.read_json(path, fix=SUMMARY_FIX) if path.exists() else {}
  section = dict(summary.get('eval') or {})
  section.update({k: v for k, v in extra.items() if not k.startswith('examples_')})
  section['tx_eval'] = {'split': split, 'step': step}
  summary['eval'] = section
  run_dir.write_json(path, summary)


def run_eval(args) -> int:
  """`tx eval`: loss metrics on --split plus the family's extras (BLEU/chrF greedy and beam,
  the extrapolation table, masked-token scores); writes eval_<split>_<step>.json and
  merges the extras into summary.json's 'eval'."""
  parse_factors(getattr(args, 'extrapolation', None))  # a bad flag fails before any work
  summary = Path(args.workdir) / run_dir.SUMMARY
  if summary.exists():  # a damaged summary.json fails before the evaluation, not after it
    run_dir.read_json(summary, fix=SUMMARY_FIX)
  cfg, state, mesh, step = load_run(args.workdir, step=args.step)
  assert isinstance(cfg, ExperimentConfig)
  task = make_task(cfg)
  pipe = make_pipeline(cfg.data, task.name, args.split, batch_size=cfg.train.batch_size,
                       seed=cfg.train.seed, train=False, tokenizer=run_tokenizer(cfg),
                       shard_index=jax.process_index(), shard_count=jax.process_count())
  eval_step = jax.jit(make_eval_step(build_model(cfg.model), task))
  metrics = evaluate(eval_step, state.params, pipe, mesh, max_batches=args.batches)
  extra = _generation_metrics(cfg, state.params, mesh, args.split, args, metrics)
  result = {'step': step, 'split': args.split, **metrics, **extra}
  print(json.dumps(result, indent=2, sort_keys=True))
  _report(result)
  if jax.process_index() == 0:
    run_dir.write_json(Path(args.workdir) / f'eval_{args.split}_{step}.json', result)
    if extra:
      merge_into_summary(args.workdir, extra, split=args.split, step=step)
  return 0
