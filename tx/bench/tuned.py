"""`tx bench --tune`: each training case measured with `tx tune`'s choice for its own step on
this host (the XLA flags, torch's kernels, steps per call), so the report judges tx as a user
who ran `tx tune` gets it. The choice comes from the tune cache (measured first where nothing
is cached, as `tx train --tune` does); the peer's side is unchanged."""

from __future__ import annotations

from tx.bench import tx_side
from tx.runs import tune


def step_config(spec: dict):
  """A case's training step as `tx tune` times it: the case's global batch, and
  train.steps_per_call left to tune unless the case sets it."""
  cfg = tx_side.experiment(spec)
  return cfg.replace(train=cfg.train.replace(batch_size=spec['batch'],
                                              steps_per_call=spec.get('steps_per_call')))


def with_choice(spec: dict, entry: dict) -> dict:
  """`spec` with a tune entry's model and loop settings where the case leaves them to tx
  (attention_impl / matmul_impl absent or 'auto', steps_per_call absent)."""
  model = {k: v for k, v in (entry.get('model_overrides') or {}).items()
           if spec.get(k, 'auto') == 'auto'}
  train = {k: v for k, v in (entry.get('train_overrides') or {}).items() if k not in spec}
  return {**spec, **model, **train}


def choice(spec: dict, *, threads: int, say, **tune_args) -> tuple[dict, dict]:
  """(the spec tx's side trains with, {'choice', 'xla_flags', 'model_overrides',
  'train_overrides', 'timings'}) for a case's training `spec` on this host; `tune_args`
  (candidates, steps, warmup, rounds) go to `tune.tune` where nothing is cached."""
  entry = tune.tune(step_config(spec), threads=threads, say=say, **tune_args)
  summary = {k: entry.get(k) for k in ('choice', 'xla_flags', 'model_overrides',
                                       'train_overrides', 'timings')}
  return with_choice(spec, entry), summary
