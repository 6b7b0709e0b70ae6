"""`tx eval` and `tx generate`, and the sample printed after `tx train` for LMs."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from tx.config.base import ConfigError, override, parse_overrides
from tx.data.tokenizers.specials import EOS_ID, PAD_ID
from tx.decode.generate import generate_lm, generate_seq2seq, left_pad

DEFAULT_PROMPT = {'stdlib': 'def ', 'tinyshakespeare': 'ROMEO:'}


def _decode_settings(cfg, pairs: list[str]):
  """The run's DecodeConfig with `decode.*` overrides from the command line."""
  overrides = parse_overrides(pairs)
  for key in overrides:
    if not key.startswith('decode.'):
      raise ConfigError(f'{key}: tx generate only takes decode.* overrides')
  return override(cfg, overrides).decode if overrides else cfg.decode


def _strip(ids) -> list[int]:
  out = []
  for i in np.asarray(ids).tolist():
    if i in (EOS_ID,):
      break
    if i != PAD_ID:
      out.append(i)
  return out


def generate_texts(cfg, params, tokenizer, texts: list[str], decode_cfg) -> list[str]:
  """Continuations (decoder-only) or translations (encoder-decoder) of `texts`."""
  if cfg.model.family == 'encoder':
    raise ConfigError('model.family=encoder does not generate; use tx eval for masked LMs')
  if decode_cfg.strategy == 'beam':
    from tx.decode.beam import beam_search_texts  # pylint: disable=g-import-not-at-top
    return beam_search_texts(cfg, params, tokenizer, texts, decode_cfg)
  rng = jax.random.key(decode_cfg.seed)
  kw = dict(max_new=decode_cfg.max_len, strategy=decode_cfg.strategy,
            temperature=decode_cfg.temperature, top_k=decode_cfg.top_k, top_p=decode_cfg.top_p)
  if cfg.model.family == 'decoder':
    prompts = [tokenizer.encode(t) for t in texts]
    out = generate_lm(cfg.model, params, left_pad(prompts), rng, **kw)
  else:
    src = [tokenizer.encode(t)[:cfg.data.seq_len - 1] + [EOS_ID] for t in texts]
    width = max(len(s) for s in src)
    src = np.asarray([s + [PAD_ID] * (width - len(s)) for s in src], np.int32)
    out = generate_seq2seq(cfg.model, params, src, rng, **kw)
  return [tokenizer.decode(_strip(row)) for row in np.asarray(out)]


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
  from tx.train.restore import load_run, run_tokenizer  # pylint: disable=g-import-not-at-top
  if args.input:
    path = Path(args.input)
    if not path.exists():
      raise ConfigError(f'--input: {path} not found')
    texts = [line.rstrip('\n') for line in path.read_text().splitlines()]
  else:
    texts = [args.prompt]
  from tx.train.run_dir import load_run_config  # pylint: disable=g-import-not-at-top
  decode_cfg = _decode_settings(load_run_config(args.workdir), args.set)
  cfg, state, _, _ = load_run(args.workdir, step=args.step)
  outputs = generate_texts(cfg, state.params, run_tokenizer(cfg), texts, decode_cfg)
  for text, out in zip(texts, outputs):
    print(out if cfg.model.family == 'encoder_decoder' else text + out)
  if args.output:
    Path(args.output).write_text('\n'.join(outputs) + '\n')
  return 0


def run_eval(args) -> int:
  from tx.config.experiment import ExperimentConfig  # pylint: disable=g-import-not-at-top
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  from tx.models.build import build_model  # pylint: disable=g-import-not-at-top
  from tx.tasks import make_task  # pylint: disable=g-import-not-at-top
  from tx.train.evaluate import evaluate  # pylint: disable=g-import-not-at-top
  from tx.train.restore import load_run, run_tokenizer  # pylint: disable=g-import-not-at-top
  from tx.train.step import make_eval_step  # pylint: disable=g-import-not-at-top
  from tx.train import run_dir  # pylint: disable=g-import-not-at-top
  cfg, state, mesh, step = load_run(args.workdir, step=args.step)
  assert isinstance(cfg, ExperimentConfig)
  task = make_task(cfg)
  pipe = make_pipeline(cfg.data, task.name, args.split, batch_size=cfg.train.batch_size,
                       seed=cfg.train.seed, train=False, tokenizer=run_tokenizer(cfg),
                       shard_index=jax.process_index(), shard_count=jax.process_count())
  eval_step = jax.jit(make_eval_step(build_model(cfg.model), task))
  metrics = evaluate(eval_step, state.params, pipe, mesh, max_batches=args.batches)
  result = {'step': step, 'split': args.split, **metrics}
  print(json.dumps(result, indent=2, sort_keys=True))
  if jax.process_index() == 0:
    run_dir.write_json(Path(args.workdir) / f'eval_{args.split}_{step}.json', result)
  return 0
